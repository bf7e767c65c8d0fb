"""A user's own model, end to end, through the real command line: `init --model` on a folder the
project did not build (a Llama with its own shapes, tokenizer and chat template) with a smaller
same-tokenizer model in a Hugging Face cache the test makes, `registry` with the generated
catalog and every candidate's preflight verdict, a plan over two of them run as a real cycle on
real `mlx_lm.server` processes, and `evidence verify` on its sealed bundle. Also: a server that
answers its first request with an error is reported with the runtime's own message at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mcp_infra.contracts import CycleCost, Knobs, PlanCost, Recipe, ServiceConfig
from mcp_infra.demo.homes import ONE_START, stop_home, two_free_ports, write_test_policy
from mcp_infra.flows.status import cost_sidecar
from mcp_infra.procs.runtime import ServerStartError
from mcp_infra.procs.service import start_backend
from mcp_infra.state.store import Home, read_model, write_model
from tests.helpers.ownmodels import DRAFTER, OTHER_TOKENIZER, build_model, into_hub_cache
from tests.helpers.run import Spawn

BUILD = "own-builds:q8-g64-affine-f32"
PLAN = ["own-draft-tiny-draft:k2", BUILD]


@pytest.fixture
def own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    hub = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return {
        "target": build_model(tmp_path / "mine"),
        "draft": into_hub_cache(hub, "someone/tiny-draft", DRAFTER),
        "dirs": build_model(tmp_path / "more" / "other", OTHER_TOKENIZER).parent,
    }


def test_init_registry_and_a_cycle_on_a_model_the_project_did_not_build(
    tmp_path: Path, own: dict[str, Path], spawn: Spawn
) -> None:
    home = Home(tmp_path / "home")
    # The lean demo policy, as the home's own `test`, one start a side: what is asserted is the
    # sealed bundle's proof of the build, whatever the cycle decides.
    write_test_policy(home, **ONE_START)
    port, scratch = two_free_ports()
    done = spawn.mcp_infra(
        home,
        "init",
        "--model",
        str(own["target"]),
        "--policy",
        "test",
        "--port",
        str(port),
        "--model-dir",
        str(own["dirs"]),
    )
    assert done.returncode == 0, done.stderr
    assert "catalog: 21 candidate(s)" in done.stdout
    config = read_model(home.config, ServiceConfig)
    write_model(home.config, config.model_copy(update={"scratch_port": scratch}))
    try:
        listed = spawn.mcp_infra(home, "registry", "--json")
        assert listed.returncode == 0, listed.stderr
        view = json.loads(listed.stdout)
        own_ids = {c["id"]: c for c in view["candidates"] if c["id"].startswith("own-")}
        assert len(own_ids) >= 8
        assert len({c["candidate_class"] for c in own_ids.values()}) >= 3
        assert all(
            c["checks"] and isinstance(c["preflight_passed"], bool) for c in own_ids.values()
        )
        assert all(own_ids[c]["preflight_passed"] for c in PLAN)
        refused = {k["name"] for k in own_ids["own-draft-other:k2"]["checks"] if not k["passed"]}
        assert refused == {"drafter_tokenizer"}
        prepared = spawn.mcp_infra(home, "prepare", BUILD)
        assert prepared.returncode == 0, prepared.stderr
        assert "build q8-g64-affine-f32" in prepared.stdout and "--q-bits 8" in prepared.stdout
        plan = tmp_path / "plan.json"
        plan.write_text(
            json.dumps({"hypothesis": "a drafter or no prompt cache", "candidates": PLAN})
        )
        proposed = spawn.mcp_infra(home, "propose", str(plan), "--no-supervisor", "--json")
        assert proposed.returncode == 0, proposed.stdout + proposed.stderr
        proposal = json.loads(proposed.stdout)
        assert proposal["cost"]["basis"] == "unknown", "no cycle has measured anything here yet"
        cycled = spawn.mcp_infra(home, "supervise", "--ignore-window", "--json", timeout=1200)
        assert cycled.returncode == 0, cycled.stderr
        (summary,) = json.loads(cycled.stdout)
        assert summary["outcome"] in {"promoted", "kept_baseline"}, summary
        # The first cycle priced its plan once BASELINE had measured the live service.
        first = read_model(cost_sidecar(home, proposal["plan_id"]), PlanCost)
        assert first.basis == "live-service" and first.minutes, first
        assert first.configurations == ["baseline", *PLAN]
        sealed = read_model(home.evidence / summary["cycle_id"] / "cost.json", CycleCost)
        assert sealed.projected == first, "the bundle sets the projection beside its wall time"
        shown = spawn.mcp_infra(home, "evidence", "show", "latest")
        assert "    before it ran: projected on this machine " in shown.stdout, shown.stdout
        verified = spawn.mcp_infra(home, "evidence", "verify", "latest", "--json")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        checks = {c["name"]: c for c in json.loads(verified.stdout)["checks"]}
        assert checks["builds"]["status"] == "ok", checks["builds"]
        assert "q8-g64-affine-f32" in checks["builds"]["detail"]
        (built,) = [p for p in (home.root / "builds").iterdir() if p.is_dir()]
        weights = built / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-8] + bytes(8))  # the build changed since
        tampered = spawn.mcp_infra(home, "evidence", "verify", "latest", "--json")
        assert tampered.returncode != 0
        checks = {c["name"]: c for c in json.loads(tampered.stdout)["checks"]}
        assert (
            checks["builds"]["status"] == "failed"
            and "model.safetensors" in checks["builds"]["detail"]
        )
    finally:
        stop_home(home)


def test_a_server_that_fails_its_first_request_is_reported_at_once(
    tmp_path: Path, own: dict[str, Path], spawn: Spawn
) -> None:
    """KV bits with a group size (64) that does not divide the head dimension (32): preflight
    refuses it, so it is started here by hand; every request fails inside mx.quantize."""
    home = Home(tmp_path / "home").ensure()
    recipe = Recipe(
        candidate_id="own-kv:kv4-g64",
        template="mlx_lm_server",
        model_path=str(own["target"]),
        knobs=Knobs(kv_bits=4, kv_group_size=64, quantized_kv_start=0),
    )
    began = time.monotonic()
    with pytest.raises(ServerStartError) as caught:
        start_backend(
            home, recipe, role="candidate", log=home.logs / "kv.log", cycle_id=None, timeout=120
        )
    assert time.monotonic() - began < 60  # not the 120 s readiness timeout
    assert "the runtime says: ValueError: [quantize]" in str(caught.value)
    assert "divisible by the quantization group size 64" in str(caught.value)
