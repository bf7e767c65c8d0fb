"""Manifests and preflight: what a registry file may say, and a verdict per check on this machine.

Real parts only: manifests are YAML files loaded by the product's loader; host facts are this
machine's (platform, installed packages, memory, disk) as `host_facts` gathers them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import Budgets, Manifest
from mcp_infra.core.preflight import HostFacts, preflight
from mcp_infra.faces import cli
from mcp_infra.state.catalog import RegistryError, load_manifest, load_policy, load_registry
from mcp_infra.state.hostfacts import fingerprint_environment, host_facts, platform_tag
from mcp_infra.state.store import Home

DFLASH2 = "qwen38-dflash2-v1"
TARGET_REV = "3e6447f082e89cc7f0bc6e5441afd38dfce760ff"
DRAFT_REV = "50307d4c4cde6860d4eee73e2547cd786fe8e8a4"

EVERY_CHECK = {
    "trusted_namespace",
    "class_allowed",
    "template_allowed",
    "pinned",
    "remote_code",
    "license",
    "platform",
    "memory",
    "disk",
    "disk_budget",
    "download_budget",
    "integrity",
}


def _good() -> dict:
    return {
        "schema_version": 1,
        "id": "good",
        "title": "t",
        "class": "acceleration_plugin",
        "semantics": "lossless",
        "license_reviewed": True,
        "runtime": {"template": "mlx_vlm_server", "platforms": ["linux-x86_64"]},
        "target": {"role": "target", "repo": "mlx-community/x", "revision": "a" * 40},
        "artifacts": [{"role": "draft", "repo": "z-lab/y", "revision": "b" * 40}],
        "variants": [{"id": "v", "knobs": {"draft": True, "draft_kind": "dflash"}}],
    }


def _write(folder: Path, data: dict, name: str | None = None) -> Path:
    path = folder / f"{name or data['id']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_well_formed_manifest_loads(tmp_path: Path) -> None:
    assert load_manifest(_write(tmp_path, _good())).id == "good"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        # bad revisions: a branch, a short hash, upper case
        (lambda d: d["target"].update(revision="main"), "target.revision"),
        (lambda d: d["artifacts"][0].update(revision="50307d4"), "artifacts.0.revision"),
        (lambda d: d["target"].update(revision="A" * 40), "target.revision"),
        # remote code
        (lambda d: d["runtime"].update(trust_remote_code=True), "trust_remote_code must be false"),
        # extra launch fields: free-form args anywhere a command line is built from
        (
            lambda d: d["variants"][0]["knobs"].update(extra_args=["--trust-remote-code"]),
            "variants.0.knobs.extra_args: Extra inputs are not permitted",
        ),
        (
            lambda d: d["runtime"].update(argv=["python", "-c", "print(1)"]),
            "runtime.argv: Extra inputs are not permitted",
        ),
        (lambda d: d["runtime"].update(template="bash"), "runtime.template"),
        # path traversal: in the id, an artifact's file patterns, a repo id
        (lambda d: d.update(id="../../etc/passwd"), "id: String should match pattern"),
        (lambda d: d["target"].update(files=["../../secrets.json"]), "relative, without '..'"),
        (lambda d: d["target"].update(files=["/etc/passwd"]), "relative, without '..'"),
        (lambda d: d["target"].update(repo="mlx-community/../x"), "target.repo"),
        (lambda d: d["target"].update(repo="mlx--community/x"), "may not contain '--' or '..'"),
    ],
)
def test_bad_manifests_are_rejected_with_a_message(tmp_path: Path, mutate, message: str) -> None:
    data = _good()
    mutate(data)
    path = _write(tmp_path, data, name="good")
    with pytest.raises(RegistryError) as info:
        load_manifest(path)
    assert message in str(info.value)
    assert str(info.value).startswith("good.yaml: ")


def test_a_manifest_id_must_be_its_file_name(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="must equal the file name"):
        load_manifest(_write(tmp_path, _good(), name="other"))


def test_the_shipped_dflash2_manifest_pins_exactly_the_issue_revisions() -> None:
    manifest = load_registry()[DFLASH2]
    assert (manifest.target.repo, manifest.target.revision) == (
        "mlx-community/Qwen3.8-27B-4bit",
        TARGET_REV,
    )
    draft = manifest.draft_artifact()
    assert draft is not None
    assert (draft.repo, draft.revision, draft.size_gb, draft.license) == (
        "z-lab/Qwen3.8-27B-DFlash2",
        DRAFT_REV,
        3.85,
        "Apache-2.0",
    )
    assert manifest.runtime.template == "mlx_vlm_server"
    assert manifest.runtime.min_versions["mlx-vlm"] == "0.6.16"
    assert manifest.runtime.platforms == ["darwin-arm64"]
    # issue #11's figures: one server of the pair peaks at 21.7 GB; two side by side about 38 GB
    assert manifest.resources.memory_gb == 22 and manifest.resources.concurrent_memory_gb == 38
    sizes = {v.id: v.knobs.draft_block_size for v in manifest.variants}
    # the native variant passes no block size: the drafter's own config decides
    assert sizes == {
        "dflash-native": None,
        "dflash-b3": 3,
        "dflash-b4": 4,
        "dflash-b5": 5,
        "dflash-b6": 6,
    }
    assert all(v.knobs.draft and v.knobs.draft_kind == "dflash" for v in manifest.variants)


@pytest.fixture
def facts(tmp_path: Path, demo_models: dict[str, Path]) -> HostFacts:
    """This machine's facts, with the demo models built and an empty home cache."""
    return host_facts(tmp_path / "home", demo_models["target"].parent, tmp_path / "hf-cache")


def test_preflight_on_this_machine_demo_passes_and_dflash2_fails_on_platform(
    facts: HostFacts,
) -> None:
    policy = load_policy("default")
    manifests = load_registry()
    demo = manifests["demo-tiny"]
    for variant in demo.variants:
        result = preflight(demo, variant, policy, facts, require_artifacts=True)
        assert result.passed, result.failures()
        assert EVERY_CHECK | {"artifacts"} <= {c.name for c in result.checks}

    dflash = manifests[DFLASH2]
    for variant in dflash.variants:
        result = preflight(dflash, variant, policy, facts, require_artifacts=True)
        checks = {c.name: c for c in result.checks}
        # every check reports a verdict and a reason; one failure hides none of the others
        assert EVERY_CHECK | {"artifacts", "version:mlx", "version:mlx-vlm"} <= set(checks)
        assert all(c.detail for c in result.checks)
        for name in (
            "trusted_namespace",
            "class_allowed",
            "template_allowed",
            "pinned",
            "remote_code",
            "license",
            "disk_budget",
            "integrity",
        ):
            assert checks[name].passed, checks[name]
        assert checks["pinned"].detail.endswith(
            f"@{TARGET_REV[:12]}, z-lab/Qwen3.8-27B-DFlash2@{DRAFT_REV[:12]}"
        )
        assert checks["memory"].passed == (facts.memory_gb >= 22)
        assert not checks["artifacts"].passed
        assert f"run `mcp-infra prepare {DFLASH2}:{variant.id}`" in checks["artifacts"].detail
        if platform_tag() != "darwin-arm64":
            assert not result.passed
            assert checks["platform"].detail == (
                f"this machine is {platform_tag()}; the manifest runs only on darwin-arm64"
            )
        else:  # on the one platform it supports, the platform check passes (artifacts do not)
            assert checks["platform"].passed and not result.passed


def test_each_failing_check_says_why_and_hides_no_other(facts: HostFacts) -> None:
    strict = load_policy("default").model_copy(
        update={
            "trusted_namespaces": ["mlx-community"],
            "allowed_classes": [],
            "allowed_templates": ["mlx_lm_server"],
            "budgets": Budgets(download_gb=1, disk_gb=5),
        }
    )
    manifest = Manifest.model_validate(_good() | {"resources": {"memory_gb": 4096, "disk_gb": 10}})
    manifest.target.size_gb, manifest.artifacts[0].size_gb = 15.0, 3.85
    result = preflight(manifest, manifest.variants[0], strict, facts)
    failed = {c.name: c.detail for c in result.checks if not c.passed}
    assert failed["trusted_namespace"].endswith("(mlx-community): z-lab/y")
    assert failed["class_allowed"] == "class acceleration_plugin is not allowed by policy default"
    assert failed["template_allowed"] == "template mlx_vlm_server is not allowed by policy default"
    assert "needs 4096 GB" in failed["memory"]
    assert failed["download_budget"] == (
        "18.85 GB to download exceeds the policy's 1 GB download budget"
    )
    assert failed["disk_budget"] == "the manifest needs 10 GB of disk; the policy's budget is 5 GB"
    assert "pinned" not in failed and "license" not in failed and "remote_code" not in failed


def test_registry_command_shows_both_manifests_and_why(
    home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--home", str(home.root), "registry"]) == 0
    out = capsys.readouterr().out
    assert "demo-tiny:draft-k2" in out
    assert f"{DFLASH2}:dflash-b3" in out
    if platform_tag() != "darwin-arm64":
        assert "fails platform: this machine is" in out
    else:
        assert "fails platform" not in out


def test_the_environment_names_the_accelerator_mlx_computes_on() -> None:
    env = fingerprint_environment([])
    # This Linux machine runs MLX's CPU build (no Metal): the bundle must say so, not leave it
    # to be guessed from the platform string; a Mac with Metal records "metal: <GPU name>".
    expected = "cpu" if platform_tag().startswith("linux") else "metal: "
    assert env.accelerator.startswith(expected)
    assert env.model_dump()["accelerator"] == env.accelerator
