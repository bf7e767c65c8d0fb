"""Split recipes, pure: which configured host runs each rank, the hostfile mlx.launch reads,
and the per-host preflight (reachable, same packages as the control plane, the same model
files, memory admitted per host).

Hosts come only from the home's configuration (``ServiceConfig.distributed``); a manifest says
how many ranks, which backend and which split, a plan only names the candidate. So nothing here
takes a host from anything but a ``ClusterHost`` the config validated.
"""

from __future__ import annotations

from typing import Any

from mcp_infra.contracts import ClusterHost, HostProbe, Knobs, Manifest, Variant
from mcp_infra.core.preflight import Check

# What must equal the control plane's on every host that runs a rank.
SAME_PACKAGES = ("mlx", "mlx-lm", "mcp-infra")


class PlacementError(ValueError):
    """The configured hosts cannot run the asked number of ranks."""


def backend_of(knobs: Knobs) -> str:
    return knobs.backend or "ring"


def split_of(knobs: Knobs) -> str:
    return knobs.split or "tensor"


def place_ranks(hosts: list[ClusterHost], ranks: int) -> list[ClusterHost]:
    """Rank i's host: the configured hosts in order, each filled up to its slots."""
    placed = [h for h in hosts for _ in range(h.slots)][:ranks]
    if len(placed) < ranks:
        slots = sum(h.slots for h in hosts)
        raise PlacementError(
            f"{ranks} ranks asked; the configured hosts "
            f"({', '.join(h.name for h in hosts)}) have {slots} slot(s)"
        )
    return placed


def local_ranks(hosts: list[ClusterHost], ranks: int) -> int:
    """How many of the ranks run on this machine (the rest on other hosts)."""
    return sum(1 for h in place_ranks(hosts, ranks) if h.local)


def hostfile(placed: list[ClusterHost], backend: str) -> dict[str, Any]:
    """The JSON hostfile of ``mlx.launch --hostfile``: one entry per rank, in rank order."""
    entries = []
    for host in placed:
        ips = host.ring_ips()
        if backend in ("ring", "jaccl") and not ips:
            raise PlacementError(
                f"host {host.name}: the {backend} backend needs an IP address (set ips)"
            )
        entry: dict[str, Any] = {"ssh": host.ssh, "ips": ips}
        if backend == "jaccl":
            if len(host.rdma) != len(placed):
                raise PlacementError(
                    f"host {host.name}: jaccl needs one RDMA device per rank ({len(placed)}), "
                    f"{len(host.rdma)} configured"
                )
            entry["rdma"] = list(host.rdma)
        entries.append(entry)
    return {"backend": backend, "envs": [], "hosts": entries}


def ranks_per_host(placed: list[ClusterHost]) -> dict[str, int]:
    out: dict[str, int] = {}
    for host in placed:
        out[host.name] = out.get(host.name, 0) + 1
    return out


def admit_hosts(
    placed: list[ClusterHost],
    per_rank_gb: float,
    memory_gb: dict[str, float | None],
    budget_fraction: float,
) -> list[Check]:
    """Memory admission per host: the ranks it runs times one rank's stated need must fit its
    share of the host's memory. An unknown memory cannot prove a fit, so it fails."""
    checks = []
    for name, count in ranks_per_host(placed).items():
        need = count * per_rank_gb
        have = memory_gb.get(name)
        if have is None:
            checks.append(
                Check(
                    name=f"memory:{name}",
                    passed=False,
                    detail=f"host {name}: its memory is unknown (the probe did not read it)",
                )
            )
            continue
        budget = have * budget_fraction
        ok = need <= budget
        words = (
            f"host {name}: {count} rank(s) x {per_rank_gb:g} GB = {need:g} GB "
            f"{'fits' if ok else 'exceeds'} {budget:.1f} GB "
            f"({budget_fraction:.0%} of {have:.1f} GB)"
        )
        checks.append(Check(name=f"memory:{name}", passed=ok, detail=words))
    return checks


def host_checks(
    manifest: Manifest,
    variant: Variant,
    hosts: list[ClusterHost],
    probes: dict[str, HostProbe],
    control: HostProbe,
    budget_fraction: float,
) -> list[Check]:
    """Every per-host check of a split candidate: placement, then for each host that runs a
    rank: reachable as configured, the same package versions as the control plane, the same
    model files (by fingerprint, at the same path), and memory admitted on it."""
    ranks = variant.knobs.ranks or 0
    try:
        placed = place_ranks(hosts, ranks)
        hostfile(placed, backend_of(variant.knobs))
    except PlacementError as exc:
        return [Check(name="placement", passed=False, detail=str(exc))]
    checks = [
        Check(
            name="placement",
            passed=True,
            detail=", ".join(f"rank {i} on {h.name}" for i, h in enumerate(placed))
            + f" ({backend_of(variant.knobs)}, {split_of(variant.knobs)} parallel)",
        )
    ]
    memory: dict[str, float | None] = {}
    for name in ranks_per_host(placed):
        probe = probes.get(name)
        if probe is None or not probe.reachable:
            why = probe.detail if probe else "not probed"
            checks.append(
                Check(name=f"reachable:{name}", passed=False, detail=f"host {name}: {why}")
            )
            continue
        checks.append(
            Check(name=f"reachable:{name}", passed=True, detail=f"host {name}: {probe.detail}")
        )
        differ = [
            f"{p} {probe.packages.get(p, 'missing')} (control plane {control.packages.get(p)})"
            for p in SAME_PACKAGES
            if probe.packages.get(p) != control.packages.get(p)
        ]
        checks.append(
            Check(
                name=f"versions:{name}",
                passed=not differ,
                detail=f"host {name}: "
                + (
                    "differs: " + "; ".join(differ)
                    if differ
                    else ", ".join(f"{p} {control.packages.get(p)}" for p in SAME_PACKAGES)
                    + " as on the control plane"
                ),
            )
        )
        models = []
        for path, expected in sorted(control.models.items()):
            found = probe.models.get(path, "missing")
            if found != expected:
                models.append(f"{path}: {found[:24]} (control plane {expected[:24]})")
        checks.append(
            Check(
                name=f"models:{name}",
                passed=not models,
                detail=f"host {name}: "
                + ("; ".join(models) if models else "model files present with the same hashes"),
            )
        )
        memory[name] = probe.memory_gb
    reached = [h for h in placed if h.name in memory]
    checks += admit_hosts(reached, manifest.resources.memory_gb, memory, budget_fraction)
    return checks
