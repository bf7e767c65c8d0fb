"""`mcp-infra`: the same functions as the MCP tools, for people at a terminal."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mcp_infra import app, evidence
from mcp_infra.cycle import SealFailed
from mcp_infra.store import ENV_HOME, CorruptFile, Home, LockHeld


def _print(data: Any, as_json: bool, text: str | None = None) -> None:
    if as_json:
        payload = data.model_dump(mode="json") if isinstance(data, BaseModel) else data
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(text if text is not None else data)


def _status_text(view: app.StatusView) -> str:
    if not view.configured:
        return f"home {view.home}: not configured. " + " ".join(view.problems)
    lines = [f"home        {view.home}"]
    if view.service:
        s = view.service
        health = "healthy" if s.healthy else "NOT answering"
        since = f"; pid {s.pid} since {s.since:%Y-%m-%d %H:%M:%S}Z" if s.pid and s.since else ""
        lines.append(f"service     {s.endpoint} {health}; recipe {s.active_recipe} "
                     f"({app.knobs_text(s.knobs)}){since}")
    sup = f"running (pid {view.supervisor_pid})" if view.supervisor_running else "not running"
    lines.append(f"supervisor  {sup}")
    if view.cycle:
        c = view.cycle
        extra = f" — {c.candidate} ({c.index}/{c.total})" if c.candidate else ""
        lines.append(f"cycle       {c.cycle_id}: {c.state}{extra}: {c.message}")
        if c.progress:
            lines.append(f"progress    {c.progress}"
                         + (f"; {c.elapsed_s:.0f} s so far" if c.elapsed_s is not None else ""))
        if c.downtime_note:
            lines.append(f"downtime    {c.downtime_note}")
    lines.append(f"queue       {', '.join(view.queue) or 'empty'}")
    if view.last_cycle:
        lc = view.last_cycle
        lines.append(f"last cycle  {lc.cycle_id}: {lc.outcome.value}"
                     + (f", selected {lc.selected}" if lc.selected else "")
                     + (f" ({lc.speedup_pct:+.1f}%)" if lc.speedup_pct is not None else ""))
    w = view.window or {}
    shown = (f"{w.get('start')}–{w.get('end')} {w.get('timezone')}" if w.get("mode") == "window"
             else str(w.get("mode", "?")))
    lines.append(f"policy      {view.policy}; maintenance window: {shown}")
    if view.window_now:
        lines.append(f"next cycle  {view.window_now}")
    if view.needs_operator:
        lines.append(f"NEEDS OPERATOR: {view.needs_operator} — run `mcp-infra recover`")
    lines += [f"problem     {p}" for p in view.problems]
    return "\n".join(lines)


def _registry_text(view: app.RegistryView) -> str:
    lines = []
    for c in view.candidates:
        verdict = "ok" if c.preflight_passed else "FAILS PREFLIGHT"
        lines.append(f"{c.id:32} {c.candidate_class:20} {c.semantics:9} {verdict}")
        lines.append(f"    knobs: {app.knobs_text(c.knobs)}")
        for check in c.checks:
            mark = "pass" if check.passed else "FAIL"
            if not check.passed:
                lines.append(f"    {mark} {check.name}: {check.detail}")
        for item in c.learned[-2:]:
            lines.append(f"    learned in {item.cycle_id}: {item.decision}"
                         + ("" if item.current else " (since then something changed)")
                         + (f" — {item.failed_gates[0]}" if item.failed_gates
                            else f" — {item.reasons[0]}" if item.reasons else ""))
        if c.skip:
            lines.append(f"    SKIPPED in plans: {c.skip}")
    return "\n".join(lines) or "no candidates"


def verdict_table(view: app.EvidenceView) -> str:
    """Per candidate: decode tok/s, speedup with interval, gates, decision."""
    verdict = view.verdict
    lines = []
    if view.summary:
        s = view.summary
        lines.append(f"cycle {s.cycle_id}: {s.outcome.value}"
                     + (f", selected {s.selected}" if s.selected else "") + f" — {s.reason}")
    if (impact := getattr(view, "service_impact", None)) is not None:
        lines.append(
            f"service: {impact.mode} mode, expected downtime {impact.expected_downtime_s:.0f} s; "
            f"unserved {impact.unserved_s if impact.unserved_s is not None else '?'} s, "
            f"{impact.live_requests if impact.live_requests is not None else '?'} live requests, "
            f"{impact.requests_held if impact.requests_held is not None else '?'} held (longest "
            f"{impact.longest_hold_s if impact.longest_hold_s is not None else '?'} s), "
            f"{impact.rejected_503 if impact.rejected_503 is not None else '?'} answered 503")
    if verdict is None:
        return "\n".join(lines)
    lines.append(f"{'candidate':26} {'decode tok/s':>13} {'speedup':>9} {'95% interval':>17} "
                 f"{'worst prompt':>13}  {'gates':24} decision")
    for c in verdict.candidates:
        tps = f"{c.candidate_tps:.1f}" if c.candidate_tps else "-"
        base = f"{c.baseline_tps:.1f}→" if c.baseline_tps else ""
        speed = f"{(c.speedup_estimate - 1) * 100:+.1f}%" if c.speedup_estimate else "-"
        ci = (f"[{(c.ci_low - 1) * 100:+.1f}, {(c.ci_high - 1) * 100:+.1f}]%"
              if c.ci_low is not None and c.ci_high is not None else "-")
        worst = (f"{(c.worst_speedup - 1) * 100:+.1f}%" if c.worst_speedup else "-")
        gates = ",".join(f"{g.gate}:{'ok' if g.passed else 'FAIL'}" for g in c.gates) or "-"
        lines.append(f"{c.candidate:26} {base + tps:>13} {speed:>9} {ci:>17} {worst:>13}  "
                     f"{gates:24} {c.decision.value}")
        for reason in c.reasons[:3]:
            lines.append(f"    {reason}")
    if view.table:
        lines.append("per prompt:")
        for row in view.table:
            lines.append(f"    {row['candidate']:26} {row['prompt']:16} {row['baseline_tps']:8.1f} "
                         f"→ {row['candidate_tps']:8.1f} tok/s  x{row['speedup']:.3f}")
    return "\n".join(lines)


def cmd_evidence(home: Home, args: argparse.Namespace) -> int:
    words = list(args.words)
    action = "list"
    if words and words[0] in {"list", "show", "verify"}:
        action = words.pop(0)
    elif words:
        action = "show"
    if action == "list":
        view = app.evidence_view(home)
        text = "\n".join(f"{c.cycle_id}  {c.outcome.value:20} {c.selected or '-':28} {c.reason}"
                         for c in view.cycles or []) or "no sealed cycles"
        _print(view, args.json, text)
        return 0
    if not words:
        print("evidence show|verify needs a cycle id or a bundle path", file=sys.stderr)
        return 2
    ref = words[0]
    if action == "verify":
        try:
            bundle = evidence.bundle_path(home, ref)
        except FileNotFoundError as exc:
            print(str(exc), file=sys.stderr)
            return 2
        result = evidence.verify(bundle)
        text = (f"{bundle}: hashes {'ok' if result.hashes_ok else 'MISMATCH'}; verdict "
                f"{'recomputed identically' if result.verdict_ok else 'DIFFERS'}"
                + "".join(f"\n  - {p}" for p in result.problems))
        _print(result.model_dump() | {"ok": result.ok}, args.json, text)
        return 0 if result.ok else 1
    try:
        view = app.evidence_view(home, ref, args.section)
    except FileNotFoundError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    _print(view, args.json, verdict_table(view) if args.section in (None, "summary", "table",
                                                                     "verdict") else None)
    if not args.json and args.section not in (None, "summary", "table", "verdict"):
        print(json.dumps(view.model_dump(mode="json", exclude_none=True), indent=2, default=str))
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from mcp_infra import gates

    if args.gate_action == "list":
        tasks = gates.list_tasks()
        _print([t.model_dump() for t in tasks], args.json,
               "\n".join(f"{t.id:12} {t.prompt}\n{'':12} checks: {t.checks}" for t in tasks))
        return 0
    text = args.text if args.text is not None else sys.stdin.read()
    result = gates.check_task(args.task, text)
    _print(result.model_dump(), args.json,
           f"{result.task}: {'PASS' if result.passed else 'FAIL'} — {result.detail}")
    return 0 if result.passed else 1


def cmd_supervise(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra import window
    from mcp_infra.cycle import supervise

    if args.watch:
        from mcp_infra.watch import watch

        watch(home, interval_s=args.interval, max_cycles=args.max_cycles,
              ignore_window=args.ignore_window)
        return 0
    for summary in supervise(home, ignore_window=args.ignore_window):
        print(f"{summary.cycle_id}: {summary.outcome.value} ({summary.reason})")
    if home.queued() and not args.ignore_window:
        state = window.for_home(home)
        if not state.may_start:
            print(f"{len(home.queued())} plan(s) wait in the queue: {state.reason}")
    return 0


def cmd_prepare(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra import hub

    try:
        result = hub.prepare_candidate(home, args.candidate, offline=args.offline or None,
                                       cache=Path(args.cache) if args.cache else None,
                                       progress=not args.json)
    except hub.HubError as exc:
        print(f"prepare: {exc}", file=sys.stderr)
        return 2
    lines = [f"{args.candidate}: prepared in {result.cache}"
             + (" (offline: from the cache)" if result.offline else "")]
    for a in result.artifacts:
        lines.append(f"  {a.role:6} {a.repo}@{a.revision[:12]}: {a.files} files, "
                     f"{a.bytes / 1e9:.2f} GB ({a.downloaded_bytes / 1e9:.2f} GB downloaded); "
                     f"sha256 inventory {a.inventory}")
    if args.init_service:
        lines.append(_init_service(home, args.candidate, args.port))
    _print(result, args.json, "\n".join(lines))
    return 0


def _init_service(home: Home, candidate: str, port: int) -> str:
    from mcp_infra.contracts import Recipe, ServiceConfig
    from mcp_infra.registry import artifact_path, find_candidate, load_registry, manifest_hash
    from mcp_infra.store import write_model

    if home.config.exists():
        return f"config.yaml exists in {home.root}: left as it is"
    found = find_candidate(load_registry(extra=home.user_registry), candidate)
    assert found is not None
    manifest, _ = found
    baseline = Recipe(candidate_id=f"{manifest.id}:target", template=manifest.runtime.template,
                      model_path=artifact_path(manifest.target, home.models, home.hf_cache),
                      manifest_hash=manifest_hash(manifest))
    home.ensure()
    write_model(home.config, ServiceConfig(port=port, scratch_port=port + 10, baseline=baseline))
    return (f"wrote {home.config}: the baseline serves {manifest.target.repo} with "
            f"{manifest.runtime.template} on 127.0.0.1:{port} (scratch port {port + 10}); "
            "start it with `mcp-infra service start`")


def cmd_approve(home: Home, args: argparse.Namespace) -> int:
    from mcp_infra.approve import ApprovalRefused, approve

    try:
        summary = approve(home, args.cycle, args.candidate)
    except ApprovalRefused as exc:
        print(f"approve: refused: {exc}", file=sys.stderr)
        return 2
    _print(summary, args.json, f"{summary.cycle_id}: {summary.outcome.value}"
           + (f", live recipe {summary.selected}" if summary.selected else "")
           + f" — {summary.reason}")
    return 0 if summary.outcome.value == "promoted" else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcp-infra", description=__doc__)
    parser.add_argument("--home", help=f"home directory (default: ${ENV_HOME} or the per-user "
                        "data directory; the demo uses <default>/demo)")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="build tiny models, serve them, run one cycle over MCP")
    demo.add_argument("--json", action="store_true")
    demo.add_argument("--keep-serving", action="store_true")

    serve = sub.add_parser("serve", help="the MCP server (stdio by default, or --transport http)")
    serve.add_argument("--mode", choices=["read-only", "propose", "autonomous"], default="propose",
                       help="read-only: no propose_plan; propose (default): plans are queued and "
                       "run when the policy's window allows; autonomous: also keeps a watching "
                       "supervisor running")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1",
                       help="http: address to bind (default 127.0.0.1; any other needs "
                       "--token-file and --allowed-host)")
    serve.add_argument("--port", type=int, default=8765, help="http: port (default 8765)")
    serve.add_argument("--token-file", help="http: file with the bearer token clients must send "
                       "(default <home>/http-token, generated with 0600 permissions)")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME[:PORT]",
                       help="http: a Host header value to accept besides loopback (repeatable)")
    serve.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                       help="http: an Origin to accept besides loopback (repeatable)")
    serve.add_argument("--no-supervisor", action="store_true",
                       help="queue plans only; run `mcp-infra supervise` yourself")

    plan = sub.add_parser("plan", help="print the planning prompt; with --local, ask the served "
                          "model for a plan and submit it over MCP")
    plan.add_argument("--local", action="store_true",
                      help="ask the served model (OpenAI-compatible API, temperature 0)")
    plan.add_argument("--dry-run", action="store_true", help="submit with dry_run: queue nothing")
    plan.add_argument("--endpoint", help="OpenAI-compatible base URL ending in /v1 (default: the "
                      "managed service)")
    plan.add_argument("--model", help="model name to send (default: none, the server's own)")
    plan.add_argument("--max-tokens", type=int, default=2048)
    plan.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the model")
    plan.add_argument("--goal", help="one line: what to optimize")
    plan.add_argument("--json", action="store_true")
    plan.add_argument("--no-supervisor", action="store_true",
                      help="queue only; run `mcp-infra supervise` yourself")

    sup = sub.add_parser("supervise", help="recover, run every queued plan the maintenance window "
                         "allows, exit when the queue is empty (or keep watching: --watch)")
    sup.add_argument("--watch", action="store_true",
                     help="keep running: run queued plans when the window allows and, if the "
                     "policy says so, re-check candidates that changed")
    sup.add_argument("--interval", type=float, help="--watch: seconds between looks (default: "
                     "the policy's watch.interval_s)")
    sup.add_argument("--max-cycles", type=int, help="--watch: stop after this many cycles")
    sup.add_argument("--ignore-window", action="store_true",
                     help="an operator's override: start queued plans now, outside the window")
    sub.add_parser("recover", help="finish or undo an interrupted cycle; clear needs-operator")

    prep = sub.add_parser("prepare", help="download a candidate's pinned hub artifacts into the "
                          "shared Hugging Face cache and record their sha256")
    prep.add_argument("candidate")
    prep.add_argument("--offline", action="store_true",
                      help="use only the local cache (also: HF_HUB_OFFLINE=1)")
    prep.add_argument("--cache", help="hub cache folder (default: $HF_HUB_CACHE, else "
                      "$HF_HOME/hub, else ~/.cache/huggingface/hub)")
    prep.add_argument("--init-service", action="store_true",
                      help="no config.yaml yet: write one whose baseline serves the candidate's "
                      "target without a drafter, under the default policy")
    prep.add_argument("--port", type=int, default=8080, help="--init-service: stable port")
    prep.add_argument("--json", action="store_true")

    appr = sub.add_parser("approve", help="promote a qualified candidate awaiting approval, "
                          "after a fresh online verification")
    appr.add_argument("cycle", help="the sealed cycle that qualified it")
    appr.add_argument("candidate", nargs="?", help="needed if several await approval")
    appr.add_argument("--json", action="store_true")

    for name in ("status", "registry"):
        p = sub.add_parser(name)
        p.add_argument("--json", action="store_true")
        if name == "registry":
            p.add_argument("candidate", nargs="?")

    ev = sub.add_parser("evidence", help="evidence [list] | [show] ID | verify ID|PATH")
    ev.add_argument("words", nargs="*")
    ev.add_argument("--section", choices=["summary", "table", "gates", "verdict", "journal",
                                          "plan"])
    ev.add_argument("--json", action="store_true")

    prop = sub.add_parser("propose", help="propose a plan from a JSON file (or - for stdin)")
    prop.add_argument("file")
    prop.add_argument("--dry-run", action="store_true")
    prop.add_argument("--json", action="store_true")
    prop.add_argument("--no-supervisor", action="store_true",
                      help="queue only; run `mcp-infra supervise` yourself")

    svc = sub.add_parser("service", help="start or stop the live service (the front on the "
                         "stable port and the live backend behind it)")
    svc.add_argument("action", choices=["start", "stop"])

    gate = sub.add_parser("gate", help="see how the quality checkers judge a text")
    gsub = gate.add_subparsers(dest="gate_action", required=True)
    gl = gsub.add_parser("list")
    gl.add_argument("--json", action="store_true")
    gc = gsub.add_parser("check")
    gc.add_argument("--task", required=True)
    gc.add_argument("--text", help="the text to judge (default: stdin)")
    gc.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from mcp_infra.demo import run_demo

        return run_demo(args.home, as_json=args.json, keep_serving=args.keep_serving)
    home = Home(args.home)
    try:
        return _dispatch(home, args)
    except CorruptFile as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except LockHeld as exc:
        print(f"another supervisor is running ({exc}); it owns the service, so this one exits",
              file=sys.stderr)
        return 4
    except SealFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 5


def _dispatch(home: Home, args: argparse.Namespace) -> int:
    command = args.command
    if command == "serve":
        from mcp_infra.server import serve

        return serve(home, mode=args.mode, transport=args.transport, host=args.host,
                     port=args.port, token_file=args.token_file,
                     allowed_hosts=args.allowed_host, allowed_origins=args.allowed_origin,
                     start_supervisor=not args.no_supervisor)
    if command == "plan":
        from mcp_infra.planner import cli_plan

        return cli_plan(home, args)
    if command == "supervise":
        return cmd_supervise(home, args)
    if command == "prepare":
        return cmd_prepare(home, args)
    if command == "approve":
        return cmd_approve(home, args)
    if command == "recover":
        from mcp_infra.cycle import operator_recover

        for note in operator_recover(home):
            print(note)
        return 0
    if command == "status":
        view = app.status(home)
        _print(view, args.json, _status_text(view))
        return 0
    if command == "registry":
        view = app.registry_view(home, args.candidate)
        _print(view, args.json, _registry_text(view))
        return 0 if view.candidates else 2
    if command == "evidence":
        return cmd_evidence(home, args)
    if command == "propose":
        raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        view = app.propose(home, raw, proposed_by="cli", dry_run=args.dry_run,
                           start_supervisor=not args.no_supervisor)
        text = (f"{'accepted' if view.accepted else 'refused'}: {view.message}"
                + (f"\nplan {view.plan_id}: {', '.join(view.candidates)}" if view.plan_id else "")
                + "".join(f"\n  change: {c.field} {c.action}: {c.reason}" for c in view.changes)
                + "".join(f"\n  refused: {r.id}: {r.reason}" for r in view.refused)
                + "".join(f"\n  problem: {p}" for p in view.problems))
        _print(view, args.json, text)
        return 0 if view.accepted else 1
    if command == "service":
        from mcp_infra.service import active_recipe, ensure_serving, load_config, stop_service

        if args.action == "start":
            print(ensure_serving(home, active_recipe(home), load_config(home)))
        else:
            print(stop_service(home))
        return 0
    if command == "gate":
        return cmd_gate(args)
    raise AssertionError(command)


if __name__ == "__main__":
    raise SystemExit(main())
