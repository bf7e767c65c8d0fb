"""The `evidence verify | report | export` commands (their words come from ``render``)."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from mcp_infra.contracts import CycleCost
from mcp_infra.errors import UsageError
from mcp_infra.faces import render
from mcp_infra.state import evidence, signing
from mcp_infra.state.store import Home, read_optional, write_bytes_atomic
from mcp_infra.state.verification import Verification


def show_cost(bundle: Path) -> str:
    return render.cost_text(read_optional(bundle / "cost.json", CycleCost))


def _bundle(home: Home, ref: str) -> Path:
    """The bundle a reference names; an unknown one is a usage error naming the nearest ids."""
    try:
        return evidence.bundle_path(home, ref)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc


def _pin(args: argparse.Namespace) -> str | None:
    """The ``--fingerprint`` asked for, normalised (ValueError if it is not one)."""
    given = getattr(args, "fingerprint", None)
    return signing.parse_fingerprint(given) if given else None


def _key_and_pin(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """``--key`` and ``--fingerprint`` of `verify` and `report`; a malformed pin is a usage
    error."""
    try:
        pin = _pin(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    return (Path(args.key) if getattr(args, "key", None) else None), pin


def trust_line(result: Verification) -> str:
    """The line under the checks that says which key verified, and what it is worth."""
    return f"  key  {result.key_note}"


def cmd_verify(home: Home, ref: str, args: argparse.Namespace) -> int:
    bundle = _bundle(home, ref)
    key, pin = _key_and_pin(args)
    result = evidence.verify(bundle, key=key, home=home, pin=pin)
    data = result.model_dump(mode="json") | {"ok": result.ok}
    print(
        json.dumps(data, indent=2)
        if args.json
        else render.verification_text(result) + "\n" + trust_line(result)
    )
    return 0 if result.ok else 1


def report_path(home: Home, cycle_id: str) -> Path:
    return home.root / "reports" / f"{cycle_id}.html"


def write_report(
    home: Home,
    bundle: Path,
    output: Path | None = None,
    key: Path | None = None,
    pin: str | None = None,
    checked: evidence.Verification | None = None,
) -> Path:
    """Render the bundle's report (with its verification: ``checked``, else verified here) to
    ``output`` or the home's reports."""
    from mcp_infra.faces import report

    result = checked or evidence.verify(bundle, key=key, home=home, pin=pin)
    target = output or report_path(home, bundle.name)
    write_bytes_atomic(target, report.render(bundle, result).encode())
    return target


def current_report(home: Home, bundle: Path) -> Path:
    """The home's report of a bundle, rewritten only when it is older than a file it depends
    on (the bundle's files, the home's keys and chain head): reading the summary or the
    report resource again costs no rendering."""
    from mcp_infra.state import signing

    target = report_path(home, bundle.name)
    try:
        made = target.stat().st_mtime_ns
    except OSError:
        made = -1
    inputs = [p for p in bundle.rglob("*") if p.is_file()]
    inputs += [p for p in signing.keys_dir(home).glob("*") if p.is_file()]
    newest = max((max(p.stat().st_mtime_ns, p.stat().st_ctime_ns) for p in inputs), default=0)
    if made > newest:
        return target
    # The read surfaces' verification (cached while no file it reads changed): the summary that
    # asks for this report has just verified the bundle; verifying again doubles the first read.
    return write_report(home, bundle, checked=evidence.verify_cached(bundle, home))


def cmd_report(home: Home, ref: str, args: argparse.Namespace) -> int:
    bundle = _bundle(home, ref)
    key, pin = _key_and_pin(args)
    target = write_report(home, bundle, Path(args.output) if args.output else None, key, pin)
    print(json.dumps({"report": str(target)}) if args.json else str(target))
    return 0


def cmd_export(home: Home, ref: str, dest: str, args: argparse.Namespace) -> int:
    """Copy a bundle and the public key that verifies it (as ``<id>.pub``) into a folder, and
    print the key's fingerprint: the public key travels with the copy, so only a fingerprint
    published apart from it (and pinned with ``--fingerprint``) says whose key it is."""
    bundle = _bundle(home, ref)
    fingerprint = signing.home_fingerprint(home)
    if fingerprint is None:
        raise UsageError(f"this home has no signing key ({signing.public_key_path(home)})")
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / bundle.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(bundle, target)
    key = folder / f"{bundle.name}.pub"
    shutil.copy2(signing.public_key_path(home), key)
    result = evidence.verify(target, key=key, pin=fingerprint)
    command = signing.verify_command(str(target), fingerprint, key)
    out = {
        "bundle": str(target),
        "key": str(key),
        "fingerprint": fingerprint,
        "verify_command": command,
        "ok": result.ok,
        "failed": result.failed,
    }
    print(
        json.dumps(out)
        if args.json
        else "\n".join(
            [
                f"{target}: {'VERIFIED' if result.ok else 'FAILED: ' + ', '.join(result.failed)}",
                f"  key fingerprint {signing.short_fingerprint(fingerprint)} (SHA-256 of the raw "
                f"Ed25519 public key; in full: {fingerprint})",
                "  publish the full fingerprint apart from the copy; whoever receives it verifies",
                f"  with: {command}",
            ]
        )
    )
    return 0 if result.ok else 1
