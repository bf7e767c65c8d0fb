"""Planning: the live context a planner needs, the prompt built from it, and `plan --local`.

A planner (Claude Code, an IDE agent, or the served model itself) gets the prompt
``propose_acceleration_plan`` from the MCP server: instructions plus what this machine can run,
how fast the live service is, what past cycles found (failures included) and the policy's bounds.
It answers with one JSON plan; code then decides everything else.

``plan --local`` asks the served model (OpenAI-compatible chat API, temperature 0) with that
prompt, extracts the JSON plan from whatever the model wrote (thinking blocks, code fences, prose),
and submits it with a real MCP client call to ``propose_plan``. A reply without a usable plan
changes nothing: there is no fallback plan.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mcp_infra import __version__
from mcp_infra.contracts import BASELINE_ID, CandidateRun, CycleSummary, Outcome, Plan, Verdict
from mcp_infra.core.preflight import preflight
from mcp_infra.core.sanitize import PlanRefused, parse_plan
from mcp_infra.state import evidence as evidence_mod
from mcp_infra.state.catalog import load_policy, load_registry
from mcp_infra.state.context import active_recipe, load_config
from mcp_infra.state.hostfacts import host_facts
from mcp_infra.state.store import CorruptFile, Home, read_optional

PROMPT_NAME = "propose_acceleration_plan"
CLIENT_NAME = "mcp-infra-plan"
MAX_GOAL = 500
MAX_REPLY = 200_000
PAST_CYCLES = 8


class Brief(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CandidateBrief(Brief):
    id: str
    title: str
    candidate_class: str
    semantics: str
    knobs: dict[str, Any]
    auto_promote: bool
    history: list[str] = Field(default_factory=list)


class UnavailableBrief(Brief):
    id: str
    reasons: list[str]


class BaselineFigures(Brief):
    cycle_id: str
    recipe: str
    is_live_recipe: bool
    suite: str
    max_tokens: int
    decode_tps_median: float | None
    ttft_s_median: float | None
    per_prompt_decode_tps: dict[str, float]
    peak_memory_gb: float | None
    samples: int
    errors: int


class PastCycle(Brief):
    cycle_id: str
    outcome: str
    selected: str | None
    speedup_pct: float | None
    reason: str
    interrupted: bool
    candidates: list[str] = Field(default_factory=list)


class ThresholdBounds(Brief):
    default: float
    low: float
    high: float


class PolicyBounds(Brief):
    name: str
    min_speedup_pct: ThresholdBounds
    max_peak_memory_gb: ThresholdBounds
    worst_prompt_tolerance_pct: float
    auto_promote: dict[str, bool]
    window: str
    suite: str
    repeats: int
    max_tokens: int


class PlanningContext(Brief):
    live_recipe: str
    endpoint: str
    runnable: list[CandidateBrief]
    unavailable: list[UnavailableBrief]
    baseline: BaselineFigures | None
    past_cycles: list[PastCycle]
    policy: PolicyBounds
    plan_schema: dict[str, Any]


# ---------------------------------------------------------------------------------------------
# context
# ---------------------------------------------------------------------------------------------


def build_context(home: Home) -> PlanningContext:
    """Everything a planner should know, read from the home directory (no service is touched)."""
    config = load_config(home)
    policy = load_policy(config.policy, extra=home.user_policy)
    manifests = load_registry(extra=home.user_registry)
    facts = host_facts(home.root, home.models, home.hf_cache)
    live = active_recipe(home)
    summaries = evidence_mod.list_cycles(home)
    verdicts = {s.cycle_id: _verdict(home, s.cycle_id) for s in summaries[:50]}
    history: dict[str, list[str]] = {}
    for summary in reversed(summaries[:50]):
        verdict = verdicts.get(summary.cycle_id)
        for item in verdict.candidates if verdict else []:
            reason = item.reasons[0] if item.reasons else ""
            speed = (f" {(item.speedup_estimate - 1) * 100:+.1f}%"
                     if item.speedup_estimate is not None else "")
            history.setdefault(item.candidate, []).append(
                f"{summary.cycle_id}: {item.decision.value}{speed} — {reason}"[:300])
    runnable, unavailable = [], []
    for manifest in manifests.values():
        for variant in manifest.variants:
            cid = f"{manifest.id}:{variant.id}"
            check = preflight(manifest, variant, policy, facts)
            if not check.passed:
                unavailable.append(UnavailableBrief(id=cid, reasons=check.failures()[:3]))
                continue
            cls = manifest.class_of(variant)
            runnable.append(CandidateBrief(
                id=cid, title=variant.title or manifest.title, candidate_class=cls.value,
                semantics=manifest.semantics_of(variant).value,
                knobs=variant.knobs.model_dump(exclude_defaults=True),
                auto_promote=bool(policy.auto_promote.get(cls, False)),
                history=history.get(cid, [])[-4:]))
    past = []
    for summary in summaries[:PAST_CYCLES]:
        verdict = verdicts.get(summary.cycle_id)
        past.append(PastCycle(
            cycle_id=summary.cycle_id, outcome=summary.outcome.value, selected=summary.selected,
            speedup_pct=summary.speedup_pct, reason=summary.reason[:300],
            interrupted=summary.interrupted,
            candidates=[f"{c.candidate}: {c.decision.value}"
                        + (f" ({c.reasons[0]})"[:240] if c.reasons else "")
                        for c in (verdict.candidates if verdict else [])]))
    window = policy.window
    window_text = (f"{window.start}-{window.end} {window.timezone}" if window.mode == "window"
                   else window.mode)
    bounds = policy.thresholds
    return PlanningContext(
        live_recipe=live.candidate_id,
        endpoint=f"http://{config.host}:{config.port}/v1",
        runnable=runnable, unavailable=unavailable,
        baseline=_baseline_figures(home, summaries, live.candidate_id),
        past_cycles=past,
        policy=PolicyBounds(
            name=policy.name,
            min_speedup_pct=ThresholdBounds(**bounds.min_speedup_pct.model_dump()),
            max_peak_memory_gb=ThresholdBounds(**bounds.max_peak_memory_gb.model_dump()),
            worst_prompt_tolerance_pct=bounds.worst_prompt_tolerance_pct,
            auto_promote={k.value: v for k, v in policy.auto_promote.items()},
            window=window_text, suite=policy.protocol.suite, repeats=policy.protocol.repeats,
            max_tokens=policy.protocol.max_tokens),
        plan_schema=plan_schema())


def plan_schema() -> dict[str, Any]:
    """The JSON schema of a plan, with no $defs (easy to embed and to read)."""
    schema = Plan.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return resolve(defs[node["$ref"].split("/")[-1]])
            return {k: resolve(v) for k, v in node.items()}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    return resolve(schema)


def _verdict(home: Home, cycle_id: str) -> Verdict | None:
    try:
        return read_optional(home.bundle_files(cycle_id).verdict, Verdict)
    except CorruptFile:
        return None


def _baseline_figures(home: Home, summaries: list[CycleSummary],
                      live: str) -> BaselineFigures | None:
    """Figures of the recipe that serves now, from the newest cycle that measured one."""
    for summary in summaries:
        measured_as = (summary.selected if summary.outcome == Outcome.PROMOTED
                       and summary.selected else BASELINE_ID)
        try:
            run = read_optional(home.bundle_files(summary.cycle_id).run(measured_as),
                                CandidateRun)
        except CorruptFile:
            run = None
        if run is None or not run.samples:
            continue
        measured = [s for s in run.samples if s.phase == "measure"]
        good = [s for s in measured if not s.error and s.decode_tps]
        per_prompt: dict[str, list[float]] = {}
        for sample in good:
            per_prompt.setdefault(sample.prompt_id, []).append(sample.decode_tps or 0.0)
        ttfts = [s.ttft_s for s in good if s.ttft_s is not None]
        plan = _frozen_protocol(home, summary.cycle_id)
        return BaselineFigures(
            cycle_id=summary.cycle_id, recipe=summary.active_recipe,
            is_live_recipe=summary.active_recipe == live,
            suite=plan[0] if plan else "?", max_tokens=plan[1] if plan else 0,
            decode_tps_median=(round(statistics.median([s.decode_tps or 0.0 for s in good]), 2)
                               if good else None),
            ttft_s_median=round(statistics.median(ttfts), 3) if ttfts else None,
            per_prompt_decode_tps={k: round(statistics.median(v), 2)
                                   for k, v in sorted(per_prompt.items())},
            peak_memory_gb=round(run.peak_memory_gb, 3) if run.peak_memory_gb else None,
            samples=len(measured), errors=len(measured) - len(good))
    return None


def _frozen_protocol(home: Home, cycle_id: str) -> tuple[str, int] | None:
    from mcp_infra.contracts import FrozenPlan

    try:
        plan = read_optional(home.bundle_files(cycle_id).plan, FrozenPlan)
    except CorruptFile:
        return None
    return (plan.protocol.suite, plan.protocol.max_tokens) if plan else None


# ---------------------------------------------------------------------------------------------
# the prompt
# ---------------------------------------------------------------------------------------------


def render_prompt(context: PlanningContext, goal: str | None = None, *,
                  can_propose: bool = True) -> str:
    """The planner's instructions with the live context, as one user message (kept compact: a
    local model pays for every prompt token)."""
    p = context.policy
    out = [
        "You plan a speed experiment for a local LLM service managed by mcp-infra. You only "
        "propose: code measures each candidate you name against the live baseline on this "
        "machine, gates it (lossless: greedy output identical to the baseline's, token for "
        "token; lossy: a quality budget), selects by fixed thresholds, promotes only a "
        "qualified winner and rolls back on trouble. Keeping the baseline is a valid result.",
        "Goal: " + (goal.strip() if goal and goal.strip()
                    else "faster decoding without changing answers") + ".",
        f"Live recipe: {context.live_recipe} at {context.endpoint}.",
        "",
        "## Candidates you may propose (they pass preflight here)",
    ]
    if not context.runnable:
        out.append("None: no candidate can run on this machine.")
    for c in context.runnable:
        knobs = ", ".join(f"{k}={v}" for k, v in c.knobs.items()) or "defaults"
        auto = "auto-promote" if c.auto_promote else "NOT auto-promoted: a person decides"
        out.append(f"- {c.id}: {c.title} ({c.candidate_class}, {c.semantics}, {auto}; {knobs})")
        out += [f"  past {h[:200]}" for h in c.history]
    if context.unavailable:
        out += ["", "## Not runnable here (do not propose)"]
        groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for u in context.unavailable:
            manifest, _, variant = u.id.partition(":")
            groups.setdefault((manifest, tuple(u.reasons[:2])), []).append(variant)
        for (manifest, reasons), variants in groups.items():
            out.append(f"- {manifest}:{{{','.join(variants)}}}: {'; '.join(reasons)}")
    out += ["", "## Baseline"]
    b = context.baseline
    if b is None:
        out.append("Not measured yet (every cycle measures the live recipe first).")
    else:
        which = "live now" if b.is_live_recipe else "no longer live"
        out.append(f"Cycle {b.cycle_id} measured {b.recipe} ({which}; suite {b.suite}, "
                   f"{b.max_tokens} max tokens): median decode {b.decode_tps_median} tok/s, "
                   f"median TTFT {b.ttft_s_median} s, peak memory {b.peak_memory_gb} GB, "
                   f"{b.samples} requests, {b.errors} failed.")
        if b.per_prompt_decode_tps:
            out.append("Per prompt, decode tok/s: " + ", ".join(
                f"{k} {v}" for k, v in b.per_prompt_decode_tps.items()) + ".")
    out += ["", "## Past cycles (newest first, failures included)"]
    if not context.past_cycles:
        out.append("None yet.")
    for cyc in context.past_cycles:
        decided = ", ".join(line.split(" (", 1)[0] for line in cyc.candidates)
        out.append(f"- {cyc.cycle_id}: {cyc.outcome}"
                   + (f", selected {cyc.selected}" if cyc.selected else "")
                   + (f" ({cyc.speedup_pct:+.1f}%)" if cyc.speedup_pct is not None else "")
                   + (" [interrupted, recovered]" if cyc.interrupted else "")
                   + f" — {cyc.reason[:160]}" + (f" [{decided}]" if decided else ""))
    out += [
        "", f"## Policy {p.name}",
        f"- min_speedup_pct: default {p.min_speedup_pct.default}; a plan may only raise it, "
        f"within [{p.min_speedup_pct.low}, {p.min_speedup_pct.high}].",
        f"- max_peak_memory_gb: default {p.max_peak_memory_gb.default}; a plan may only lower "
        f"it, within [{p.max_peak_memory_gb.low}, {p.max_peak_memory_gb.high}], never below "
        "the baseline's measured peak.",
        f"- no prompt may slow down by more than {p.worst_prompt_tolerance_pct}%; "
        "auto-promotion: " + ", ".join(k for k, v in p.auto_promote.items() if v) + " only.",
        f"- cycles start: {p.window}; protocol: suite {p.suite}, {p.repeats} repeats, "
        f"{p.max_tokens} max tokens.",
        "",
        "## Your answer",
        "Exactly one JSON object, nothing after it:",
        '{"hypothesis": "<one line, at most 300 characters>", "candidates": ["<1 to 3 ids from '
        'the list you may propose>"], "acceptance": {"min_speedup_pct": <number>, '
        '"max_peak_memory_gb": <number>}, "notes": "<optional>"}',
        "Use only listed ids; never the baseline (always measured first); omit acceptance "
        "unless you want stricter thresholds; prefer untried or inconclusive candidates; do "
        "not repeat one a past cycle rejected on a gate unless something changed.",
        "The JSON goes to this MCP server's `propose_plan` tool (dry_run=true shows how it "
        "would be sanitized)." if can_propose else "This MCP server is read-only: give the JSON "
        "to a person, who can run `mcp-infra propose PLAN.json`.",
    ]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# extracting a plan from a model's reply
# ---------------------------------------------------------------------------------------------

_THINK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.IGNORECASE | re.DOTALL)
_OPEN_THINK = re.compile(r"<(think|thinking|reasoning)>", re.IGNORECASE)
_CLOSE_THINK = re.compile(r"</(think|thinking|reasoning)>", re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_-]*)[ \t]*\n(.*?)```", re.DOTALL)
_HARMONY_FINAL = "<|channel|>final<|message|>"
MAX_OBJECTS = 50


class Extraction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    plan: dict[str, Any] | None = None
    source: Literal["fenced", "inline", "none"] = "none"
    found_objects: int = 0
    problems: list[str] = Field(default_factory=list)


def strip_thinking(text: str) -> str:
    """The answer part of a reply: closed thinking blocks removed, text before a lone closing
    tag dropped (templates that open the block in the prompt), an unclosed block dropped."""
    if _HARMONY_FINAL in text:
        text = text.rsplit(_HARMONY_FINAL, 1)[1]
    text = _THINK.sub("", text)
    closes = list(_CLOSE_THINK.finditer(text))
    if closes:
        text = text[closes[-1].end():]
    opened = _OPEN_THINK.search(text)
    if opened:
        text = text[:opened.start()]
    return text


def _objects(text: str) -> list[Any]:
    """Top-level JSON objects in a text, in order (a nested object is not listed again)."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    index = text.find("{")
    while index != -1 and len(found) < MAX_OBJECTS:
        try:
            value, end = decoder.raw_decode(text, index)
        except ValueError:
            index = text.find("{", index + 1)
            continue
        found.append(value)
        index = text.find("{", end)
    return found


def _as_plan(value: Any) -> dict[str, Any] | None:
    if isinstance(value, dict) and set(value) == {"plan"} and isinstance(value["plan"], dict):
        value = value["plan"]
    return value if isinstance(value, dict) else None


def extract_plan(reply: str) -> Extraction:
    """The last schema-valid plan in a reply, preferring fenced code blocks; never guesses."""
    if not reply or not reply.strip():
        return Extraction(problems=["the reply is empty"])
    text = strip_thinking(reply[:MAX_REPLY])
    fenced: list[Any] = []
    for match in _FENCE.finditer(text):
        fenced += _objects(match.group(2))
    inline = _objects(_FENCE.sub(" ", text))
    problems: list[str] = []
    total = len(fenced) + len(inline)
    for source, values in (("fenced", fenced), ("inline", inline)):
        for value in reversed(values):
            candidate = _as_plan(value)
            if candidate is None or "candidates" not in candidate:
                continue
            try:
                parse_plan(candidate)
            except PlanRefused as exc:
                if not problems:
                    problems = [f"a JSON object looks like a plan but is not valid: {p}"
                                for p in (exc.problems or [str(exc)])][:5]
                continue
            return Extraction(plan=candidate, source=source, found_objects=total)  # type: ignore[arg-type]
    if not problems:
        problems = [f"no JSON object with \"hypothesis\" and \"candidates\" in the reply "
                    f"({total} JSON object(s) found outside thinking blocks)"]
    return Extraction(found_objects=total, problems=problems)


# ---------------------------------------------------------------------------------------------
# plan --local
# ---------------------------------------------------------------------------------------------


class LocalPlanResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint: str
    submitted: bool = False
    accepted: bool = False
    dry_run: bool = False
    message: str
    reply_excerpt: str = ""
    extraction: Extraction | None = None
    proposal: dict[str, Any] | None = None


def server_command(home: Home, *, start_supervisor: bool = True) -> list[str]:
    args = ["-m", "mcp_infra", "--home", str(home.root), "serve"]
    return [sys.executable, *args, *([] if start_supervisor else ["--no-supervisor"])]


def _child_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "HF_HUB_OFFLINE", "HF_HOME",
            "LD_PRELOAD", "VIRTUAL_ENV", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if k in keep} | {"PYTHONUNBUFFERED": "1"}


async def ask_model(endpoint: str, messages: list[dict[str, str]], *, model: str | None,
                    max_tokens: int, timeout: float) -> str:
    """One chat completion at temperature 0; returns the message content ('' if none)."""
    import httpx2

    body: dict[str, Any] = {"messages": messages, "temperature": 0.0, "max_tokens": max_tokens,
                            "stream": False}
    if model:
        body["model"] = model
    async with httpx2.AsyncClient(timeout=timeout) as http:
        response = await http.post(endpoint.rstrip("/") + "/chat/completions", json=body)
        response.raise_for_status()
        data = response.json()
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices, list):
        return ""
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""


async def plan_local(home: Home, *, dry_run: bool = False, endpoint: str | None = None,
                     model: str | None = None, max_tokens: int = 2048, timeout: float = 600.0,
                     goal: str | None = None, start_supervisor: bool = True,
                     log: Callable[[str], None] = lambda _m: None) -> LocalPlanResult:
    """Ask the served model for a plan through the MCP prompt; submit it through MCP."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters
    from mcp_types import Implementation

    config = load_config(home)
    url = endpoint or f"http://{config.host}:{config.port}/v1"
    command = server_command(home, start_supervisor=start_supervisor)
    params = StdioServerParameters(command=command[0], args=command[1:], env=_child_env())
    async with Client(params, client_info=Implementation(name=CLIENT_NAME,
                                                         version=__version__)) as client:
        prompt = await client.get_prompt(PROMPT_NAME, {"goal": goal} if goal else {})
        messages = [{"role": m.role, "content": getattr(m.content, "text", "")}
                    for m in prompt.messages]
        log(f"asking the model at {url} (temperature 0, up to {max_tokens} tokens)")
        try:
            reply = await ask_model(url, messages, model=model, max_tokens=max_tokens,
                                    timeout=timeout)
        except Exception as exc:  # any transport or HTTP failure: report it, change nothing
            return LocalPlanResult(endpoint=url, dry_run=dry_run,
                                   message=f"the model did not answer: {type(exc).__name__}: "
                                   f"{str(exc)[:200]}; nothing was proposed")
        extraction = extract_plan(reply)
        excerpt = reply[:600]
        if extraction.plan is None:
            return LocalPlanResult(
                endpoint=url, dry_run=dry_run, reply_excerpt=excerpt, extraction=extraction,
                message="the model's reply has no usable plan; nothing was proposed ("
                + "; ".join(extraction.problems) + ")")
        log(f"plan found ({extraction.source}); submitting it to propose_plan over MCP")
        result = await client.call_tool("propose_plan", {"plan": extraction.plan,
                                                         "dry_run": dry_run})
        proposal = result.structured_content if not result.is_error else None
        text = result.content[0].text if result.content else ""
        accepted = bool(proposal and proposal.get("accepted"))
        message = (proposal or {}).get("message") or text
        return LocalPlanResult(endpoint=url, submitted=True, accepted=accepted, dry_run=dry_run,
                               message=message, reply_excerpt=excerpt, extraction=extraction,
                               proposal=proposal)


def local_plan_text(result: LocalPlanResult) -> str:
    lines = [("accepted" if result.accepted else "not accepted") + f": {result.message}"]
    if result.proposal:
        p = result.proposal
        if p.get("plan_id"):
            lines.append(f"plan {p['plan_id']}: {', '.join(p.get('candidates', []))}"
                         + (" (dry run, not queued)" if result.dry_run else ""))
        lines += [f"  change: {c['field']} {c['action']}: {c['reason']}"
                  for c in p.get("changes", [])]
        lines += [f"  refused: {r['id']}: {r['reason']}" for r in p.get("refused", [])]
        lines += [f"  problem: {x}" for x in p.get("problems", [])]
        if p.get("follow"):
            lines.append(f"follow: {p['follow']}")
    elif result.reply_excerpt and not result.submitted:
        excerpt = result.reply_excerpt.replace("\n", " ")[:300]
        lines.append(f"model reply began: {excerpt!r}")
    return "\n".join(lines)


def prompt_for(home: Home, goal: str | None = None) -> str:
    """The same prompt the MCP server gives, for a person to paste into any model."""
    return render_prompt(build_context(home), goal)


__all__ = ["PlanningContext", "build_context", "render_prompt", "extract_plan", "plan_local",
           "Extraction", "LocalPlanResult", "strip_thinking", "plan_schema", "prompt_for",
           "local_plan_text", "cli_plan"]


def cli_plan(home: Home, args: Any) -> int:
    """`mcp-infra plan [--local] …`: print the prompt, or plan with the served model."""
    if args.goal is not None and (len(args.goal) > MAX_GOAL or "\n" in args.goal):
        print(f"--goal must be one line of at most {MAX_GOAL} characters", file=sys.stderr)
        return 2
    if not args.local:
        text = prompt_for(home, args.goal)
        print(json.dumps({"prompt": text}) if args.json else text)
        return 0
    import anyio

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    async def run() -> LocalPlanResult:
        return await plan_local(home, dry_run=args.dry_run, endpoint=args.endpoint,
                                model=args.model, max_tokens=args.max_tokens,
                                timeout=args.timeout, goal=args.goal,
                                start_supervisor=not args.no_supervisor, log=log)

    result = anyio.run(run)
    print(result.model_dump_json(indent=2) if args.json else local_plan_text(result))
    return 0 if result.accepted else 1
