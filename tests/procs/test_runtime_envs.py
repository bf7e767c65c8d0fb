"""Runtime environments as pinned artifacts, on pure functions and small fake environments.

The ``--help`` texts under ``tests/data/runtime-help/`` were recorded from the real servers
(``python -m mlx_lm server --help`` of mlx-lm 0.31.3 and 0.32.2 on this Linux CPU): 0.31.3 has no
``--kv-bits``, which makes a real example of a flag a runtime version does not accept. The fake
environments are real folders with a real interpreter link and real ``dist-info`` metadata; only
the pip install is left out (the slow test in ``tests/e2e/test_runtime_upgrade.py`` builds a real
one).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import (
    CandidateRun,
    CycleState,
    EffectiveThresholds,
    Event,
    Knobs,
    Manifest,
    PinnedPackage,
    Plan,
    Recipe,
    RuntimeEnvSpec,
    Sample,
)
from mcp_infra.core.gating import run_gates
from mcp_infra.core.preflight import HostFacts, RuntimeFacts, env_hash, pin_problems, preflight
from mcp_infra.core.sanitize import PlanRefused
from mcp_infra.core.templates import help_flags, template_flags, unknown_flags
from mcp_infra.flows.proposal import freeze_plan
from mcp_infra.procs.runtime import ServerStartError, build_argv, free_port, start_server
from mcp_infra.state import memory, recomputed, runtimes
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.bundle import Bundle, Failed, Skipped
from mcp_infra.state.catalog import load_policy, load_registry
from mcp_infra.state.context import HomeContext
from mcp_infra.state.store import CycleFiles, Home, read_model, write_model
from tests.helpers.paths import DATA

HELP = DATA / "runtime-help"
REAL_SHA = "5c0991248cfff5872503d74f466d2532dd8cb7fb3670cb9be7a06d7305dadc04"  # mlx-lm 0.32.2
PY = ".".join(map(str, sys.version_info[:2]))


def spec(**change: object) -> RuntimeEnvSpec:
    package = {"name": "fakepkg", "version": "1.0.0", "sha256": [REAL_SHA]}
    package.update(change.pop("package", {}))  # type: ignore[arg-type]
    return RuntimeEnvSpec.model_validate(
        {"python": PY, "site": "isolated", "packages": [package], **change}
    )


def manifest(environment: RuntimeEnvSpec, knobs: dict | None = None) -> Manifest:
    return Manifest.model_validate(
        {
            "id": "rt",
            "title": "a runtime",
            "class": "runtime_upgrade",
            "semantics": "lossless",
            "license_reviewed": True,
            "runtime": {
                "template": "mlx_lm_server",
                "platforms": ["linux-x86_64", "linux-aarch64", "darwin-arm64"],
                "environment": environment.model_dump(),
            },
            "target": {"role": "target", "demo": "target"},
            "variants": [{"id": "v", "knobs": knobs or {}}],
        }
    )


def facts(**change: object) -> HostFacts:
    data: dict[str, object] = {
        "platform": runtimes.platform_tag(),
        "packages": {"mlx": "0.32.4", "mlx-lm": "0.32.2"},
        "memory_gb": 16,
        "free_disk_gb": 100,
        "available_artifacts": ["demo:target"],
        "python": runtimes.control_python(),
        "shared_site": runtimes.control_site(),
    }
    data.update(change)
    return HostFacts.model_validate(data)


def checks(m: Manifest, f: HostFacts) -> dict[str, tuple[bool, str]]:
    policy = load_policy("default")
    policy.allowed_classes.append(m.candidate_class)
    result = preflight(m, m.variants[0], policy, f)
    return {c.name: (c.passed, c.detail) for c in result.checks}


# ---------------------------------------------------------------------------------------------
# Flags: what a runtime version accepts, from its --help
# ---------------------------------------------------------------------------------------------


def test_help_flags_read_from_a_recorded_help_text() -> None:
    old = help_flags((HELP / "mlx-lm-0.31.3-server.txt").read_text())
    new = help_flags((HELP / "mlx-lm-0.32.2-server.txt").read_text())
    assert "--kv-bits" not in old and "--kv-bits" in new
    assert {"--model", "--host", "--port", "--draft-model", "--prompt-cache-size"} <= set(old)
    assert "--help" not in new


def test_a_flag_the_runtime_version_does_not_know_is_named() -> None:
    old = help_flags((HELP / "mlx-lm-0.31.3-server.txt").read_text())
    kv8 = Knobs(kv_bits=8, quantized_kv_start=0)
    assert unknown_flags("mlx_lm_server", kv8, old) == ["--kv-bits", "--quantized-kv-start"]
    drafter = Knobs(draft=True, num_draft_tokens=2, prompt_cache_size=0)
    assert unknown_flags("mlx_lm_server", drafter, old) == []
    assert template_flags("mlx_lm_server", drafter)[:3] == ["--model", "--host", "--port"]


def test_a_recipe_with_its_own_runtime_always_runs_that_interpreter() -> None:
    runtime = {
        "env_hash": "a" * 64,
        "python": "/home/runtimes/x/env/bin/python",
        "lock_digest": "b" * 64,
        "files_digest": "c" * 64,
    }
    recipe = Recipe(candidate_id="rt:v", template="mlx_lm_server", model_path="/m", runtime=runtime)
    plain = recipe.model_copy(update={"runtime": None})
    assert build_argv(recipe, 18000, python="/control/python")[0] == runtime["python"]
    assert build_argv(plain, 18000, python="/control/python")[0] == "/control/python"
    assert recipe.key() != plain.key(), "a runtime changes what a recipe is"


# ---------------------------------------------------------------------------------------------
# Preflight: unpinned, wrong Python, not built, unknown flag
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("package", "says"),
    [
        ({"version": ">=0.32"}, "'>=0.32' is not an exact version"),
        ({"version": "0.32.*"}, "is not an exact version"),
        ({"sha256": []}, "has no sha256"),
        ({"sha256": ["abc"]}, "not 64 hex digits"),
    ],
)
def test_an_unpinned_package_is_refused_at_preflight_with_the_reason(
    package: dict, says: str
) -> None:
    env = spec(package=package)
    assert any(says in p for p in pin_problems(env))
    passed, detail = checks(manifest(env), facts())["runtime_pinned"]
    assert not passed and says in detail


def test_a_pinned_environment_not_built_yet_says_how_to_build_it() -> None:
    got = checks(manifest(spec()), facts())
    assert got["runtime_pinned"][0] and got["runtime_python"][0]
    passed, detail = got["runtime_built"]
    assert not passed and "mcp-infra prepare rt:v" in detail
    assert got["runtime_flags"] == (
        True,
        "checked against the runtime's --help when the environment is built",
    )


def test_another_python_is_refused() -> None:
    passed, detail = checks(manifest(spec(python="3.9")), facts())["runtime_python"]
    assert not passed and "needs Python 3.9" in detail


def built_facts(env: RuntimeEnvSpec, help_file: str, version: str) -> HostFacts:
    f = facts()
    digest = env_hash(env, f.python, f.platform, f.shared_site)
    accepted = help_flags((HELP / help_file).read_text())
    return f.model_copy(
        update={
            "runtimes": {
                digest: RuntimeFacts(
                    built=True,
                    packages={"mlx-lm": version, "mlx": "0.32.4"},
                    accepted_flags={"mlx_lm_server": accepted},
                )
            }
        }
    )


def test_a_flag_the_built_runtime_does_not_accept_is_refused_at_preflight() -> None:
    env = spec(package={"name": "mlx-lm", "version": "0.31.3"})
    kv8 = manifest(env, {"kv_bits": 8, "quantized_kv_start": 0})
    got = checks(kv8, built_facts(env, "mlx-lm-0.31.3-server.txt", "0.31.3"))
    passed, detail = got["runtime_flags"]
    assert not passed
    assert detail == (
        "mlx-lm 0.31.3 does not accept --kv-bits, --quantized-kv-start (its --help at build time)"
    )
    assert got["runtime_built"][0] and got["version:mlx-lm"] == (True, "mlx-lm 0.31.3 (installed)")
    fine = checks(manifest(env), built_facts(env, "mlx-lm-0.31.3-server.txt", "0.31.3"))
    assert fine["runtime_flags"][0]


def test_the_shipped_runtime_manifest_is_pinned_to_a_real_release() -> None:
    shipped = load_registry()["demo-runtime"]
    env = shipped.environment_of(shipped.variants[0])
    assert env is not None and env.site == "shared"
    (package,) = env.packages
    assert (package.name, package.version, package.sha256) == ("mlx-lm", "0.32.2", [REAL_SHA])
    assert pin_problems(env) == []
    assert package.requirement() == f"mlx-lm==0.32.2 --hash=sha256:{REAL_SHA}"


# ---------------------------------------------------------------------------------------------
# A small real environment folder: lock, tamper checks, refusal before a start
# ---------------------------------------------------------------------------------------------


def fake_env(
    runtimes_dir: Path,
    env: RuntimeEnvSpec,
    help_file: str = "mlx-lm-0.32.2-server.txt",
) -> Path:
    """A built environment as `runtimes.build` leaves it, without pip: an interpreter link,
    its pinned packages with their dist-info, and its lock (with a recorded --help)."""
    folder = runtimes.folder(runtimes_dir, runtimes.spec_hash(env))
    site = runtimes.env_site(folder / runtimes.ENV_DIR)
    for package in env.packages:
        code = site / package.name.replace("-", "_")
        code.mkdir(parents=True)
        (code / "__init__.py").write_text("VALUE = 1\n")
        info = site / f"{code.name}-{package.version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {package.name}\nVersion: {package.version}\n"
        )
    bin_dir = folder / runtimes.ENV_DIR / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    helps = {"mlx_lm_server": (HELP / help_file).read_text()}
    write_model(folder / runtimes.LOCK_FILE, runtimes.make_lock(env, folder, helps, "test"))
    return folder


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0x20
    path.write_bytes(bytes(data))


def test_a_built_environment_is_used_and_a_changed_file_refuses_it(tmp_path: Path) -> None:
    env = spec()
    folder = fake_env(tmp_path, env)
    lock = read_model(folder / runtimes.LOCK_FILE, runtimes.RuntimeLock)
    assert [(p.name, p.version, p.location) for p in lock.packages] == [
        ("fakepkg", "1.0.0", "environment")
    ]
    runtime = runtimes.ensure_runtime(env, tmp_path)
    assert runtime.lock_digest == lock.lock_digest and runtime.python.endswith("env/bin/python")
    runtimes.verify_recipe_runtime(runtime)
    assert runtimes.runtime_facts(tmp_path)[folder.name].problems == []

    source = runtimes.env_site(folder / runtimes.ENV_DIR) / "fakepkg" / "__init__.py"
    flip_a_byte(source)  # same size: only the sha256 tells
    assert runtimes.runtime_facts(tmp_path)[folder.name].problems == [], "a quick look: sizes"
    with pytest.raises(runtimes.RuntimeTampered, match=r"fakepkg/__init__.py: sha256 differs"):
        runtimes.ensure_runtime(env, tmp_path)
    with pytest.raises(runtimes.RuntimeTampered, match="differs from its lock"):
        runtimes.verify_recipe_runtime(runtime)


def test_a_tampered_environment_refuses_the_candidate_before_it_starts(tmp_path: Path) -> None:
    """The cycle resolves a candidate's recipe with every file re-hashed (a refusal recorded as
    not started), and the one starter re-checks it before any process exists."""
    env = spec()
    folder = fake_env(tmp_path / "runtimes", env)
    m = manifest(env)
    recipe = resolve_recipe(
        m, m.variants[0], tmp_path / "models", runtimes=tmp_path / "runtimes", fingerprint=str
    )
    assert recipe.runtime is not None and recipe.runtime.env_hash == folder.name
    extra = runtimes.env_site(folder / runtimes.ENV_DIR) / "fakepkg" / "sneaky.py"
    extra.write_text("import os\n")
    with pytest.raises(runtimes.RuntimeTampered, match="not in the lock: .*sneaky.py"):
        resolve_recipe(
            m, m.variants[0], tmp_path / "models", runtimes=tmp_path / "runtimes", fingerprint=str
        )
    with pytest.raises(ServerStartError, match=r"rt:v not started: .*sneaky.py"):
        start_server(recipe, port=free_port(), role="candidate", log_path=tmp_path / "x.log")
    assert not (tmp_path / "x.log").exists(), "nothing was started"


def test_a_changed_shared_package_changes_the_lock(tmp_path: Path) -> None:
    """Shared site: the control plane's packages are part of the lock; one that changed
    version since the build is named."""
    shared = tmp_path / "shared"
    info = shared / "mlx-0.32.4.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlx\nVersion: 0.32.4\n")
    site = tmp_path / "env-site"
    site.mkdir()
    before = runtimes.visible_packages(site, str(shared))
    assert [(p.name, p.version, p.location) for p in before] == [("mlx", "0.32.4", "shared")]
    info.rename(shared / "mlx-0.32.5.dist-info")
    (shared / "mlx-0.32.5.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mlx\nVersion: 0.32.5\n"
    )
    after = runtimes.visible_packages(site, str(shared))
    assert runtimes.lock_digest(after) != runtimes.lock_digest(before)


def test_building_refuses_an_unpinned_spec_and_names_what_is_missing_offline(
    tmp_path: Path,
) -> None:
    policy = load_policy("default")
    with pytest.raises(runtimes.RuntimeRefused, match="is not an exact version"):
        runtimes.build(spec(package={"version": "1.*"}), tmp_path, policy, progress=False)
    with pytest.raises(runtimes.RuntimeRefused, match="exceeds the policy's download budget"):
        big = spec(package={"size_bytes": 10**12})
        runtimes.build(big, tmp_path, policy, progress=False, free_bytes=10**15)
    with pytest.raises(runtimes.RuntimeMissing, match=r"offline: .* missing fakepkg==1.0.0"):
        runtimes.build(spec(), tmp_path, policy, offline=True, progress=False)
    assert not any(tmp_path.iterdir()), "nothing was built"


def test_memory_keys_outcomes_by_the_runtime_lock(tmp_path: Path) -> None:
    env = {"os": "linux"}
    base = Recipe(candidate_id="rt:v", template="mlx_lm_server", model_path=str(tmp_path))

    def with_lock(digest: str) -> dict:
        runtime = {"env_hash": "a" * 64, "python": "/p", "lock_digest": digest}
        data = {**base.model_dump(mode="json"), "runtime": {**runtime, "files_digest": "c" * 64}}
        return Recipe.model_validate(data).model_dump(mode="json")

    key = memory.environment_key
    assert key(env, with_lock("b" * 64)) == key(env, with_lock("b" * 64))
    assert key(env, with_lock("b" * 64)) != key(env, with_lock("d" * 64))
    assert key(env, base) != key(env, with_lock("b" * 64))


# ---------------------------------------------------------------------------------------------
# Evidence: the bundled lock is checked against the recipe
# ---------------------------------------------------------------------------------------------


def bundle_with_lock(tmp_path: Path) -> tuple[Path, Path]:
    env = spec()
    folder = fake_env(tmp_path / "runtimes", env)
    lock = read_model(folder / runtimes.LOCK_FILE, runtimes.RuntimeLock)
    recipe = Recipe(
        candidate_id="rt:v",
        template="mlx_lm_server",
        model_path="/m",
        runtime=runtimes.as_recipe_runtime(lock),
    )
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    event = Event(
        ts=datetime.now(UTC),
        cycle_id="c-1",
        state=CycleState.PREPARE,
        message="artifacts resolved",
        fields={"recipes": {"rt:v": recipe.model_dump(mode="json")}},
    )
    (bundle / "journal.ndjson").write_text(event.model_dump_json() + "\n")
    write_model(CycleFiles(bundle).runtime_lock(folder.name), lock)
    return bundle, CycleFiles(bundle).runtime_lock(folder.name)


def test_evidence_verify_checks_the_bundled_runtime_lock(tmp_path: Path) -> None:
    bundle, lock_file = bundle_with_lock(tmp_path)
    said = recomputed.check_runtime_locks(Bundle(bundle))
    assert said.startswith("rt:v: fakepkg 1.0.0 (isolated), 1 pkgs")
    lock = read_model(lock_file, runtimes.RuntimeLock)
    forged = lock.model_copy(
        update={"packages": [p.model_copy(update={"version": "9"}) for p in lock.packages]}
    )
    write_model(lock_file, forged)
    refused = "the package list does not give the lock's digest"
    with pytest.raises(Failed, match=refused):
        recomputed.check_runtime_locks(Bundle(bundle))


def test_a_bundle_without_runtime_environments_skips_the_check(tmp_path: Path) -> None:
    (tmp_path / "journal.ndjson").write_text("")
    with pytest.raises(Skipped, match="no recipe of this cycle ran from"):
        recomputed.check_runtime_locks(Bundle(tmp_path))


def test_a_pinned_package_is_one_requirements_line() -> None:
    package = PinnedPackage(name="mlx-lm", version="0.32.2", sha256=[REAL_SHA, "0" * 64])
    assert package.requirement() == (
        f"mlx-lm==0.32.2 --hash=sha256:{REAL_SHA} --hash=sha256:{'0' * 64}"
    )


def test_a_plan_naming_an_unpinned_or_unknown_flag_runtime_is_refused_with_why(
    bare_home: Home,
) -> None:
    """Through the product's plan path (what `propose_plan` runs): one home manifest pins
    nothing exactly, another asks mlx-lm 0.31.3 (its lock's --help) for the 8-bit KV cache."""
    home = bare_home
    (home.models / "target").mkdir(parents=True)  # a demo model folder, never served here
    old = {  # mlx-lm 0.31.3: sha256 of the wheel `pip download mlx-lm==0.31.3 --no-deps` got
        "name": "mlx-lm",
        "version": "0.31.3",
        "sha256": ["758cfddf1180053b7613db76fad3d246a331a2a905808e1164a275621fc983b8"],
    }
    env_031 = RuntimeEnvSpec.model_validate({"python": PY, "site": "shared", "packages": [old]})
    fake_env(home.runtimes, env_031, "mlx-lm-0.31.3-server.txt")
    loose = spec(package={"name": "mlx-lm", "version": ">=0.32"})
    home.user_registry.mkdir()
    for name, env, knobs in (
        ("rt-loose", loose, {}),
        ("rt-031", env_031, {"kv_bits": 8, "quantized_kv_start": 0}),
    ):
        data = manifest(env, knobs).model_dump(mode="json", by_alias=True, exclude_none=True)
        data["id"] = name
        (home.user_registry / f"{name}.yaml").write_text(yaml.safe_dump(data))
    plan = Plan(hypothesis="another runtime", candidates=["rt-loose:v", "rt-031:v"])
    with pytest.raises(PlanRefused) as refused:
        freeze_plan(HomeContext(home), plan, "test")
    why = {r.id: r.reason for r in refused.value.refused}
    assert (
        "runtime_pinned: not pinned: mlx-lm '>=0.32' is not an exact version" in why["rt-loose:v"]
    )
    assert (
        "runtime_flags: mlx-lm 0.31.3 does not accept --kv-bits, --quantized-kv-start"
        in why["rt-031:v"]
    )
    assert "runtime_built" not in why["rt-031:v"], "built, and it is the flag that is refused"


def test_the_registry_shows_installed_pinned_and_size_per_runtime_candidate(
    bare_home: Home,
) -> None:
    from mcp_infra.faces.render import runtime_line
    from mcp_infra.flows.views import runtime_view
    from mcp_infra.state.hostfacts import installed_version

    shipped = load_registry()["demo-runtime"]
    variant = shipped.variants[0]
    before = runtime_view(bare_home, shipped, variant, HomeContext(bare_home).facts)
    assert before is not None and not before.built
    assert before.pinned == {"mlx-lm": "0.32.2"}
    assert before.installed == {"mlx-lm": installed_version("mlx-lm")}
    assert (before.size_bytes, before.size_basis) == (546040, "download (stated)")
    assert "would be built in" in runtime_line(before) and "0.5 MB download" in runtime_line(before)

    env = shipped.environment_of(variant)
    assert env is not None
    folder = fake_env(bare_home.runtimes, env)
    after = runtime_view(bare_home, shipped, variant, HomeContext(bare_home).facts)
    assert after is not None and after.built and after.path == str(folder)
    assert after.size_basis == "on disk" and after.size_bytes and after.problems == []
    assert runtime_line(after).startswith(
        f"mlx-lm {installed_version('mlx-lm')} installed, 0.32.2 pinned (shared site); built in"
    )


# ---------------------------------------------------------------------------------------------
# Judging: lossless only if the greedy tokens match, lossy otherwise
# ---------------------------------------------------------------------------------------------


def greedy(candidate: str, tokens: dict[str, list[int]]) -> list[Sample]:
    return [
        Sample(
            candidate=candidate,
            prompt_id=pid,
            repeat=0,
            completion_tokens=len(ids),
            finish_reason="length",
            text=" ".join(map(str, ids)),
            token_ids=ids,
        )
        for pid, ids in tokens.items()
    ]


THRESHOLDS = EffectiveThresholds(
    min_speedup_pct=5,
    max_peak_memory_gb=4,
    max_error_rate=0,
    worst_prompt_tolerance_pct=10,
    lossy_min_identical_fraction=0.5,
)


@pytest.mark.parametrize("declared", ["lossless", "lossy"])
def test_a_runtime_upgrade_with_matching_tokens_is_judged_lossless(declared: str) -> None:
    same = {"p1": [1, 2, 3], "p2": [4, 5, 6]}
    base = CandidateRun(candidate="baseline", greedy=greedy("baseline", same))
    run = CandidateRun(
        candidate="rt:v",
        greedy=greedy("rt:v", same),
        semantics=declared,
        candidate_class="runtime_upgrade",
    )
    gates = run_gates(base, run, THRESHOLDS, None, quality_suite="demo-quality")
    assert [g.gate for g in gates] == ["lossless", "smoke", "memory"]
    assert gates[0].passed and gates[0].detail == "2 of 2 greedy output(s) identical"


def test_a_runtime_upgrade_whose_tokens_differ_is_judged_lossy_with_its_first_divergence() -> None:
    base = CandidateRun(
        candidate="baseline", greedy=greedy("baseline", {"p1": [1, 2, 3], "p2": [4, 5, 6]})
    )
    run = CandidateRun(
        candidate="rt:v",
        greedy=greedy("rt:v", {"p1": [1, 2, 3], "p2": [4, 9, 6]}),
        semantics="lossy",
        candidate_class="runtime_upgrade",
    )
    gates = run_gates(base, run, THRESHOLDS, None, quality_suite="demo-quality")
    assert [g.gate for g in gates] == ["agreement", "quality", "smoke", "memory"]
    assert gates[0].passed, "half the prompts identical, as the policy allows"
    assert "not lossless: 1 of 2 greedy output(s) identical; p2 diverges at token 1" in (
        gates[0].detail
    )
    assert not gates[1].passed, "no quality output: the quality suite judges it, and fails it"
    declared_lossless = run.model_copy(update={"semantics": "lossless"})
    (strict, *_) = run_gates(base, declared_lossless, THRESHOLDS, None, "demo-quality")
    assert strict.gate == "lossless" and not strict.passed
