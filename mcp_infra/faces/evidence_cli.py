"""The `evidence verify | report | export` commands and the cost text of `evidence show`."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from mcp_infra import evidence
from mcp_infra.contracts import CycleCost
from mcp_infra.store import Home, read_optional, write_bytes_atomic


def verify_text(result: evidence.Verification) -> str:
    head = "VERIFIED" if result.ok else "FAILED: " + ", ".join(result.failed)
    key = f" (key {result.key_fingerprint[:16]}…)" if result.key_fingerprint else ""
    lines = [f"{result.bundle}: {head}{key}"]
    marks = {"ok": "ok  ", "failed": "FAIL", "skipped": "skip"}
    lines += [f"  {marks[c.status]} {c.name:22} {c.detail}" for c in result.checks]
    return "\n".join(lines)


def cost_text(cost: CycleCost | None) -> str:
    if cost is None:
        return "cost: not recorded in this bundle"
    lines = [
        f"cost: {cost.wall_s:.1f} s wall; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in cost.phases_s.items())
    ]
    if cost.supervisor_cpu_s is not None:
        lines.append(f"    supervisor CPU {cost.supervisor_cpu_s:.1f} s")
    for s in cost.servers:
        peak = f", peak {s.peak_rss_gb:.2f} GB" if s.peak_rss_gb is not None else ""
        lines.append(f"    {s.label} ({s.role}, pid {s.pid}): CPU {s.cpu_s:.1f} s{peak} — {s.note}")
    down = f"{cost.downtime_s:.2f} s" if cost.downtime_s is not None else "unknown"
    lines.append(f"    downtime of the stable port: {down} ({cost.downtime_source})")
    lines.append(f"    bytes downloaded: {cost.bytes_downloaded} ({cost.bytes_note})")
    lines.append(
        "    energy: "
        + (
            f"{cost.energy_j:.1f} J ({cost.energy_note})"
            if cost.energy_j is not None
            else cost.energy_note
        )
    )
    lines.append(f"    cost against gain: {cost.gain_note}")
    return "\n".join(lines)


def show_cost(bundle: Path) -> str:
    return cost_text(read_optional(bundle / "cost.json", CycleCost))


def _bundle(home: Home, ref: str) -> Path | None:
    if ref == "latest":
        cycles = evidence.list_cycles(home)
        ref = cycles[0].cycle_id if cycles else ref
    try:
        return evidence.bundle_path(home, ref)
    except FileNotFoundError as exc:
        print(str(exc), file=sys.stderr)
        return None


def cmd_verify(home: Home, ref: str, args: argparse.Namespace) -> int:
    bundle = _bundle(home, ref)
    if bundle is None:
        return 2
    key = Path(args.key) if getattr(args, "key", None) else None
    result = evidence.verify(bundle, key=key, home=None if key else home)
    data = result.model_dump(mode="json") | {"ok": result.ok}
    print(json.dumps(data, indent=2) if args.json else verify_text(result))
    return 0 if result.ok else 1


def report_path(home: Home, cycle_id: str) -> Path:
    return home.root / "reports" / f"{cycle_id}.html"


def write_report(
    home: Home, bundle: Path, output: Path | None = None, key: Path | None = None
) -> Path:
    """Render the bundle's report (with its verification) to ``output`` or the home's reports."""
    from mcp_infra.faces import report

    result = evidence.verify(bundle, key=key, home=None if key else home)
    target = output or report_path(home, bundle.name)
    write_bytes_atomic(target, report.render(bundle, result).encode())
    return target


def cmd_report(home: Home, ref: str, args: argparse.Namespace) -> int:
    bundle = _bundle(home, ref)
    if bundle is None:
        return 2
    key = Path(args.key) if getattr(args, "key", None) else None
    target = write_report(home, bundle, Path(args.output) if args.output else None, key)
    print(json.dumps({"report": str(target)}) if args.json else str(target))
    return 0


def cmd_export(home: Home, ref: str, dest: str, args: argparse.Namespace) -> int:
    """Copy a bundle and the public key that verifies it (as ``<id>.pub``) into a folder."""
    from mcp_infra.state import signing

    bundle = _bundle(home, ref)
    if bundle is None:
        return 2
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / bundle.name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(bundle, target)
    shutil.copy2(signing.public_key_path(home), folder / f"{bundle.name}.pub")
    result = evidence.verify(target, key=folder / f"{bundle.name}.pub")
    out = {
        "bundle": str(target),
        "key": str(folder / f"{bundle.name}.pub"),
        "ok": result.ok,
        "failed": result.failed,
    }
    print(
        json.dumps(out)
        if args.json
        else f"{target} (verify: mcp-infra evidence verify {target} --key "
        f"{folder / (bundle.name + '.pub')}): {'VERIFIED' if result.ok else result.failed}"
    )
    return 0 if result.ok else 1
