"""The renderer's shared words: the bound on a text, plain words for the statistics, each
divergence once, cost and service figures, and who can fix an error."""

from __future__ import annotations

import json
import re
from typing import Any

from mcp_infra.contracts import CycleCost, PlanCost
from mcp_infra.flows import api as app

MAX_TEXT = 12_000


EXCERPT = 300  # the most of anyone's input a text shows back


def excerpt(text: str, limit: int = EXCERPT) -> str:
    """At most ``limit`` characters of a text (an input quoted back), on one line."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def bounded(lines: list[str]) -> str:
    text = "\n".join(lines)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT].rsplit("\n", 1)[0] + "\n… (cut; the structured content is complete)"
    return text


def runtime_line(view: app.RuntimeView) -> str:
    """Installed against pinned, where it is built (or would be) and its size."""
    versions = "; ".join(
        f"{name} {view.installed[name]} installed, {version} pinned"
        for name, version in view.pinned.items()
    )
    size = (
        f"{view.size_bytes / 1e6:.1f} MB {view.size_basis}"
        if view.size_bytes is not None
        else "size unknown"
    )
    where = "built in" if view.built else "would be built in"
    broken = f"; DIFFERS FROM ITS LOCK: {'; '.join(view.problems[:2])}" if view.problems else ""
    return f"{versions} ({view.site} site); {where} {view.path} ({size}){broken}"


def generic(line: str, candidate_id: str) -> str:
    """A check's line with the candidate's own id replaced, so variants' lines compare."""
    return line.replace(candidate_id, "{id}")


def cost_line(cost: PlanCost | None) -> str | None:
    """A plan's projected cost in one sentence (None when there is none)."""
    if cost is None:
        return None
    if cost.basis not in ("this-home", "live-service") or cost.minutes is None:
        down = (
            "the service is down while candidates run (exclusive), for how long cannot be "
            "projected yet"
            if cost.mode == "exclusive"
            else "0 s unserved (concurrent)"
        )
        return f"projected cost {cost.basis}: {cost.why}; {down}." + (
            f" HELD: {cost.held}." if cost.held else ""
        )
    split = (
        f": screening {cost.screening_minutes:.1f} min, deciding {cost.deciding_minutes:.1f}"
        if cost.screening_minutes is not None and cost.deciding_minutes is not None
        else ""
    )
    dropped = (
        f"; screening drops {', '.join(cost.screened_out)} in at least one seed"
        if cost.screened_out
        else ""
    )
    text = (
        f"projected on this machine {cost.minutes:.1f} min{split} (up to "
        f"{cost.minutes_high:.1f}, {cost.seeds} seeds), {cost.rounds} round(s), {cost.requests} "
        f"requests, {(cost.unserved_s or 0.0) / 60:.1f} min unserved ({cost.mode}){dropped}; from "
        + (
            f"{', '.join(cost.source[:1])}."
            if cost.basis == "this-home"
            else "the live service measured at BASELINE, every candidate as fast as it."
        )
    )
    if cost.answers_kept:
        text += " The baseline's greedy outputs are kept from an earlier cycle: not asked again."
    return text + (f" HELD: {cost.held}." if cost.held else "")


def short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


# ---------------------------------------------------------------------------------------------
# Plain words for the statistics, and each divergence stated once. The selector's reasons are
# recorded in the verdict as they are (section=verdict shows them, and `evidence verify`
# recomputes them); these texts say the same in words a reader does not have to decode. The
# method: docs/statistics.md.
# ---------------------------------------------------------------------------------------------

METHOD = "how these figures are decided: docs/statistics.md (in the mcp-infra source)"

_SPEED = re.compile(
    r"speedup (?P<e>\d+\.\d+x) \((?P<level>\d+(?:\.\d+)?%) interval"
    r"(?:, (?P<look>\d+(?:\.\d+)?%) at this look of early stopping)? "
    r"(?P<lo>\d+\.\d+x) to (?P<hi>\d+\.\d+x)"
    r"(?:, (?P<b>\d+) baseline and (?P<c>\d+) candidate start\(s\))?\)"
    r"(?: against the required (?P<t>\d+\.\d+x))?"
)
_FLOOR = re.compile(r"A/A noise floor (\d+\.\d+x)")


def _speed_words(m: re.Match[str]) -> str:
    sure = m["look"] or m["level"]
    starts = f" over {m['b']} baseline and {m['c']} candidate server start(s)" if m["b"] else ""
    need = f"; at least {m['t']} was needed" if m["t"] else ""
    return (
        f"{m['e']} the baseline's speed, likely between {m['lo']} and {m['hi']} "
        f"({sure} sure{starts}){need}"
    )


def plain(reason: str) -> str:
    """A selector's reason in plain words: "speedup 1.689x (95% interval, 95.5% at this look
    of early stopping 1.312x to 2.175x, ...)" becomes "1.689x the baseline's speed, likely
    between 1.312x and 2.175x (95.5% sure, ...)"; the A/A noise floor becomes what the
    baseline shows against itself; each divergence is stated once."""
    text = _SPEED.sub(_speed_words, reason)
    text = _FLOOR.sub(r"more than the \1 the baseline shows against itself (its noise)", text)
    return divergences_once(text)


_DIVERGES = re.compile(
    r"(?P<prompt>[\w.-]+)(?P<again> \(asked again, prefix cached\))? diverges at token "
    r"(?P<at>\d+) \(baseline [^\[]*\[(?P<b>\d+)\][^)]*vs candidate [^\[]*\[(?P<c>\d+)\][^)]*\)"
)
MAX_DIVERGENCES = 3


def divergences_once(text: str, cap: int | None = MAX_DIVERGENCES) -> str:
    """A greedy output asked again that diverges where it did the first time is one
    divergence ("…, the same when asked again"); past ``cap``, the rest are counted."""
    parts = text.split("; ")
    out: list[str] = []
    seen: dict[tuple[str, str, str, str], int] = {}
    shown = hidden = 0
    for part in parts:
        m = _DIVERGES.fullmatch(part.rstrip("."))
        if m is None:
            out.append(part)
            continue
        key = (m["prompt"], m["at"], m["b"], m["c"])
        if m["again"] and key in seen:
            if seen[key] >= 0:
                out[seen[key]] += ", the same when asked again"
            continue
        if cap is not None and shown >= cap:
            hidden += 1
            seen[key] = -1
            continue
        seen[key] = len(out)
        out.append(part.rstrip("."))
        shown += 1
    if hidden:
        out.append(f"and {hidden} more divergence(s) (section=gates lists them)")
    joined = "; ".join(out)
    return joined if joined.endswith(".") or not text.endswith(".") else joined + "."


def service_text(impact: Any) -> str:
    """What the stable endpoint's clients saw, in one line: the one downtime figure of a cycle
    (the front counts every request, so it is what clients saw; restart windows are not)."""

    def known(value: Any, unit: str = "") -> str:
        return f"{value}{unit}" if value is not None else "not counted"

    return (
        f"service during the cycle ({impact.mode} mode): time the stable port did not serve "
        f"{known(impact.unserved_s, ' s')}; {known(impact.live_requests)} client request(s), "
        f"{known(impact.requests_held)} held (longest {known(impact.longest_hold_s, ' s')}), "
        f"{known(impact.rejected_503)} answered 503"
    )


def cost_text(cost: CycleCost | None, *, service_counted: bool = False) -> str:
    """What the cycle cost. Servers are grouped by configuration and role (one line each, not
    one per start); with ``service_counted`` the stable port's downtime is left to the service
    line (one downtime figure per summary)."""
    if cost is None:
        return "cost: not recorded in this bundle"
    lines = [
        f"cost: {cost.wall_s:.1f} s wall; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in cost.phases_s.items() if v >= 0.05)
    ]
    if cost.projected is not None:
        lines.append(f"    before it ran: {cost_line(cost.projected)}")
    if cost.supervisor_cpu_s is not None:
        lines.append(f"    supervisor CPU {cost.supervisor_cpu_s:.1f} s")
    groups: dict[tuple[str, str], list[Any]] = {}
    for server in cost.servers:
        groups.setdefault((server.label, server.role), []).append(server)
    for (label, role), servers in groups.items():
        peaks = [s.peak_rss_gb for s in servers if s.peak_rss_gb is not None]
        peak = f", peak {max(peaks):.2f} GB" if peaks else ""
        starts = f"{len(servers)} start(s), " if len(servers) > 1 else ""
        lines.append(
            f"    {label} ({role}): {starts}CPU {sum(s.cpu_s for s in servers):.1f} s{peak}"
            + (f" — {servers[0].note}" if len(servers) == 1 else "")
        )
    if not service_counted:
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


# ---------------------------------------------------------------------------------------------
# What the MCP server says about itself, who can fix an error, following a cycle
# ---------------------------------------------------------------------------------------------

CONFIGURE = (
    "`mcp-infra prepare CANDIDATE --init-service` (a registry candidate's model becomes the "
    "live service) or `mcp-infra demo` (the tiny demo)"
)


PREPARE = (
    "make a candidate runnable on this machine: `mcp-infra prepare CANDIDATE` fetches its "
    "pinned artifacts (`mcp-infra demo` builds the demo models); `mcp-infra registry` says why "
    "each one fails preflight"
)


def agent_can_fix(message: str) -> str:
    """An error the caller can fix by changing its call."""
    return f"{message.rstrip('. ')}. You can fix this: change the call and try again."


def person_must(message: str, action: str) -> str:
    """An error only a person can fix: what they do; calling again does not help."""
    return f"{message.rstrip('. ')}. A person must fix this: {action}; calling again will not help."


def cannot_read_own_files(exc: BaseException) -> str:
    """A file of the home, the registry or the policies does not load (the files are the
    operator's, not the caller's)."""
    return person_must(
        f"mcp-infra cannot read its own files: {type(exc).__name__}: {str(exc)[:300]}",
        "repair or remove the file named (`mcp-infra status` in a terminal lists the problems)",
    )


def unconfigured(home: str) -> str:
    return f"no managed service is configured in this home ({home} has no config.yaml)"
