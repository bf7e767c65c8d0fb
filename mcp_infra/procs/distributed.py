"""Split servers through MLX's own launcher: the ``mlx_lm_distributed`` template's argv, the
hostfile, the ranks of a running launch, a dead rank's log tail, and the per-host probe.

``mlx.launch`` starts one program on every rank (locally through bash, remotely through ssh)
and forwards their output; when a rank exits with an error it stops the others and exits. The
launcher runs in its own session like every server, so its local ranks share its process
group: one signal to the group ends every local rank, and remote ranks end with their ssh
session (a local child of the launcher, in the same group). Each rank's own command is
``python -m mcp_infra.procs.rank`` (``procs/rank.py``), which writes that rank's output to its
own log and then becomes the rank's ``mlx_lm.server``.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import time
from pathlib import Path

import psutil

from mcp_infra.contracts import (
    LOCAL_HOST,
    ClusterHost,
    DistributedConfig,
    HostProbe,
    LaunchRecord,
    Manifest,
    ProcessRecord,
    RankRecord,
    Recipe,
    Variant,
)
from mcp_infra.core.distributed import (
    SAME_PACKAGES,
    backend_of,
    host_checks,
    hostfile,
    place_ranks,
    split_of,
)
from mcp_infra.core.preflight import Check
from mcp_infra.procs.identity import is_alive
from mcp_infra.state.hostfacts import folder_fingerprint, installed_version
from mcp_infra.state.store import write_bytes_atomic

RANK_MODULE = "mcp_infra.procs.rank"
RANK_ENV_PREFIXES = ("MLX_", "HF_HUB_", "PYTHON", "LD_PRELOAD", "OMP_")


def launcher_script(python: str) -> str:
    """``mlx.launch``, the console script installed beside the interpreter (run by that
    interpreter, so its shebang does not matter)."""
    return str(Path(python).parent / "mlx.launch")


def distributed_argv(server: list[str], python: str, launch: LaunchRecord) -> list[str]:
    """mlx.launch around one rank's ``mlx_lm.server`` argv (``server``), every rank's output
    to its own log. Pure: the same inputs give the same list."""
    rank = [python, "-m", RANK_MODULE, "--log-dir", launch.log_dir, "--", *server]
    if launch.split == "pipeline":
        rank.append("--pipeline")
    argv = [python, launcher_script(python), "--backend", launch.backend]
    argv += ["--hostfile", launch.hostfile]
    if launch.ring_port is not None:
        argv += ["--starting-port", str(launch.ring_port)]
    return [*argv, "--", *rank]


def free_port_run(count: int, tries: int = 50) -> int:
    """A first port of ``count`` consecutive free ports on 127.0.0.1 (the ring backend's local
    ranks listen on starting port + rank)."""
    for _ in range(tries):
        with socket.socket() as sock:
            sock.bind((LOCAL_HOST, 0))
            first = int(sock.getsockname()[1])
        if first + count > 65535:
            continue
        if all(_bindable(first + i) for i in range(count)):
            return first
    raise OSError(f"no run of {count} free ports found")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((LOCAL_HOST, port))
        except OSError:
            return False
    return True


def plan_launch(recipe: Recipe, hosts: list[ClusterHost], log_path: Path) -> LaunchRecord:
    """Place the ranks on the configured hosts, write the hostfile beside the log, pick the
    ring's ports: what ``distributed_argv`` needs."""
    knobs = recipe.knobs
    placed = place_ranks(hosts, knobs.ranks or 0)
    backend = backend_of(knobs)
    data = hostfile(placed, backend)
    path = log_path.with_name(f"{log_path.stem}.hosts.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, (json.dumps(data, indent=2) + "\n").encode())  # mlx.launch's format
    log_dir = log_path.with_name(f"{log_path.stem}.ranks")
    log_dir.mkdir(parents=True, exist_ok=True)  # local ranks log here (procs/rank.py)
    return LaunchRecord(
        backend=backend,  # type: ignore[arg-type]
        split=split_of(knobs),  # type: ignore[arg-type]
        hosts=[h.name for h in placed],
        ring_port=free_port_run(len(placed)),
        hostfile=str(path),
        log_dir=str(log_dir),
    )


def rank_log(launch: LaunchRecord, rank: int) -> Path:
    return Path(launch.log_dir) / f"rank-{rank}.log"


def _rank_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(RANK_ENV_PREFIXES)}


def find_ranks(record: ProcessRecord, timeout: float = 10.0) -> list[RankRecord]:
    """The ranks of a running launch: local ones by their process (a child of the launcher
    with ``MLX_RANK`` in its environment, after the rank wrapper's exec), remote ones by host."""
    launch = record.launch
    if launch is None:
        return []
    local = {i for i, name in enumerate(launch.hosts) if _is_local_name(launch, name)}
    found: dict[int, RankRecord] = {}
    deadline = time.monotonic() + timeout
    while True:
        try:
            children = psutil.Process(record.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        for proc in children:
            try:
                env = proc.environ()
                if RANK_MODULE in proc.cmdline() or "MLX_RANK" not in env:
                    continue
                rank = int(env["MLX_RANK"])
                found[rank] = RankRecord(
                    rank=rank,
                    host=launch.hosts[rank],
                    pid=proc.pid,
                    create_time=proc.create_time(),
                    log_path=str(rank_log(launch, rank)),
                    env=_rank_env(env),
                )
            except (psutil.Error, ValueError, IndexError):
                continue
        if local <= set(found) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for rank, name in enumerate(launch.hosts):
        if rank not in found:
            found[rank] = RankRecord(rank=rank, host=name, env={"MLX_RANK": str(rank)})
    return [found[r] for r in sorted(found)]


def _is_local_name(launch: LaunchRecord, name: str) -> bool:
    """Is the host named ``name`` this machine, by the hostfile written for the launch?"""
    try:
        data = json.loads(Path(launch.hostfile).read_text())
        return any(
            entry["ssh"] == LOCAL_HOST
            for entry, host in zip(data["hosts"], launch.hosts, strict=False)
            if host == name
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


_NODE_LINE = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|(was killed))")


def dead_rank(launcher_log: str) -> tuple[int, str] | None:
    """The first rank mlx.launch reported as failed, and how, from its log text (it reports
    the rank that failed first, then the ranks it stopped because of it)."""
    for match in _NODE_LINE.finditer(launcher_log):
        rank, code, killed = match.groups()
        if killed:
            return int(rank), "was killed"
        if code is not None and code != "0":
            return int(rank), f"exited with code {code}"
    return None


def _tail(path: Path, limit: int) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()


def launch_log_tail(record: ProcessRecord, limit: int = 600) -> str:
    """Why a split server failed: the rank that died first, with its own log tail; else each
    rank's tail and the launcher's."""
    launch = record.launch
    if launch is None:
        return _tail(Path(record.log_path), limit)
    launcher = _tail(Path(record.log_path), 20_000)
    dead = dead_rank(launcher)
    deadline = time.monotonic() + LAUNCHER_REPORT_S
    while dead is None and record_gone(record) and time.monotonic() < deadline:
        time.sleep(0.1)  # a rank is gone: mlx.launch reports its exit code in a moment
        launcher = _tail(Path(record.log_path), 20_000)
        dead = dead_rank(launcher)
    if dead is None:
        for rank in launch.ranks:
            if rank.pid is not None and not _alive(rank):
                dead = (rank.rank, "is gone")
                break
    if dead is not None:
        index, how = dead
        host = launch.hosts[index] if index < len(launch.hosts) else "?"
        tail = _tail(rank_log(launch, index), limit) or (
            f"(none of its own here; the launcher's) {launcher[-limit:]}"
        )
        return f"rank {index} on host {host} {how}; its log tail: {tail}"
    parts = [
        f"rank {i}: {_tail(rank_log(launch, i), limit // 2) or '(empty)'}"
        for i in range(len(launch.hosts))
    ]
    return "; ".join([*parts, f"launcher: {launcher[-limit // 2 :]}"])


LAUNCHER_REPORT_S = 3.0


def record_gone(record: ProcessRecord) -> bool:
    """Some recorded local rank of the launch no longer runs."""
    return record.launch is not None and any(
        r.pid is not None and not _alive(r) for r in record.launch.ranks
    )


def _alive(rank: RankRecord) -> bool:
    if rank.pid is None or rank.create_time is None:
        return False
    return is_alive(rank.pid, rank.create_time)


def live_ranks(record: ProcessRecord) -> list[RankRecord]:
    """The recorded local ranks still running (same pid and start time)."""
    return [r for r in record.launch.ranks if _alive(r)] if record.launch else []


# ---------------------------------------------------------------------------------------------
# Probing the configured hosts (preflight)
# ---------------------------------------------------------------------------------------------


def probe_here(paths: list[str]) -> HostProbe:
    """This machine: the packages that must match and the fingerprints of ``paths``."""
    return HostProbe(
        name="control-plane",
        ssh=LOCAL_HOST,
        reachable=True,
        detail="this machine",
        packages={p: v for p in SAME_PACKAGES if (v := installed_version(p))},
        models={p: folder_fingerprint(Path(p)) for p in paths},
        memory_gb=round(psutil.virtual_memory().total / 2**30, 2),
    )


def reach(host: ClusterHost, timeout: float) -> str | None:
    """None if the host accepts a TCP connection on its ssh port within ``timeout``; else why."""
    try:
        with socket.create_connection((host.ssh, host.ssh_port), timeout=timeout):
            return None
    except OSError as exc:
        return f"unreachable at {host.ssh}:{host.ssh_port} ({exc.strerror or exc})"


def probe_host(host: ClusterHost, paths: list[str], python: str, timeout: float) -> HostProbe:
    """One configured host as preflight sees it. This machine is probed in-process; another is
    first checked for reachability (its ssh port, bounded by ``timeout``), then asked through
    ``ssh`` for the same facts by the rank module (``--probe``)."""
    if host.local:
        return probe_here(paths).model_copy(update={"name": host.name})
    why = reach(host, timeout)
    if why is not None:
        return HostProbe(name=host.name, ssh=host.ssh, reachable=False, detail=why)
    remote = [python, "-m", RANK_MODULE, "--probe", *paths]
    argv = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={max(1, int(timeout))}",
        "-p",
        str(host.ssh_port),
        host.ssh,
        shlex.join(remote),  # ssh hands one command line to the remote shell: quoted here
    ]
    try:
        done = subprocess.run(  # argv list, never a local shell
            argv, capture_output=True, text=True, timeout=timeout + 120, check=False
        )
        facts = HostProbe.model_validate_json(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return HostProbe(
            name=host.name,
            ssh=host.ssh,
            reachable=False,
            detail=f"reachable, but the probe over ssh failed ({type(exc).__name__})",
        )
    return facts.model_copy(
        update={"name": host.name, "ssh": host.ssh, "detail": f"answered over ssh ({host.ssh})"}
    )


def probe_hosts(
    config: DistributedConfig, names: set[str], paths: list[str], python: str
) -> dict[str, HostProbe]:
    return {
        h.name: probe_host(h, paths, python, config.reach_timeout_s)
        for h in config.hosts
        if h.name in names
    }


def preflight_hosts(
    config: DistributedConfig,
    manifest: Manifest,
    variant: Variant,
    recipe: Recipe,
    budget_fraction: float,
    python: str,
) -> tuple[list[Check], list[HostProbe]]:
    """The per-host checks of a split candidate (``core.distributed.host_checks``) over the
    configured hosts its ranks are placed on, probed now; with the probes, for the evidence."""
    paths = [p for p in (recipe.model_path,) if p]
    control = probe_here(paths)
    try:
        names = {h.name for h in place_ranks(config.hosts, variant.knobs.ranks or 0)}
    except ValueError:
        names = set()
    probes = probe_hosts(config, names, paths, python)
    checks = host_checks(manifest, variant, config.hosts, probes, control, budget_fraction)
    return checks, [control, *probes.values()]
