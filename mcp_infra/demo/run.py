"""`mcp-infra demo`: the whole loop on the embedded default, through a real MCP client.

It builds the tiny models, serves the baseline behind the front on the stable port, starts
`mcp-infra serve` as a subprocess and talks to it over stdio exactly as an IDE agent would: reads
the registry, proposes a plan, follows `status` until the cycle is sealed, and prints the
evidence. Nothing about the result is decided here: the detached supervisor measures and the
selector decides.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import Implementation, TextContent

from mcp_infra import __version__
from mcp_infra.contracts import Recipe, ServiceConfig
from mcp_infra.demo.models import build_demo_models
from mcp_infra.errors import ExitCode, McpInfraError
from mcp_infra.procs.runtime import free_port, port_open
from mcp_infra.procs.service import ensure_serving, stop_service
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.context import load_config
from mcp_infra.state.evidence import list_cycles
from mcp_infra.state.store import Home, default_home, write_model

DEMO_CANDIDATES = ["demo-tiny:draft-k2", "demo-tiny:draft-k4", "demo-tiny:draft-k4-cache"]
DEMO_HYPOTHESIS = "A same-tokenizer drafter speeds up greedy decoding without changing outputs."
FOLLOW_MARGIN_S = 300
"""How long past the demo policy's cycle budget the demo follows its cycle: the last round may
run past the budget, then the cycle seals. A demo that stopped following sooner would stop the
service under a cycle still running (on a loaded 2-core machine a demo takes 15-20 minutes)."""


@dataclass(frozen=True)
class Scenario:
    """What a demo proposes over MCP, and what it prints beside the verdict table."""

    hypothesis: str
    candidates: list[str]
    notes: str = "proposed by `mcp-infra demo`"
    extra: Callable[[Any], list[str]] | None = None  # the sealed evidence → more lines


TINY = Scenario(DEMO_HYPOTHESIS, DEMO_CANDIDATES)


class DemoRefused(McpInfraError, RuntimeError):
    """The demo was pointed at a home that is not a demo's."""


def demo_home(root: str | Path | None) -> Home:
    """The demo never touches a real service's home: by default it lives in <home>/demo."""
    return Home(root) if root else Home(default_home() / "demo")


KEPT_BUNDLES = 10
"""Sealed demo bundles a demo home keeps (the newest): as many as ``state.spread`` reads."""


def reset(home: Home, *, fresh: bool = False) -> list[str]:
    """Reset a demo home for the next demo; return the cycle ids of the bundles it keeps.

    Plans, cycles, state, recipe memory and logs go. The newest ``KEPT_BUNDLES`` sealed bundles
    stay (``fresh``: none): their baseline starts are this machine's start-to-start spread,
    which the demo policy learns (``learn_spread``) as a user's home learns it from its own
    cycles, so a later demo can decide in fewer rounds. Recipe memory would read them too and
    (rightly) skip the candidate an earlier demo saw fail its lossless gate; the demo policy
    turns it off (``recipe_memory: false``), so every demo judges every candidate. The
    configurations' kept answers (``state.references``) stay with the bundles that measured them:
    a later demo's baseline asks no greedy pass its earlier one asked."""
    for folder in (home.plans, home.cycles, home.state, home.memory, home.logs):
        shutil.rmtree(folder, ignore_errors=True)
    if fresh:  # kept answers go with the bundles that show where they came from
        shutil.rmtree(home.references, ignore_errors=True)
    home.audit_log.unlink(missing_ok=True)
    kept = [] if fresh else [s.cycle_id for s in list_cycles(home)[:KEPT_BUNDLES]]
    if home.evidence.is_dir():
        for entry in home.evidence.iterdir():
            if entry.name not in kept:
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
    home.ensure()
    return kept


def prepare(home: Home, *, fresh: bool = False) -> ServiceConfig:
    """Build the models and write a config whose baseline is the plain target, in a demo home
    reset to its models and its earlier demos' sealed bundles (``reset``)."""
    if home.config.exists() and load_config(home).policy != "demo":
        raise DemoRefused(
            f"{home.root} manages a real service (policy "
            f"{load_config(home).policy!r}); the demo resets its home, so give it "
            "its own (--home DIR)"
        )
    home.ensure()
    if (home.service_file).exists() or (home.state / "front.json").exists():
        stop_service(home)
    reset(home, fresh=fresh)
    paths = build_demo_models(home.models)
    port = 18080 if not port_open(18080) else free_port()
    scratch = 18090 if not port_open(18090) and port != 18090 else free_port()
    config = ServiceConfig(
        port=port,
        scratch_port=scratch,
        policy="demo",
        # Each server on one CPU: the demo models' per-token hand-offs between threads made
        # unpinned servers run spells at 40% speed on a 2-CPU VM (procs.runtime.pin_to_cpus).
        server_cpus=1,
        baseline=Recipe(
            candidate_id="demo-tiny:target",
            template="mlx_lm_server",
            model_path=str(paths["target"]),
        ),
    )
    write_model(home.config, config)
    return config


def _server_params(home: Home) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_infra", "--home", str(home.root), "serve"],
        env={
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", ""),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        },
    )


class Clock:
    """Elapsed time since the demo began, as ``[m:ss]`` at the head of each line."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def stamp(self) -> str:
        elapsed = int(time.monotonic() - self.started)
        return f"[{elapsed // 60:2d}:{elapsed % 60:02d}]"


HEARTBEAT_S = 10.0  # the longest the demo stays silent while a cycle runs


def progress_line(status: dict[str, Any]) -> tuple[str, str]:
    """What changed (to decide whether to print) and the line to print: the cycle's step,
    round and start, and its time left, as `status` computed them."""
    cycle = status.get("cycle") or {}
    if not cycle:
        queue = status.get("queue") or []
        return ("waiting", f"waiting for the supervisor ({len(queue)} plan(s) queued)")
    measuring = cycle.get("measuring") or {}
    key = "|".join(
        str(x)
        for x in (
            cycle.get("state"),
            cycle.get("candidate"),
            measuring.get("round"),
            measuring.get("start_in_round"),
            measuring.get("phase"),
        )
    )
    return key, f"cycle {cycle.get('cycle_id')}: {cycle.get('progress') or cycle.get('state')}"


def cost_line(cost: dict[str, Any] | None) -> str:
    """What the plan was projected to cost before it ran, as the proposal said."""
    if not cost:
        return "projected cost: none was returned"
    mode = cost.get("mode") or "concurrent"
    if cost.get("basis") == "this-home" and cost.get("minutes") is not None:
        source = (cost.get("source") or ["an earlier cycle"])[0]
        return (
            f"projected on this machine: about {cost['minutes'] * 60:.0f} s of cycle, "
            f"{cost.get('rounds')} round(s), {cost.get('unserved_s') or 0:.0f} s unserved "
            f"({mode}), from the timings measured in {source}"
        )
    down = "unserved time unknown" if mode == "exclusive" else "0 s unserved"
    why = cost.get("why") or "no reason given"
    return f"projected cost: {cost.get('basis')} ({why}; {down}, {mode})"


def follow_timeout_s(home: Home) -> float:
    """Seconds the demo follows its cycle: the demo policy's cycle budget (the home's own
    ``demo`` policy where it has one) and ``FOLLOW_MARGIN_S``."""
    policy = load_policy("demo", extra=home.user_policy)
    return policy.budgets.cycle_minutes * 60 + FOLLOW_MARGIN_S


async def drive(
    home: Home, scenario: Scenario, log: Any, clock: Clock | None = None
) -> dict[str, Any]:
    """Talk to `mcp-infra serve` over stdio like any MCP client; return the sealed evidence."""
    clock = clock or Clock()
    info = Implementation(name="mcp-infra-demo", version=__version__)
    async with Client(_server_params(home), client_info=info) as client:
        registry = await client.call_tool("registry", {})  # its summary counts every page
        passing = registry.structured_content["summary"]["pass_preflight"]
        log(f"registry: {passing} candidates pass preflight on this machine")
        plan = {
            "hypothesis": scenario.hypothesis,
            "candidates": scenario.candidates,
            "notes": scenario.notes,
        }
        result = await client.call_tool("propose_plan", {"plan": plan})
        proposal = result.structured_content
        if result.is_error or not proposal or not proposal.get("accepted"):
            first = result.content[0] if result.content else None
            text = first.text if isinstance(first, TextContent) else "no answer"
            raise RuntimeError(f"plan refused: {proposal.get('message') if proposal else text}")
        log(f"plan {proposal['plan_id']} queued: {', '.join(proposal['candidates'])}")
        log(cost_line(proposal.get("cost")))
        follow_s = follow_timeout_s(home)
        deadline = time.monotonic() + follow_s
        last, last_printed = "", 0.0
        while time.monotonic() < deadline:
            status = (await client.call_tool("status", {})).structured_content
            key, line = progress_line(status)
            now = time.monotonic()
            if key != last or now - last_printed >= HEARTBEAT_S:
                log(f"{clock.stamp()} {line}")
                last, last_printed = key, now
            sealed = status.get("last_cycle") or {}
            if (
                sealed.get("plan_id") == proposal["plan_id"]
                and not status["queue"]
                and not status.get("supervisor_running")
            ):
                break
            if _SIGNALLED:  # interrupted, though the exception did not reach this far
                raise KeyboardInterrupt
            await anyio.sleep(1.0)
        else:
            raise RuntimeError(f"the cycle did not seal within {follow_s:.0f} s")
        cycle_id = sealed["cycle_id"]
        ev = await client.call_tool("evidence", {"cycle_id": cycle_id})
        return ev.structured_content


def stop_supervisor(home: Home, timeout: float = 300.0) -> str:
    """Stop the home's supervisor (``flows.supervisor.stop_supervisor``), waiting briefly for
    one the demo's MCP server was just starting, and retire a plan still queued, so nothing
    runs on after the demo has gone."""
    from mcp_infra.flows.supervisor import stop_supervisor as stop

    stopped = stop(home, timeout, starting_s=5.0)
    for entry in home.queued():
        home.retire(entry)
    return stopped


def _interrupted(home: Home, keep_serving: bool, log: Any) -> None:
    """Ctrl-C: stop the cycle cleanly, check the service was restored, and say so."""
    from mcp_infra.flows.status import status

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log("\ninterrupted: stopping the cycle (the supervisor restores the live recipe)")
    log(stop_supervisor(home))
    cycles = list_cycles(home)
    if cycles and cycles[0].interrupted:
        c = cycles[0]
        log(f"cycle {c.cycle_id} sealed as interrupted: {c.outcome.value} — {c.reason}")
    view = status(home)
    service = view.service
    if service is not None:
        serving = "serves" if service.pid else "does NOT serve"
        log(f"the live recipe {service.active_recipe} {serving} on {service.endpoint}")
    if not keep_serving:
        stop_service(home)
        log("service stopped (the demo's service runs only while the demo does)")


_SIGNALLED: list[int] = []
"""Signals `_as_ctrl_c` took: the follow loop checks it, so a KeyboardInterrupt that a library
swallowed on its way up (asyncio's own SIGINT handling only cancels the main task, and a
cancellation can be absorbed inside the MCP client's calls) still stops the demo."""


def _as_ctrl_c(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the cleanup is not interrupted
    _SIGNALLED.append(signum)
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Output:
    """Where a demo says what it does: ``log`` (stdout, stderr under --json) and its clock."""

    log: Callable[[str], None]
    clock: Clock
    as_json: bool = False
    keep_serving: bool = False


def quiet_libraries() -> None:
    """The demo prints its own account of each request: the HTTP and MCP libraries stay quiet."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for name in ("httpx", "httpx2", "mcp"):
        logging.getLogger(name).setLevel(logging.WARNING)


def output(as_json: bool, keep_serving: bool) -> Output:
    def log(message: str) -> None:
        print(message, file=sys.stderr if as_json else sys.stdout, flush=True)

    return Output(log, Clock(), as_json, keep_serving)


def run_demo(
    root: str | None, *, as_json: bool = False, keep_serving: bool = False, fresh: bool = False
) -> int:
    quiet_libraries()
    home = demo_home(root)
    out = output(as_json, keep_serving)
    log, clock = out.log, out.clock
    log(f"home: {home.root}")
    config = prepare(home, fresh=fresh)  # DemoRefused: the command line's usage error (exit 2)
    history = len(list_cycles(home))
    if history:
        log(
            f"{clock.stamp()} learning this machine's start-to-start spread from {history} "
            "earlier demo(s) kept in this home (--fresh forgets them)"
        )
    log(f"{clock.stamp()} demo models built in {home.models}")
    log(
        f"{clock.stamp()} starting the front on 127.0.0.1:{config.port} (clients' endpoint) and "
        "the live backend (baseline: plain target) on a port of its own"
    )
    return run_scenario(home, config, TINY, out)


def run_scenario(home: Home, config: ServiceConfig, scenario: Scenario, out: Output) -> int:
    """Serve the baseline, propose ``scenario`` over MCP, follow the cycle, print its verdict
    table (and the scenario's own lines), and stop the service unless asked to keep it."""
    from mcp_infra.faces.render import verdict_table
    from mcp_infra.flows.views import EvidenceView

    log, clock, keep_serving = out.log, out.clock, out.keep_serving
    # Ctrl-C and `kill` raise KeyboardInterrupt where the demo is, not through asyncio's SIGINT
    # handler (which cancels the main task: a cancellation the MCP client can absorb, and then
    # the demo ran on to the end of its cycle under a busy test run).
    _SIGNALLED.clear()
    signal.signal(signal.SIGINT, _as_ctrl_c)
    signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        ensure_serving(home, config.baseline, config)
        evidence = anyio.run(drive, home, scenario, log, clock)
    except KeyboardInterrupt:
        _interrupted(home, keep_serving, log)
        return ExitCode.INTERRUPTED
    except BaseException:
        if not keep_serving:
            stop_service(home)
        raise
    if not keep_serving:
        stop_service(home)
    view = EvidenceView.model_validate(evidence)
    log("")
    log(verdict_table(view))
    for line in scenario.extra(view) if scenario.extra else []:
        log(line)
    summary = view.summary
    assert summary is not None
    log(
        f"\nevidence: {view.path}  (verify: mcp-infra --home {home.root} evidence verify "
        f"{summary.cycle_id})"
    )
    log(
        f"demo took {time.monotonic() - clock.started:.0f} s"
        + (
            f"; still serving {summary.active_recipe} on 127.0.0.1:{config.port}"
            if keep_serving
            else "; service stopped"
        )
    )
    if view.report_path:
        log(f"report: {view.report_path}  (open it in a browser)")
    if out.as_json:
        print(
            json.dumps(
                {
                    "cycle_id": summary.cycle_id,
                    "outcome": summary.outcome.value,
                    "selected": summary.selected,
                    "speedup_pct": summary.speedup_pct,
                    "evidence_path": view.path,
                    "report_path": view.report_path,
                    "home": str(home.root),
                }
            )
        )
    return 0
