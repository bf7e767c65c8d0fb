"""Split recipes, fast: the mlx.launch argv, the hosts' configuration, rank placement, per-host
admission and preflight, a dead rank named from the launcher's log, and a plan that cannot
introduce a host. Nothing here starts a server; the one socket it opens is a refused connection
to a closed port on this machine (an unreachable configured host)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from mcp_infra.contracts import (
    ClusterHost,
    DistributedConfig,
    HostProbe,
    Knobs,
    LaunchRecord,
    Manifest,
    Plan,
    ProcessRecord,
    Recipe,
    Semantics,
)
from mcp_infra.core.distributed import (
    PlacementError,
    admit_hosts,
    host_checks,
    hostfile,
    place_ranks,
)
from mcp_infra.core.gates import split_agreement
from mcp_infra.core.sanitize import PlanRefused, parse_plan
from mcp_infra.procs.distributed import dead_rank, launch_log_tail, preflight_hosts
from mcp_infra.procs.runtime import build_argv, runs_recipe
from mcp_infra.state.catalog import load_registry
from mcp_infra.state.store import utcnow

PY = "/opt/py/bin/python"
SPLIT = "demo-split:tp2-ring"


def split_recipe(split: str = "tensor") -> Recipe:
    return Recipe(
        candidate_id=SPLIT,
        template="mlx_lm_distributed",
        model_path="/m/split-target",
        knobs=Knobs(ranks=2, backend="ring", split=split, prompt_cache_size=0),  # type: ignore[arg-type]
        semantics=Semantics.LOSSY,
    )


def launch(split: str = "tensor") -> LaunchRecord:
    return LaunchRecord(
        backend="ring",
        split=split,  # type: ignore[arg-type]
        hosts=["local", "local"],
        ring_port=40100,
        hostfile="/h/split.hosts.json",
        log_dir="/h/split.ranks",
    )


def local(slots: int = 2) -> ClusterHost:
    return ClusterHost(name="local", slots=slots)


def manifest_data(**variant: object) -> dict[str, object]:
    return {
        "id": "split",
        "title": "t",
        "class": "server_tuning",
        "semantics": "lossy",
        "runtime": {"template": "mlx_lm_distributed", "platforms": ["linux-x86_64"]},
        "target": {"role": "target", "demo": "split-target"},
        "resources": {"memory_gb": 4},
        "variants": [{"id": "tp2", "knobs": {"ranks": 2}, **variant}],
    }


# --- the template --------------------------------------------------------------------------


def test_a_split_recipe_is_mlx_launch_around_one_ranks_server() -> None:
    argv = build_argv(split_recipe(), 8123, python=PY, launch=launch())
    assert argv == [
        PY,
        "/opt/py/bin/mlx.launch",
        "--backend",
        "ring",
        "--hostfile",
        "/h/split.hosts.json",
        "--starting-port",
        "40100",
        "--",
        PY,
        "-m",
        "mcp_infra.procs.rank",
        "--log-dir",
        "/h/split.ranks",
        "--",
        PY,
        "-m",
        "mlx_lm",
        "server",
        "--model",
        "/m/split-target",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--prompt-cache-size",
        "0",
    ]
    piped = build_argv(split_recipe("pipeline"), 8123, python=PY, launch=launch("pipeline"))
    assert piped[-1] == "--pipeline" and piped.count("--pipeline") == 1
    with pytest.raises(ValueError, match="not placed for this recipe"):
        build_argv(split_recipe("pipeline"), 8123, python=PY, launch=launch("tensor"))


def test_the_template_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="placed launch"):
        build_argv(split_recipe(), 8123, python=PY)
    plain = split_recipe().model_copy(update={"template": "mlx_lm_server"})
    with pytest.raises(ValueError, match="mlx_lm_distributed"):
        build_argv(plain, 8123, python=PY)
    with pytest.raises(ValueError, match="127.0.0.1"):
        build_argv(split_recipe(), 8123, host="0.0.0.0", python=PY, launch=launch())


def test_a_record_runs_its_recipe_only_with_the_same_launch() -> None:
    recipe = split_recipe()
    argv = build_argv(recipe, 8123, python=PY, launch=launch())
    record = ProcessRecord(
        role="candidate",
        pid=1,
        pgid=1,
        create_time=0.0,
        argv=argv,
        host="127.0.0.1",
        port=8123,
        log_path="/h/split.log",
        candidate_id=SPLIT,
        started_at=utcnow(),
        launch=launch(),
    )
    assert runs_recipe(record, recipe)
    other = recipe.model_copy(
        update={"knobs": recipe.knobs.model_copy(update={"split": "pipeline"})}
    )
    assert not runs_recipe(record, other)
    assert not runs_recipe(record.model_copy(update={"launch": None}), recipe)


def test_split_knobs_are_typed_and_refuse_what_mlx_lm_refuses() -> None:
    with pytest.raises(ValidationError, match="need ranks"):
        Knobs(backend="ring")
    with pytest.raises(ValidationError, match="draft"):
        Knobs(ranks=2, draft=True)
    with pytest.raises(ValidationError):
        Knobs(ranks=1)
    with pytest.raises(ValidationError):
        Knobs.model_validate({"ranks": 2, "backend": "tcp"})
    with pytest.raises(ValidationError, match="extra"):
        Knobs.model_validate({"ranks": 2, "hosts": ["10.0.0.5"]})


def test_a_split_manifest_is_lossy_and_every_variant_has_ranks() -> None:
    Manifest.model_validate(manifest_data())
    with pytest.raises(ValidationError, match="semantics must be lossy"):
        Manifest.model_validate(manifest_data(semantics="lossless"))
    with pytest.raises(ValidationError, match="ranks is set exactly"):
        Manifest.model_validate({**manifest_data(), "variants": [{"id": "one", "knobs": {}}]})
    shipped = load_registry()["demo-split"]
    (variant,) = shipped.variants
    assert variant.knobs.ranks == 2 and variant.knobs.backend == "ring"
    assert shipped.semantics_of(variant) == Semantics.LOSSY


# --- hosts: only from the home's configuration -------------------------------------------


def test_a_plan_cannot_introduce_a_host() -> None:
    for raw in (
        {"hypothesis": "h", "candidates": [SPLIT], "hosts": ["10.0.0.5"]},
        {"hypothesis": "h", "candidates": [SPLIT], "knobs": {"ranks": 4}},
        {"hypothesis": "h", "candidates": [SPLIT], "acceptance": {"hosts": ["mac-b"]}},
    ):
        with pytest.raises(PlanRefused):
            parse_plan(raw)
    assert set(Plan.model_fields) == {"hypothesis", "candidates", "acceptance", "notes"}
    assert "host" not in " ".join(Recipe.model_fields) and "hosts" not in Knobs.model_fields


def test_the_hosts_configuration_is_validated() -> None:
    assert DistributedConfig().hosts == [ClusterHost(name="local", slots=2)]
    with pytest.raises(ValidationError, match="unique"):
        DistributedConfig(hosts=[local(), local()])
    with pytest.raises(ValidationError):
        ClusterHost(name="b", ssh="-oProxyCommand=touch /tmp/x")  # never an ssh option
    with pytest.raises(ValidationError):
        ClusterHost(name="b", ssh="mac-b.local", ips=["not-an-address"])
    with pytest.raises(ValidationError):
        ClusterHost(name="Bad Name")
    assert ClusterHost(name="b", ssh="192.168.1.20").ring_ips() == ["192.168.1.20"]
    assert ClusterHost(name="b", ssh="mac-b.local").ring_ips() == []


def test_ranks_fill_the_configured_hosts_in_order() -> None:
    a = ClusterHost(name="a", ssh="192.168.1.10", slots=1)
    b = ClusterHost(name="b", ssh="192.168.1.11", slots=2)
    assert [h.name for h in place_ranks([a, b], 3)] == ["a", "b", "b"]
    assert [h.name for h in place_ranks([local()], 2)] == ["local", "local"]
    with pytest.raises(PlacementError, match=r"4 ranks asked; .*\(a, b\) have 3 slot"):
        place_ranks([a, b], 4)
    data = hostfile(place_ranks([a, b], 2), "ring")
    assert data == {
        "backend": "ring",
        "envs": [],
        "hosts": [
            {"ssh": "192.168.1.10", "ips": ["192.168.1.10"]},
            {"ssh": "192.168.1.11", "ips": ["192.168.1.11"]},
        ],
    }
    with pytest.raises(PlacementError, match="needs an IP"):
        hostfile([ClusterHost(name="c", ssh="mac-c.local")], "ring")
    with pytest.raises(PlacementError, match="one RDMA device per rank"):
        hostfile([a, b], "jaccl")
    rdma = [
        a.model_copy(update={"rdma": [None, "rdma_en3"]}),
        b.model_copy(update={"rdma": ["rdma_en3", None], "slots": 1}),
    ]
    assert [h["rdma"] for h in hostfile(rdma, "jaccl")["hosts"]] == [
        [None, "rdma_en3"],
        ["rdma_en3", None],
    ]


def test_memory_is_admitted_per_host() -> None:
    a = ClusterHost(name="a", ssh="192.168.1.10", slots=1)
    b = ClusterHost(name="b", ssh="192.168.1.11", slots=2)
    placed = place_ranks([a, b], 3)
    checks = {c.name: c for c in admit_hosts(placed, 10.0, {"a": 32.0, "b": 24.0}, 0.8)}
    assert checks["memory:a"].passed, checks["memory:a"].detail
    assert "1 rank(s) x 10 GB = 10 GB fits 25.6 GB" in checks["memory:a"].detail
    assert not checks["memory:b"].passed  # two ranks on b: 20 GB > 19.2 GB
    assert "2 rank(s) x 10 GB = 20 GB exceeds 19.2 GB" in checks["memory:b"].detail
    unknown = admit_hosts(placed, 10.0, {"a": 32.0, "b": None}, 0.8)
    assert [c.passed for c in unknown] == [True, False]
    assert "memory is unknown" in unknown[1].detail


def probe(name: str, **update: object) -> HostProbe:
    base = HostProbe(
        name=name,
        ssh="192.168.1.11",
        reachable=True,
        detail="answered over ssh",
        packages={"mlx": "0.32.4", "mlx-lm": "0.32.2", "mcp-infra": "0.1.0"},
        models={"/m/split-target": "sha256:aa"},
        memory_gb=64.0,
    )
    return base.model_copy(update=update)


def test_every_host_must_match_the_control_plane() -> None:
    manifest = Manifest.model_validate(manifest_data())
    variant = manifest.variants[0]
    hosts = [ClusterHost(name="a", slots=1), ClusterHost(name="b", ssh="192.168.1.11")]
    control = probe("control-plane")
    good = {
        c.name: c
        for c in host_checks(
            manifest, variant, hosts, {"a": probe("a"), "b": probe("b")}, control, 0.8
        )
    }
    assert all(c.passed for c in good.values()), [c.detail for c in good.values()]
    assert good["placement"].detail.startswith("rank 0 on a, rank 1 on b (ring, tensor")
    bad = host_checks(
        manifest,
        variant,
        hosts,
        {
            "a": probe("a"),
            "b": probe(
                "b",
                packages={"mlx": "0.31.0", "mlx-lm": "0.32.2", "mcp-infra": "0.1.0"},
                models={"/m/split-target": "sha256:bb"},
            ),
        },
        control,
        0.8,
    )
    failed = {c.name: c.detail for c in bad if not c.passed}
    assert set(failed) == {"versions:b", "models:b"}
    assert "mlx 0.31.0 (control plane 0.32.4)" in failed["versions:b"]
    assert "/m/split-target: sha256:bb (control plane sha256:aa)" in failed["models:b"]


def closed_port() -> int:
    """A port nothing listens on at ::1 (on a machine without IPv6 every connection to ::1
    fails at once anyway)."""
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
            return int(sock.getsockname()[1])
    except OSError:
        return 9


def test_an_unreachable_configured_host_fails_preflight_by_name(tmp_path: Path) -> None:
    """A host at this machine's own IPv6 loopback, spelled out (so it counts as another host
    that mlx.launch would reach over ssh), on a port nothing listens on: refused at once."""
    model = tmp_path / "split-target"
    model.mkdir()
    (model / "config.json").write_text("{}")
    config = DistributedConfig(
        hosts=[
            ClusterHost(name="local", slots=1),
            ClusterHost(name="mac-b", ssh="0:0:0:0:0:0:0:1", ssh_port=closed_port()),
        ],
        reach_timeout_s=2.0,
    )
    manifest = Manifest.model_validate(manifest_data())
    recipe = split_recipe().model_copy(update={"model_path": str(model)})
    checks, probes = preflight_hosts(
        config, manifest, manifest.variants[0], recipe, 0.8, sys.executable
    )
    failed = {c.name: c.detail for c in checks if not c.passed}
    assert list(failed) == ["reachable:mac-b"], failed
    assert failed["reachable:mac-b"].startswith("host mac-b: unreachable at 0:0:0:0:0:0:0:1:")
    passed = {c.name for c in checks if c.passed}
    assert {"placement", "reachable:local", "versions:local", "models:local"} <= passed
    assert {p.name: p.reachable for p in probes} == {
        "control-plane": True,
        "local": True,
        "mac-b": False,
    }


# --- a dead rank, and the gate of a split ---------------------------------------------------


def test_the_rank_that_died_first_is_named_with_its_own_log(tmp_path: Path) -> None:
    log = "\n".join(
        [
            "2026-12-01 16:20:33,329 - INFO - Prompt processing progress: 18/18",
            "\x1b[33m[WARN] Node with rank 1 exited with code -9 \x1b[0m",
            "\x1b[33m[WARN] Node with rank 0 exited with code -15 \x1b[0m",
        ]
    )
    assert dead_rank(log) == (1, "exited with code -9")
    assert dead_rank("[WARN] Node with rank 0 was killed") == (0, "was killed")
    assert dead_rank("Node with rank 0 completed") is None
    ranks = tmp_path / "split.ranks"
    ranks.mkdir()
    (ranks / "rank-1.log").write_text("loading shard 1\nKilled\n")
    (tmp_path / "split.log").write_text(log)
    record = ProcessRecord(
        role="candidate",
        pid=1,
        pgid=1,
        create_time=0.0,
        argv=[PY],
        host="127.0.0.1",
        port=8123,
        log_path=str(tmp_path / "split.log"),
        candidate_id=SPLIT,
        started_at=utcnow(),
        launch=launch().model_copy(update={"log_dir": str(ranks)}),
    )
    assert launch_log_tail(record) == (
        "rank 1 on host local exited with code -9; its log tail: loading shard 1\nKilled"
    )


def test_a_split_reports_the_lossless_comparison_and_is_judged_lossy() -> None:
    from mcp_infra.contracts import Sample

    def greedy(ids: list[int], who: str) -> Sample:
        return Sample(candidate=who, prompt_id="p1", repeat=0, token_ids=ids, text="x")

    gate = split_agreement([greedy([1, 2, 3], "b")], [greedy([1, 2, 4], "c")], 0.0, 2)
    assert gate.gate == "agreement" and gate.passed  # judged by the lossy rule
    assert gate.detail.startswith("split over 2 ranks, judged as lossy; lossless comparison: ")
    assert "p1 diverges at token 2" in gate.detail
    assert gate.comparisons[0].first_divergence == 2
    strict = split_agreement([greedy([1, 2, 3], "b")], [greedy([1, 2, 4], "c")], 1.0, 2)
    assert not strict.passed


def test_ranks_left_by_a_launcher_killed_alone_are_stopped_by_its_group(tmp_path: Path) -> None:
    """A real process group stands in for a launch (a leader in its own session and one child;
    no mlx server in the fast tier): the leader is SIGKILLed alone, like a launcher, and
    ``stop_server`` still ends the child it left in the group."""
    import signal
    import subprocess

    import psutil

    from mcp_infra.procs.runtime import stop_server

    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "c = subprocess.Popen(['sleep', '60']); print(c.pid, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert leader.stdout is not None
    child = psutil.Process(int(leader.stdout.readline()))
    record = ProcessRecord(
        role="candidate",
        pid=leader.pid,
        pgid=leader.pid,
        create_time=psutil.Process(leader.pid).create_time(),
        argv=[sys.executable],
        host="127.0.0.1",
        port=8123,
        log_path=str(tmp_path / "split.log"),
        candidate_id=SPLIT,
        started_at=utcnow(),
        launch=launch(),
    )
    leader.send_signal(signal.SIGKILL)
    leader.wait(timeout=10)
    assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    assert stop_server(record, grace=3.0) == "ranks stopped (TERM)"
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert stop_server(record, grace=1.0) == "not running"
    plain = record.model_copy(update={"launch": None})
    assert stop_server(plain, grace=1.0) == "not running"


def test_only_the_ranks_placed_here_count_against_this_machine() -> None:
    from mcp_infra.core.distributed import local_ranks

    assert local_ranks([local(2)], 2) == 2
    remote = ClusterHost(name="b", ssh="192.168.1.11", slots=3)
    assert local_ranks([local(1), remote], 4) == 1
