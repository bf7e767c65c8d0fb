"""Pinned preparation from a real, locally built Hugging Face cache (no network).

The cache is laid out exactly as huggingface_hub writes it (``models--org--name/blobs``,
``snapshots/<revision>`` of relative links, ``refs/main``), filled with the demo's real tiny model
files; huggingface_hub itself resolves it (``snapshot_download(local_files_only=True)``,
``try_to_load_from_cache``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml
from huggingface_hub import try_to_load_from_cache

from mcp_infra.contracts import ArtifactRef
from mcp_infra.core.preflight import find_candidate, preflight
from mcp_infra.faces import cli
from mcp_infra.flows.proposal import prepare_candidate
from mcp_infra.state import artifacts as hub
from mcp_infra.state.artifacts import resolve_recipe
from mcp_infra.state.catalog import load_policy, load_registry
from mcp_infra.state.context import load_config
from mcp_infra.state.hostfacts import host_facts
from mcp_infra.state.store import Home, write_model

TARGET = ("mlx-community/tiny-target", "1" * 40)
DRAFT = ("z-lab/tiny-draft", "2" * 40)
CANDIDATE = "tinyhub:draft-k2"


def build_cache(
    cache: Path, repo: str, revision: str, source: Path, skip: tuple[str, ...] = ()
) -> Path:
    """Write ``source``'s files into a hub cache as huggingface_hub lays it out."""
    folder = hub.repo_folder(cache, repo)
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(revision)
    snap = folder / "snapshots" / revision
    snap.mkdir(parents=True)
    for file in sorted(source.iterdir()):
        if file.name in skip or not file.is_file():
            continue
        data = file.read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / file.name).symlink_to(os.path.relpath(blob, snap))
    return snap


def write_manifest(home: Home, draft: tuple[str, str] = DRAFT) -> None:
    data = {
        "schema_version": 1,
        "id": "tinyhub",
        "title": "tiny pinned models from a local cache",
        "class": "acceleration_plugin",
        "semantics": "lossless",
        "license_reviewed": True,
        "runtime": {
            "template": "mlx_lm_server",
            "platforms": ["linux-x86_64", "linux-aarch64", "darwin-arm64"],
        },
        "target": {
            "role": "target",
            "repo": TARGET[0],
            "revision": TARGET[1],
            "size_gb": 0.01,
            "license": "Apache-2.0",
        },
        "artifacts": [
            {
                "role": "draft",
                "repo": draft[0],
                "revision": draft[1],
                "size_gb": 0.01,
                "license": "Apache-2.0",
                "files": ["*.json", "*.safetensors"],
            }
        ],
        "resources": {"memory_gb": 0.5, "disk_gb": 0.05},
        "variants": [{"id": "draft-k2", "knobs": {"draft": True, "num_draft_tokens": 2}}],
    }
    home.user_registry.mkdir(parents=True, exist_ok=True)
    (home.user_registry / "tinyhub.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def serve_from_cache(home: Home, snapshot: Path) -> None:
    """The live model is the cached target snapshot (what a user serving from the hub cache
    has): the candidate's target is then the live model and its ``same_target`` check passes."""
    config = load_config(home)
    baseline = config.baseline.model_copy(update={"model_path": str(snapshot.resolve())})
    write_model(home.config, config.model_copy(update={"baseline": baseline}))


def _blob(snapshot: Path, name: str) -> Path:
    return (snapshot / name).resolve()


def _preflight(home: Home):
    manifest, variant = find_candidate(load_registry(extra=home.user_registry), CANDIDATE)
    facts = host_facts(home.root, home.models, home.hf_cache)
    return preflight(
        manifest,
        variant,
        load_policy("test", extra=home.user_policy),
        facts,
        require_artifacts=True,
    )


def test_prepare_from_a_local_cache_then_detect_tampering(
    home: Home, hf_cache: Path, demo_models: dict[str, Path]
) -> None:
    target = build_cache(hf_cache, *TARGET, demo_models["target"])
    draft = build_cache(hf_cache, *DRAFT, demo_models["draft"])
    write_manifest(home)
    serve_from_cache(home, target)
    integrity = {c.name: c for c in _preflight(home).checks}["integrity"]
    assert not integrity.passed and "no sha256 inventory" in integrity.detail

    result = prepare_candidate(home, CANDIDATE, progress=False)
    assert result.offline and Path(result.cache) == hf_cache
    by_role = {a.role: a for a in result.artifacts}
    assert Path(by_role["target"].snapshot) == target and Path(by_role["draft"].snapshot) == draft
    assert by_role["target"].files == len(list(demo_models["target"].iterdir()))
    # the draft's patterns (*.json, *.safetensors) are what its inventory covers ...
    inventory = json.loads(Path(by_role["draft"].inventory).read_text())
    assert {f["path"] for f in inventory["files"]} == {
        p.name for p in demo_models["draft"].iterdir()
    }
    assert inventory["revision"] == DRAFT[1]
    # ... and the inventory's hashes are the files' real sha256
    for entry in inventory["files"]:
        data = (demo_models["draft"] / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    # the same cache is what huggingface_hub (and so the runtime) resolves
    assert try_to_load_from_cache(
        TARGET[0], "config.json", cache_dir=hf_cache, revision=TARGET[1]
    ) == str(target / "config.json")

    checks = _preflight(home)
    assert checks.passed, checks.failures()
    manifest, variant = find_candidate(load_registry(extra=home.user_registry), CANDIDATE)
    recipe = resolve_recipe(
        manifest, variant, home.models, home.hf_cache, fingerprint=lambda p: "unused"
    )
    assert (recipe.model_path, recipe.draft_path) == (str(target), str(draft))
    assert recipe.artifact_hashes == {
        "target": f"inventory:{by_role['target'].digest}",
        "draft": f"inventory:{by_role['draft'].digest}",
    }

    # same size, one byte changed: the sha256 check before use catches it
    weights = _blob(target, "model.safetensors")
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    check = hub.verify_snapshot(target)
    assert not check.ok
    assert check.problems[0].startswith("model.safetensors: sha256 ")
    with pytest.raises(hub.ArtifactTampered, match="model.safetensors"):
        resolve_recipe(manifest, variant, home.models, home.hf_cache, fingerprint=lambda p: "x")
    # preparing again offline never blesses the changed bytes
    with pytest.raises(hub.ArtifactTampered, match="differ from the sha256 inventory"):
        prepare_candidate(home, CANDIDATE, progress=False)

    # a resized file and an extra file are caught by the cheap check every preflight makes
    tokenizer = _blob(draft, "tokenizer.json")
    tokenizer.write_bytes(tokenizer.read_bytes() + b" ")
    (draft / "evil.py").write_text("print('hi')\n")
    failed = {c.name: c.detail for c in _preflight(home).checks if not c.passed}
    assert set(failed) == {"integrity"}
    assert "not in the inventory: evil.py" in failed["integrity"]
    assert "tokenizer.json: " in failed["integrity"]


def test_offline_prepare_names_everything_missing(
    home: Home, hf_cache: Path, demo_models: dict[str, Path]
) -> None:
    serve_from_cache(
        home, build_cache(hf_cache, *TARGET, demo_models["target"], skip=("config.json",))
    )
    write_manifest(home)
    policy = home.user_policy / "test.yaml"  # the demo policy allows no download at all
    data = yaml.safe_load(policy.read_text())
    data["budgets"]["download_gb"] = 1
    policy.write_text(yaml.safe_dump(data))
    with pytest.raises(hub.OfflineMissing) as info:
        prepare_candidate(home, CANDIDATE, progress=False)
    message = str(info.value)
    assert "offline (HF_HUB_OFFLINE is set)" in message
    assert f"target {TARGET[0]}@{TARGET[1]}: the cached snapshot lacks config.json" in message
    assert f"draft {DRAFT[0]}@{DRAFT[1]}: no snapshot in the cache" in message
    assert str(hf_cache) in message
    assert not hub.inventory_path(hub.snapshot_path(hf_cache, *TARGET)).exists()


def test_the_budget_is_checked_before_any_download(tmp_path: Path) -> None:
    policy = load_policy("default")
    manifest = load_registry()["qwen38-dflash2-v1"]
    plans = [
        hub.plan_artifact(a, tmp_path / "empty-cache", offline=True)
        for a in hub.candidate_artifacts(manifest, draft=True)
    ]
    assert [p.estimated for p in plans] == [True, True]
    assert sum(p.download_bytes for p in plans) == int(16e9) + int(3.85e9)
    assert hub.check_budget(plans, manifest, policy, free_bytes=10**12) == []
    small = policy.model_copy(
        update={"budgets": policy.budgets.model_copy(update={"download_gb": 10, "disk_gb": 10})}
    )
    problems = hub.check_budget(plans, manifest, small, free_bytes=5 * 10**9)
    assert problems == [
        "19.85 GB to download exceeds the policy's download budget of 10 GB",
        "only 5.00 GB free in the cache's file system; 19.85 GB must be downloaded (+1 GB margin)",
        "the manifest needs 20 GB of disk; the policy's disk budget is 10 GB",
    ]


def test_only_the_runtime_files_are_fetched_never_code() -> None:
    ref = ArtifactRef(role="target", repo="mlx-community/x", revision="a" * 40)
    wanted = [
        n
        for n in (
            "config.json",
            "model-00001-of-00002.safetensors",
            "tokenizer.json",
            "chat_template.jinja",
            "modeling_x.py",
            "pytorch_model.bin",
            "README.md",
        )
        if hub._wanted(n, list(ref.files) or hub.DEFAULT_ALLOW_PATTERNS)
    ]
    assert wanted == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
    ]


def test_prepare_command(
    home: Home, hf_cache: Path, demo_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    serve_from_cache(home, build_cache(hf_cache, *TARGET, demo_models["target"]))
    build_cache(hf_cache, *DRAFT, demo_models["draft"])
    write_manifest(home)
    assert cli.main(["--home", str(home.root), "prepare", CANDIDATE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [a["role"] for a in out["artifacts"]] == ["target", "draft"]
    code = cli.main(["--home", str(home.root), "prepare", "qwen38-dflash2-v1:dflash-b4"])
    err = capsys.readouterr().err
    if hub.os.uname().sysname != "Darwin":
        assert code == 2
        assert "preflight fails, nothing downloaded: platform: this machine is" in err
    else:  # the platform passes there; offline, nothing can be downloaded either way
        assert code != 0 and "platform: this machine is" not in err
