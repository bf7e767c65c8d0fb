"""`mcp-infra`: the same functions as the MCP tools, for people at a terminal."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import BaseModel

from mcp_infra import __version__
from mcp_infra.contracts import CandidateClass, Outcome
from mcp_infra.errors import (
    ExitCode,
    Interrupted,
    McpInfraError,
    ServerUnavailable,
    UsageError,
)
from mcp_infra.faces import evidence_cli, render
from mcp_infra.flows import api as app
from mcp_infra.state.context import active_recipe, load_config, window_state
from mcp_infra.state.store import ENV_HOME, CorruptFile, Home, LockHeld

if TYPE_CHECKING:  # the MCP server is imported only by the commands that serve
    from mcp_infra.faces.mcp_server import Mode


def _print(data: Any, as_json: bool, text: str | None = None) -> None:
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


def _fail(message: str, code: ExitCode = ExitCode.USAGE) -> NoReturn:
    raise Failed(message, code)


def report_error(message: str, code: int, as_json: bool) -> int:
    """One line on stderr (`mcp-infra: error: ...`), or with --json one JSON object on stdout:
    ``{"error": {"code": 2, "name": "USAGE", "message": ...}}``."""
    line = " ".join(str(message).split())
    name = ExitCode(code).name if code in ExitCode._value2member_map_ else "INTERRUPTED"
    if as_json:
        print(json.dumps({"error": {"code": int(code), "name": name, "message": line}}))
    else:
        print(f"mcp-infra: error: {line}", file=sys.stderr)
    return int(code)


# ---------------------------------------------------------------------------------------------
# Commands: each takes the home and its parsed arguments and returns an exit code. Heavy modules
# (the MCP server, the cycle, the demo) are imported inside the command that needs them, so
# `mcp-infra status` stays fast.
# ---------------------------------------------------------------------------------------------


def cmd_demo(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.demo.run import run_demo

    return run_demo(args.home, as_json=args.json, keep_serving=args.keep_serving, fresh=args.fresh)


def cmd_serve(home: Home, args: argparse.Namespace) -> int:

    if args.auth == "none" and args.transport != "http":
        _fail("serve: --auth applies to --transport http only")
    mode: Mode = args.mode or ("read-only" if args.auth == "none" else "propose")
    try:
        return _serve(home, args, mode)
    except KeyboardInterrupt:  # Ctrl-C in the terminal of its client (the demo): a quiet stop
        return ExitCode.INTERRUPTED


def _serve(home: Home, args: argparse.Namespace, mode: Mode) -> int:
    from mcp_infra.faces.mcp_server import serve

    return serve(
        home,
        mode=mode,
        transport=args.transport,
        host=args.host,
        port=args.port,
        token_file=args.token_file,
        allowed_hosts=args.allowed_host,
        allowed_origins=args.allowed_origin,
        start_supervisor=not args.no_supervisor,
        auth=args.auth,
    )


def cmd_plan(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.faces.planner import cli_plan

    return cli_plan(home, args)


def cmd_status(home: Home, args: argparse.Namespace) -> int:
    view = app.status(home)
    _print(view, args.json, render.status_text(view))
    return ExitCode.OK


def cmd_registry(home: Home, args: argparse.Namespace) -> int:
    only = app.RegistryFilter(
        candidate_class=args.candidate_class, preflight=args.preflight, verdict=args.verdict
    )
    view = app.registry_view(home, args.candidate, only=only)
    if args.candidate and not view.candidates:
        _fail(app.unknown_candidate(home, args.candidate))
    _print(view, args.json, render.registry_text(view))
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
        _print(view, args.json, render.cycles_text(view))
        return ExitCode.OK
    if not words:
        _fail("evidence show|verify|report|export needs a cycle id (or latest) or a bundle path")
    ref = words[0]
    if action == "verify":
        return evidence_cli.cmd_verify(home, ref, args)
    if action == "report":
        return evidence_cli.cmd_report(home, ref, args)
    if action == "export":
        if len(words) < 2:
            _fail("evidence export needs a cycle id and a folder")
        return evidence_cli.cmd_export(home, ref, words[1], args)
    try:
        view = app.evidence_view(home, ref, args.section)
    except FileNotFoundError as exc:
        _fail(str(exc))
    _print(view, args.json, render.evidence_text(view))
    return ExitCode.OK


def cmd_propose(home: Home, args: argparse.Namespace) -> int:
    try:
        raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except FileNotFoundError:
        _fail(f"propose: no such file: {args.file} (give a JSON plan file, or - for stdin)")
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        _fail(f"propose: cannot read {args.file} as a text file: {type(exc).__name__}")
    view = app.propose(
        home, raw, proposed_by="cli", dry_run=args.dry_run, start_supervisor=not args.no_supervisor
    )
    _print(view, args.json, render.proposal_text(view))
    return ExitCode.OK if view.accepted else ExitCode.NO


def cmd_gate(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.core import gates

    if args.gate_action == "list":
        tasks = gates.list_tasks()
        _print([t.model_dump() for t in tasks], args.json, render.tasks_text(tasks))
        return ExitCode.OK
    known = [t.id for t in gates.list_tasks()]
    if args.task not in known:
        from mcp_infra.core.sanitize import nearest_text

        _fail(
            f"gate check: unknown task {args.task}{nearest_text(args.task, known)}; "
            f"tasks: {', '.join(known)}"
        )
    text = args.text if args.text is not None else sys.stdin.read()
    result = gates.check_task(args.task, text)
    _print(result.model_dump(), args.json, render.task_check_text(result))
    return ExitCode.OK if result.passed else ExitCode.NO


@contextmanager
def stopping_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` in the main thread (once; later signals are
    ignored while the command puts things back)."""

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Interrupted(signum)

    before = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)


def stop_cleanly(home: Home) -> list[str]:
    """After a signal: seal the interrupted cycle and restore the live recipe the way recovery
    after a crash does (``recover``), and stop every candidate server left behind."""
    from mcp_infra.flows.supervisor import recover, supervising
    from mcp_infra.procs.service import stop_stray_candidates

    with supervising(home):
        notes = recover(home)
        notes += [f"stopped candidate server {s}" for s in stop_stray_candidates(home)]
    return notes


def cmd_supervise(home: Home, args: argparse.Namespace) -> int:
    try:
        with stopping_on_signals():
            return _supervise(home, args)
    except Interrupted as exc:
        print(f"mcp-infra supervise: stopping on signal {exc.signum}", file=sys.stderr, flush=True)
        for note in stop_cleanly(home):
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
    _print([s.model_dump(mode="json") for s in summaries], args.json, "\n".join(lines))
    return ExitCode.OK


def cmd_recover(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.flows.supervisor import operator_recover

    notes = operator_recover(home)
    _print({"notes": notes}, args.json, "\n".join(notes))
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
        _fail(f"prepare: {exc}")
    text = render.prepared_text(result)
    if args.init_service:
        text += "\n" + app.init_service(home, args.candidate, args.port)
    _print(result, args.json, text)
    return ExitCode.OK


def cmd_init(home: Home, args: argparse.Namespace) -> int:
    options = app.InitOptions(port=args.port, policy=args.policy, model_dirs=args.model_dir)
    view = app.init_model(home, args.model, options)
    _print(view, args.json, render.init_text(view))
    return ExitCode.OK


def cmd_approve(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.flows.approve import ApprovalRefused, approve

    try:
        summary = approve(home, args.cycle, args.candidate)
    except ApprovalRefused as exc:
        _fail(f"approve: refused: {exc}")
    _print(summary, args.json, render.summary_line(summary))
    return ExitCode.OK if summary.outcome == Outcome.PROMOTED else ExitCode.NO


def cmd_service(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.procs.service import ensure_serving, stop_service

    if args.action == "start":
        said = ensure_serving(home, active_recipe(home), load_config(home))
    else:
        said = stop_service(home)
    _print({"service": said}, args.json, said)
    return ExitCode.OK


COMMANDS: dict[str, Callable[[Home, argparse.Namespace], int]] = {
    "demo": cmd_demo,
    "serve": cmd_serve,
    "plan": cmd_plan,
    "supervise": cmd_supervise,
    "recover": cmd_recover,
    "init": cmd_init,
    "prepare": cmd_prepare,
    "approve": cmd_approve,
    "status": cmd_status,
    "registry": cmd_registry,
    "evidence": cmd_evidence,
    "propose": cmd_propose,
    "service": cmd_service,
    "gate": cmd_gate,
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="mcp-infra", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mcp-infra {__version__}")
    parser.add_argument(
        "--home",
        help=f"home directory (default: ${ENV_HOME} or the per-user "
        "data directory; the demo uses <default>/demo)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="build tiny models, serve them, run one cycle over MCP")
    demo.add_argument("--json", action="store_true")
    demo.add_argument("--keep-serving", action="store_true")
    demo.add_argument(
        "--fresh",
        action="store_true",
        help="forget earlier demos' sealed bundles (the start-to-start spread they taught)",
    )

    serve = sub.add_parser("serve", help="the MCP server (stdio by default, or --transport http)")
    serve.add_argument(
        "--mode",
        choices=["read-only", "propose", "autonomous"],
        default=None,
        help="read-only: no propose_plan; propose (default; read-only with "
        "--auth none): plans are queued and run when the policy's window allows; "
        "autonomous: also keeps a watching supervisor running",
    )
    serve.add_argument(
        "--auth",
        choices=["token", "none"],
        default="token",
        help="http: token (default): a bearer token on every request; none: no "
        "token, for test suites on loopback only (read-only unless --mode is "
        "given)",
    )
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="http: address to bind (default 127.0.0.1; any other needs "
        "--token-file and --allowed-host)",
    )
    serve.add_argument("--port", type=int, default=8765, help="http: port (default 8765)")
    serve.add_argument(
        "--token-file",
        help="http: file with the bearer token clients must send "
        "(default <home>/http-token, generated with 0600 permissions)",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="http: a Host header value to accept besides loopback (repeatable)",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="http: an Origin to accept besides loopback (repeatable)",
    )
    serve.add_argument(
        "--no-supervisor",
        action="store_true",
        help="queue plans only; run `mcp-infra supervise` yourself",
    )

    plan = sub.add_parser(
        "plan",
        help="print the planning prompt; with --local, ask the served "
        "model for a plan and submit it over MCP",
    )
    plan.add_argument(
        "--local",
        action="store_true",
        help="ask the served model (OpenAI-compatible API, temperature 0)",
    )
    plan.add_argument("--dry-run", action="store_true", help="submit with dry_run: queue nothing")
    plan.add_argument(
        "--endpoint", help="OpenAI-compatible base URL ending in /v1 (default: the managed service)"
    )
    plan.add_argument("--model", help="model name to send (default: none, the server's own)")
    plan.add_argument(
        "--max-tokens",
        type=int,
        help="longest answer, in tokens (default: 64 for the menu, 2048 for the JSON prompt)",
    )
    plan.add_argument(
        "--prompt",
        choices=["auto", "menu", "json"],
        default="auto",
        help="menu: numbered candidates, answered with numbers; json: the full MCP prompt; "
        "auto (default): the menu for a served model under 1B parameters or an 8k context",
    )
    plan.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the model")
    plan.add_argument("--goal", help="one line: what to optimize")
    plan.add_argument("--json", action="store_true")
    _queue_only(plan)

    sup = sub.add_parser(
        "supervise",
        help="recover, run every queued plan the maintenance window "
        "allows, exit when the queue is empty (or keep watching: --watch)",
    )
    sup.add_argument(
        "--watch",
        action="store_true",
        help="keep running: run queued plans when the window allows",
    )
    sup.add_argument(
        "--interval",
        type=float,
        help="--watch: seconds between looks (default: 300)",
    )
    sup.add_argument("--max-cycles", type=int, help="--watch: stop after this many cycles")
    sup.add_argument("--json", action="store_true", help="the sealed cycles' summaries as JSON")
    sup.add_argument(
        "--ignore-window",
        action="store_true",
        help="an operator's override: start queued plans now, outside the window",
    )
    rec = sub.add_parser(
        "recover", help="finish or undo an interrupted cycle; clear needs-operator"
    )
    rec.add_argument("--json", action="store_true")

    prep = sub.add_parser(
        "prepare",
        help="download a candidate's pinned hub artifacts into the "
        "shared Hugging Face cache and record their sha256; build its pinned runtime "
        "environment, if it names one, under <home>/runtimes/",
    )
    prep.add_argument("candidate")
    prep.add_argument(
        "--offline",
        action="store_true",
        help="use only the local cache (also: HF_HUB_OFFLINE=1) and build no runtime "
        "environment (also: PIP_NO_INDEX=1)",
    )
    prep.add_argument(
        "--cache",
        help="hub cache folder (default: $HF_HUB_CACHE, else "
        "$HF_HOME/hub, else ~/.cache/huggingface/hub)",
    )
    prep.add_argument(
        "--init-service",
        action="store_true",
        help="no config.yaml yet: write one whose baseline serves the candidate's "
        "target without a drafter, under the default policy",
    )
    prep.add_argument("--port", type=int, default=8080, help="--init-service: stable port")
    prep.add_argument("--json", action="store_true")

    init = sub.add_parser(
        "init",
        help="make (or update) a home whose live service serves your model: a model folder, "
        "or a hub repo already in the local Hugging Face cache (nothing is downloaded)",
    )
    init.add_argument("--model", required=True, metavar="PATH|REPO[@REVISION]")
    init.add_argument("--port", type=int, help="stable port (default 8080, or the home's)")
    init.add_argument("--policy", help="policy name (default: default, or the home's)")
    init.add_argument(
        "--model-dir",
        action="append",
        metavar="DIR",
        help="a folder where the catalog looks for drafters, besides the hub cache (repeatable)",
    )
    init.add_argument("--json", action="store_true")

    appr = sub.add_parser(
        "approve",
        help="promote a qualified candidate awaiting approval, after a fresh online verification",
    )
    appr.add_argument("cycle", help="the sealed cycle that qualified it")
    appr.add_argument("candidate", nargs="?", help="needed if several await approval")
    appr.add_argument("--json", action="store_true")

    for name in ("status", "registry"):
        p = sub.add_parser(name)
        p.add_argument("--json", action="store_true")
        if name == "registry":
            p.add_argument("candidate", nargs="?")
            p.add_argument(
                "--class", dest="candidate_class", choices=[c.value for c in CandidateClass]
            )
            p.add_argument("--preflight", choices=["passed", "failed"])
            p.add_argument(
                "--verdict", choices=["untried", "qualified", "rejected", "inconclusive"]
            )

    ev = sub.add_parser(
        "evidence",
        help="evidence [list] | [show] ID | verify ID|PATH [--key "
        "FILE] | report ID [-o FILE] | export ID FOLDER",
    )
    ev.add_argument("words", nargs="*")
    ev.add_argument(
        "--key",
        help="verify with this public key (PEM) instead of the home's: "
        "for a bundle copied elsewhere",
    )
    ev.add_argument(
        "--fingerprint",
        metavar="HEX",
        help="verify/report: the signing key must have this fingerprint (SHA-256 of the raw "
        "public key, as `evidence export` and `status` print it)",
    )
    ev.add_argument(
        "-o", "--output", help="report: write the HTML here (default: <home>/reports/<id>.html)"
    )
    ev.add_argument(
        "--section", choices=["summary", "table", "gates", "verdict", "journal", "plan"]
    )
    ev.add_argument("--json", action="store_true")

    prop = sub.add_parser("propose", help="propose a plan from a JSON file (or - for stdin)")
    prop.add_argument("file")
    prop.add_argument("--dry-run", action="store_true")
    prop.add_argument("--json", action="store_true")
    _queue_only(prop)

    svc = sub.add_parser(
        "service",
        help="start or stop the live service (the front on the "
        "stable port and the live backend behind it)",
    )
    svc.add_argument("action", choices=["start", "stop"])
    svc.add_argument("--json", action="store_true")

    gate = sub.add_parser("gate", help="see how the quality checkers judge a text")
    gsub = gate.add_subparsers(dest="gate_action", required=True)
    gl = gsub.add_parser("list")
    gl.add_argument("--json", action="store_true")
    gc = gsub.add_parser("check")
    gc.add_argument("--task", required=True)
    gc.add_argument("--text", help="the text to judge (default: stdin)")
    gc.add_argument("--json", action="store_true")
    _global_options_anywhere([*sub.choices.values(), *gsub.choices.values()])
    return parser


def _queue_only(parser: argparse.ArgumentParser) -> None:
    """``--no-supervisor`` of `plan` and `propose` (serve's says "plans": it queues many)."""
    parser.add_argument(
        "--no-supervisor",
        action="store_true",
        help="queue only; run `mcp-infra supervise` yourself",
    )


def _global_options_anywhere(parsers: list[argparse.ArgumentParser]) -> None:
    """`mcp-infra demo --home DIR` as well as `mcp-infra --home DIR demo` (SUPPRESS: a value
    given before the subcommand is kept when none is given after it)."""
    for child in parsers:
        child.add_argument(
            "--home",
            default=argparse.SUPPRESS,
            help="home directory (also accepted before the subcommand)",
        )


def exit_code_for(exc: BaseException) -> ExitCode | None:
    """The documented exit code of an error mcp-infra raises on purpose (docs/cli.md); None for
    anything else (a bug: its traceback is shown)."""
    from mcp_infra.state.catalog import RegistryError

    if isinstance(exc, Failed):
        return exc.code
    if isinstance(exc, CorruptFile | RegistryError):
        return ExitCode.CORRUPT_STATE
    if isinstance(exc, LockHeld):
        return ExitCode.LOCKED
    if isinstance(exc, ServerUnavailable):
        return ExitCode.UNAVAILABLE
    if type(exc).__name__ == "SealFailed":  # flows.cycle (not imported: `status` starts fast)
        return ExitCode.SEAL_FAILED
    if isinstance(exc, McpInfraError):  # a refusal: approval, preparation, demo home, HTTP setup
        return ExitCode.USAGE
    if isinstance(exc, OSError):
        return ExitCode.SYSTEM
    return None


def _message(exc: BaseException) -> str:
    if isinstance(exc, LockHeld):
        return f"another supervisor is running ({exc}); it owns the service, so this one exits"
    if isinstance(exc, OSError) and not isinstance(exc, McpInfraError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or type(exc).__name__}{where}"
    return str(exc)


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing its usage: `main` reports the error in one
    line (or as JSON) with exit code 2."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("mcp-infra").strip()
        raise UsageError(f"{command + ': ' if command else ''}{message} (see `{self.prog} --help`)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        return report_error(str(exc), ExitCode.USAGE, as_json)
    as_json = bool(getattr(args, "json", False))
    home = Home(args.home)
    try:
        return int(COMMANDS[args.command](home, args))
    except BrokenPipeError:  # the reader (`| head`) stopped reading: stop quietly, as `cat` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        return report_error("interrupted", ExitCode.INTERRUPTED, as_json)
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        return report_error(_message(exc), code, as_json)


if __name__ == "__main__":
    raise SystemExit(main())
