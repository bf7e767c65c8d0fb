"""The commands of `mcp-infra`: each takes the home and its parsed arguments and returns an exit
code (docs/cli.md). Heavy modules (the MCP server, the cycle, the demo) are imported inside the
command that needs them, so `mcp-infra status` stays fast. The words come from ``render``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel

from mcp_infra.contracts import Outcome
from mcp_infra.errors import ExitCode, Interrupted, McpInfraError
from mcp_infra.faces import evidence_cli, render
from mcp_infra.faces.refusals import person_fix
from mcp_infra.flows import api as app
from mcp_infra.flows.journal import stop_requested
from mcp_infra.state.context import active_recipe, load_config, window_state
from mcp_infra.state.store import Home


def show(data: Any, as_json: bool, text: str | None = None) -> None:
    """The result: as JSON with ``--json``, else the text (or the data itself)."""
    if as_json:
        payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(text if text is not None else data)


class Failed(McpInfraError):
    """A command's own refusal, with the exit code it maps to."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: ExitCode = ExitCode.USAGE) -> NoReturn:
    raise Failed(message, code)


def reachable(home: Home) -> bool:
    """Whether the home has a config.yaml. A home the system refuses (a path under a file, no
    permission) raises its OSError: exit 7, not a fresh home."""
    try:
        home.config.stat()
    except FileNotFoundError:
        return False
    return True


def configured(home: Home, command: str) -> None:
    """Nothing to act on without a managed service: a usage error that says what to run."""
    if not reachable(home):
        fail(f"{command}: {render.unconfigured(str(home.root))}; configure one: {render.CONFIGURE}")


def cmd_demo(home: Home, args: argparse.Namespace) -> int:
    if args.real:
        from mcp_infra.demo.real import run_real_demo as run
    else:
        from mcp_infra.demo.run import run_demo as run

    return run(args.home, as_json=args.json, keep_serving=args.keep_serving, fresh=args.fresh)


def cmd_serve(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.faces.mcp_server import ServeOptions, serve

    if args.auth == "none" and args.transport != "http":
        fail("serve: --auth applies to --transport http only")
    options = ServeOptions(
        mode=args.mode or ("read-only" if args.auth == "none" else "propose"),
        transport=args.transport,
        host=args.host,
        port=args.port,
        token_file=args.token_file,
        allowed_hosts=args.allowed_host,
        allowed_origins=args.allowed_origin,
        start_supervisor=not args.no_supervisor,
        auth=args.auth,
    )
    try:
        return serve(home, options)
    except KeyboardInterrupt:  # Ctrl-C in the terminal of its client (the demo): a quiet stop
        return ExitCode.INTERRUPTED


def cmd_plan(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.faces.planner import cli_plan

    configured(home, "plan")
    return cli_plan(home, args)


def cmd_status(home: Home, args: argparse.Namespace) -> int:
    reachable(home)  # a home the system refuses is exit 7, not "not configured"
    view = app.status(home)
    show(view, args.json, render.status_text(view))
    return ExitCode.OK


def cmd_registry(home: Home, args: argparse.Namespace) -> int:
    only = app.RegistryFilter(
        candidate_class=args.candidate_class, preflight=args.preflight, verdict=args.verdict
    )
    view = app.registry_view(home, args.candidate, only=only)
    if args.candidate and not view.candidates:
        fail(app.unknown_candidate(home, args.candidate))
    show(view, args.json, render.registry_text(view))
    return ExitCode.OK


def cmd_evidence(home: Home, args: argparse.Namespace) -> int:
    words = list(args.words)
    action = "list"
    if words and words[0] in {"list", "show", "verify", "report", "export"}:
        action = words.pop(0)
    elif words:
        action = "show"
    if action == "list":
        view = app.evidence_view(home)
        show(view, args.json, render.cycles_text(view))
        return ExitCode.OK
    if not words:
        fail("evidence show|verify|report|export needs a cycle id (or latest) or a bundle path")
    ref = words[0]
    if action == "verify":
        return evidence_cli.cmd_verify(home, ref, args)
    if action == "report":
        return evidence_cli.cmd_report(home, ref, args)
    if action == "export":
        if len(words) < 2:
            fail("evidence export needs a cycle id and a folder")
        return evidence_cli.cmd_export(home, ref, words[1], args)
    try:
        view = app.evidence_view(home, ref, args.section)
    except FileNotFoundError as exc:
        fail(str(exc))
    show(view, args.json, render.evidence_text(view))
    return ExitCode.OK


def cmd_propose(home: Home, args: argparse.Namespace) -> int:
    try:
        raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except FileNotFoundError:
        fail(f"propose: no such file: {args.file} (give a JSON plan file, or - for stdin)")
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        fail(f"propose: cannot read {args.file} as a text file: {type(exc).__name__}")
    configured(home, "propose")
    view = app.propose(
        home, raw, proposed_by="cli", dry_run=args.dry_run, start_supervisor=not args.no_supervisor
    )
    fix = person_fix(home, view, lambda: app.registry_view(home, wait_costs=False))
    show(view, args.json, render.proposal_text(view, fix, cli=True))
    return ExitCode.OK if view.accepted else ExitCode.NO


def cmd_gate(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.core import gates

    tasks = gates.list_tasks()
    if args.action == "list":
        show([t.model_dump() for t in tasks], args.json, render.tasks_text(tasks))
        return ExitCode.OK
    known = [t.id for t in tasks]
    if args.task not in known:
        from mcp_infra.core.sanitize import nearest_text

        given = (
            f"unknown task {args.task}{nearest_text(args.task, known)}"
            if args.task
            else ("--task is required")
        )
        fail(f"gate check: {given}; tasks: {', '.join(known)}")
    from mcp_infra.contracts import Sample
    from mcp_infra.procs.sandbox import with_code_run

    text = args.text if args.text is not None else sys.stdin.read()
    reply = Sample(candidate="cli", phase="quality", prompt_id=args.task, repeat=0, text=text)
    result = gates.check_sample(with_code_run(reply))  # a code answer is run as a cycle runs it
    shown = result.model_copy(update={"detail": render.excerpt(result.detail)})
    show(shown.model_dump(), args.json, render.task_check_text(result))
    return ExitCode.OK if result.passed else ExitCode.NO


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread (once; later signals are
    ignored while the command puts things back), after any step held against them
    (``journal.stops_held``: a plan taken from the queue and its cycle's first journal line)."""

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_requested(signum)  # raises Interrupted, at once or as a held step ends

    before = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


def stop_cleanly(home: Home, signum: int) -> list[str]:
    """After a signal: seal the interrupted cycle and restore the live recipe the way recovery
    after a crash does (``recover``, its reason saying which signal stopped it), and stop every
    candidate server left behind."""
    from mcp_infra.flows.supervisor import recover, supervising
    from mcp_infra.procs.service import stop_stray_candidates

    cause = f"stopped on {signal.Signals(signum).name}"
    if signum == signal.SIGTERM:
        cause += " (`supervise --stop`, `service stop`, a demo's Ctrl-C or the system)"
    elif signum == signal.SIGINT:
        cause += " (Ctrl-C)"
    with supervising(home):
        notes = recover(home, cause)
        notes += [f"stopped candidate server {s}" for s in stop_stray_candidates(home)]
    return notes


def cmd_supervise(home: Home, args: argparse.Namespace) -> int:
    if args.stop:
        from mcp_infra.flows.supervisor import stop_running

        lines = stop_running(home)
        show({"stopped": lines}, args.json, "\n".join(lines))
        return ExitCode.OK
    try:
        with stopping_on_signals():
            return _supervise(home, args)
    except Interrupted as exc:
        print(f"mcp-infra supervise: stopping on signal {exc.signum}", file=sys.stderr, flush=True)
        for note in stop_cleanly(home, exc.signum):
            print(note, flush=True)
        print("stopped: the live recipe serves; no candidate server is left", flush=True)
        return 128 + exc.signum


def _supervise(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.flows.supervisor import supervise

    if args.watch:
        from mcp_infra.flows.watch import watch

        watch(
            home,
            interval_s=args.interval,
            max_cycles=args.max_cycles,
            ignore_window=args.ignore_window,
        )
        return ExitCode.OK
    summaries = supervise(home, ignore_window=args.ignore_window)
    lines = [render.summary_line(summary) for summary in summaries]
    if home.queued() and not args.ignore_window:
        state = window_state(home)
        if not state.may_start:
            lines.append(f"{len(home.queued())} plan(s) wait in the queue: {state.reason}")
    show([s.model_dump(mode="json") for s in summaries], args.json, "\n".join(lines))
    return ExitCode.OK


def cmd_recover(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.flows.supervisor import operator_recover

    notes = operator_recover(home)
    show({"notes": notes}, args.json, "\n".join(notes))
    return ExitCode.OK


def cmd_prepare(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.state.artifacts import HubError

    try:
        result = app.prepare_candidate(
            home,
            args.candidate,
            offline=args.offline or None,
            cache=Path(args.cache) if args.cache else None,
            progress=not args.json,
        )
    except HubError as exc:
        fail(f"prepare: {exc}")
    text = render.prepared_text(result)
    if args.init_service:
        text += "\n" + app.init_service(home, args.candidate, args.port)
    show(result, args.json, text)
    return ExitCode.OK


def cmd_init(home: Home, args: argparse.Namespace) -> int:
    options = app.InitOptions(port=args.port, policy=args.policy, model_dirs=args.model_dir)
    view = app.init_model(home, args.model, options)
    show(view, args.json, render.init_text(view))
    return ExitCode.OK


def cmd_approve(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.flows.approve import ApprovalRefused, approve

    try:
        summary = approve(home, args.cycle, args.candidate)
    except ApprovalRefused as exc:
        fail(f"approve: refused: {exc}")
    show(summary, args.json, render.summary_line(summary))
    return ExitCode.OK if summary.outcome == Outcome.PROMOTED else ExitCode.NO


def cmd_service(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.procs.service import ensure_serving, stop_service

    if args.action == "start":
        said = ensure_serving(home, active_recipe(home), load_config(home))
    else:  # a cycle measuring beside a stopped service would promote into nothing
        from mcp_infra.flows.supervisor import stop_running

        first = stop_running(home) if home.lock_is_held() else []
        said = "\n".join([*first, stop_service(home)])
    show({"service": said}, args.json, said)
    return ExitCode.OK
