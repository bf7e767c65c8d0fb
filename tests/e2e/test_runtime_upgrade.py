"""A runtime upgrade measured for real: another release of mlx-lm, pinned by its sha256 in its own
environment, serving the demo target in a real cycle against the control plane's runtime.

The environment pins mlx-lm 0.32.1 while the control plane runs 0.32.2 (the newest release
when this was written, so no newer one exists to try: the older one is the "other version").
It is ``site: shared``: mlx-lm is pure Python and on Linux declares no dependency on mlx, so the
build installs one wheel (fetched from PyPI once per session, with ``--require-hashes``) and
sees the control plane's mlx 0.32.x after its own site; the lock records both. The manifest is
written into the home's own registry, the way docs/runtime-upgrades.md tells a user to.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import CandidateRun, Outcome, RuntimeEnvSpec, Verdict
from mcp_infra.demo.homes import make_home
from mcp_infra.flows.proposal import prepare_candidate
from mcp_infra.flows.supervisor import supervise
from mcp_infra.state import evidence, runtimes
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.context import HomeContext, active_recipe
from mcp_infra.state.hostfacts import folder_fingerprint
from mcp_infra.state.store import CycleFiles, Home, read_model
from tests.helpers.faultkit import queue_plan, start_live

# One start of each side, one request per prompt: this test is about the environment (built,
# served from, locked, verified, refused when tampered), not about a decision.
FAST = {"repeats": 1, "warmup": 1, "max_tokens": 16, "min_starts": 1, "max_starts": 1}
PY = ".".join(map(str, sys.version_info[:2]))
# mlx-lm 0.32.1: sha256 and size of the wheel `pip download mlx-lm==0.32.1 --no-deps` fetched
OTHER_RELEASE = {
    "name": "mlx-lm",
    "version": "0.32.1",
    "sha256": ["0b2dddbe3d4b9678aad3c18fec6ba20d25084497fe0aa67f3fee6abd156ee059"],
    "size_bytes": 546354,
}
CANDIDATE = "mlx-lm-0321:release"


def home_manifest(home: Home) -> None:
    """What a user writes into <home>/registry/ to try a release (docs/runtime-upgrades.md)."""
    home.user_registry.mkdir(parents=True, exist_ok=True)
    manifest = {
        "schema_version": 1,
        "id": "mlx-lm-0321",
        "title": "mlx-lm 0.32.1 in its own environment",
        "class": "runtime_upgrade",
        "semantics": "lossless",
        "license_reviewed": True,
        "runtime": {
            "template": "mlx_lm_server",
            "platforms": ["linux-x86_64", "linux-aarch64", "darwin-arm64"],
            "environment": {"python": PY, "site": "shared", "packages": [OTHER_RELEASE]},
        },
        "target": {"role": "target", "demo": "target"},
        "resources": {"memory_gb": 1, "disk_gb": 0.1},
        "variants": [{"id": "release", "title": "mlx-lm 0.32.1, the baseline's knobs"}],
    }
    (home.user_registry / "mlx-lm-0321.yaml").write_text(yaml.safe_dump(manifest))


@pytest.fixture(scope="session")
def built_runtime(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The environment, built once per session (pip from PyPI, hashes required)."""
    folder = tmp_path_factory.mktemp("runtimes")
    spec = RuntimeEnvSpec.model_validate(
        {"python": PY, "site": "shared", "packages": [OTHER_RELEASE]}
    )
    began = time.monotonic()
    result = runtimes.build(spec, folder, load_policy("default"), offline=False, progress=False)
    assert not result.reused
    return folder, time.monotonic() - began


def test_another_mlx_lm_release_serves_from_its_own_environment_in_a_real_cycle(
    tmp_path: Path, demo_models: dict[str, Path], built_runtime: tuple[Path, float]
) -> None:
    folder, build_s = built_runtime
    print(f"runtime environment built in {build_s:.1f} s")
    home = make_home(tmp_path / "home", demo_models, **FAST)
    home.runtimes.symlink_to(folder, target_is_directory=True)
    home_manifest(home)
    prepared = prepare_candidate(home, CANDIDATE, progress=False)
    assert prepared.runtime is not None and prepared.runtime.reused
    assert "--kv-bits" in prepared.runtime.accepted_flags["mlx_lm_server"]

    start_live(home)
    queue_plan(home, {"hypothesis": "mlx-lm 0.32.1 decodes faster", "candidates": [CANDIDATE]})
    began = time.monotonic()
    (summary,) = supervise(home)
    print(f"cycle: {time.monotonic() - began:.1f} s, {summary.outcome.value}: {summary.reason}")
    assert summary.outcome == Outcome.KEPT_BASELINE, summary.reason  # never auto-promoted
    assert active_recipe(home).candidate_id == "demo-tiny:target"

    bundle = home.evidence / summary.cycle_id
    run = read_model(CycleFiles(bundle).run(CANDIDATE), CandidateRun)
    assert run.started and run.samples and run.greedy, run.start_error
    verdict = read_model(CycleFiles(bundle).verdict, Verdict)
    (judged,) = [c for c in verdict.candidates if c.candidate == CANDIDATE]
    lossless = [g for g in judged.gates if g.gate == "lossless"]
    assert lossless, f"a lossless runtime upgrade is judged on token identity: {judged.gates}"
    print(f"lossless gate: {lossless[0].passed}, {lossless[0].detail}")

    (lock_file,) = (CycleFiles(bundle).runtimes).glob("*.json")
    lock = read_model(lock_file, runtimes.RuntimeLock)
    seen = {p.name: (p.version, p.location) for p in lock.packages}
    assert seen["mlx-lm"] == ("0.32.1", "environment")
    assert seen["mlx"][1] == "shared"
    verified = evidence.verify(bundle)
    checks = {c.name: c for c in verified.checks}
    assert verified.ok, verified.problems
    assert checks["runtime_locks"].status == "ok"
    assert "mlx-lm 0.32.1" in checks["runtime_locks"].detail

    # a changed file in the environment refuses the candidate before anything starts
    found = HomeContext(home).find(CANDIDATE)
    assert found is not None
    server = runtimes.env_site(folder / lock.env_hash / runtimes.ENV_DIR) / "mlx_lm" / "server.py"
    original = server.read_bytes()
    try:
        server.write_bytes(original.replace(b"import", b"IMPORT", 1))
        with pytest.raises(runtimes.RuntimeTampered, match="mlx_lm/server.py: sha256 differs"):
            resolve_recipe(
                *found,
                home.models,
                home.hf_cache,
                fingerprint=folder_fingerprint,
                runtimes=home.runtimes,
            )
    finally:
        server.write_bytes(original)
