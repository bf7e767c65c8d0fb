"""Model folders on this machine: facts read from real folders (a Llama with its own shapes and
tokenizer, built in-process by mlx-lm's own classes), their identity and the check that names
what changed, hub repos resolved from a local cache, the runtime that loads a model_type."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mcp_infra.contracts import ModelShape, Recipe
from mcp_infra.state import modelfolder as mfo
from mcp_infra.state.store import Home
from tests.helpers.ownmodels import DRAFTER, OTHER_TOKENIZER, REVISION, build_model, into_hub_cache


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("own")
    return {
        "target": build_model(root / "target"),
        "other": build_model(root / "other", OTHER_TOKENIZER),
        "draft": into_hub_cache(root / "hub", "someone/tiny-draft", DRAFTER),
        "hub": root / "hub",
    }


def test_facts_of_a_folder_the_project_did_not_build(models: dict[str, Path]) -> None:
    facts = mfo.folder_facts(models["target"])
    assert facts.missing == []
    assert facts.shape is not None and facts.shape.model_type == "llama"
    assert (facts.shape.head_dim, facts.shape.num_layers) == (32, 4)
    assert facts.tokenizer is not None and facts.tokenizer.vocab_size == 700
    assert facts.tokenizer.special["eos"] == facts.tokenizer.special["</s>"]
    assert facts.chat_template
    assert facts.weights_bytes == (models["target"] / "model.safetensors").stat().st_size
    assert "mlx_lm_server" in facts.loaders


def test_a_drafter_of_the_same_tokenizer_and_one_of_another(models: dict[str, Path]) -> None:
    from mcp_infra.core.modelfacts import tokenizer_differences

    target = mfo.folder_facts(models["target"]).tokenizer
    draft = mfo.folder_facts(models["draft"]).tokenizer
    other = mfo.folder_facts(models["other"]).tokenizer
    assert target and draft and other
    assert tokenizer_differences(target, draft) == []
    assert tokenizer_differences(target, other) == [
        "another vocabulary (600 tokens against the target's 700)"
    ]


def test_loaders_follow_the_installed_runtime_modules() -> None:
    assert "mlx_lm_server" in mfo.loaders(ModelShape(model_type="llama"))
    assert "mlx_lm_server" in mfo.loaders(ModelShape(model_type="mistral"))  # mlx-lm remaps it
    assert mfo.loaders(ModelShape(model_type="no_such_architecture")) == []


def test_hidden_entries_are_no_part_of_the_identity(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    copy = shutil.copytree(models["target"], tmp_path / "m")
    before = mfo.record_inventory(Home(tmp_path / "home"), copy)
    (copy / ".git").mkdir()
    (copy / ".git" / "HEAD").write_text("ref: refs/heads/main")
    (copy / ".DS_Store").write_text("x")
    assert mfo.inventory(copy) == before.files
    (copy / "README.md").write_text("notes")  # a visible file is part of the folder
    assert "README.md" in [f.path for f in mfo.inventory(copy)]


def test_a_changed_folder_is_refused_with_what_changed(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    home = Home(tmp_path / "home")
    copy = shutil.copytree(models["target"], tmp_path / "m")
    recorded = mfo.record_inventory(home, copy)
    mfo.verify_folder(home, copy, recorded.digest)  # unchanged: passes
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    (copy / "generation_config.json").unlink()
    (copy / "extra.json").write_text("{}")
    with pytest.raises(mfo.FolderChanged) as caught:
        mfo.verify_folder(home, copy, recorded.digest)
    said = str(caught.value)
    assert "missing: generation_config.json" in said
    assert "added: extra.json" in said
    assert "model.safetensors: sha256" in said
    recipe = Recipe(
        candidate_id="own:x",
        template="mlx_lm_server",
        model_path=str(copy),
        artifact_hashes={"target": mfo.FILES_PREFIX + recorded.digest},
    )
    with pytest.raises(mfo.FolderChanged):
        mfo.verify_recipe_folders(home, recipe)


def test_without_a_recorded_list_a_change_is_still_refused(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    copy = shutil.copytree(models["target"], tmp_path / "m")
    digest = mfo.record_inventory(Home(tmp_path / "a"), copy).digest
    (copy / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(mfo.FolderChanged, match="no file list was recorded"):
        mfo.verify_folder(Home(tmp_path / "b"), copy, digest)


def test_a_hub_repo_resolves_from_the_local_cache_only(models: dict[str, Path]) -> None:
    snapshot, repo, revision = mfo.resolve_hub("someone/tiny-draft", models["hub"])
    assert (snapshot, repo, revision) == (models["draft"], "someone/tiny-draft", REVISION)
    assert mfo.resolve_hub(f"someone/tiny-draft@{REVISION}", models["hub"])[0] == models["draft"]
    with pytest.raises(mfo.NotCached, match="not in the local Hugging Face cache"):
        mfo.resolve_hub("someone/absent", models["hub"])
    with pytest.raises(mfo.NotCached):
        mfo.resolve_hub("someone/tiny-draft@" + "f" * 40, models["hub"])
    with pytest.raises(mfo.NotAModelFolder, match="neither a model folder"):
        mfo.resolve_hub("not a repo", models["hub"])


def test_local_models_come_from_the_hub_cache_and_named_folders(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    found = mfo.local_models([models["hub"]], [str(models["other"].parent)])
    paths = [p.resolve() for p, _ in found]
    assert models["draft"].resolve() in paths
    assert models["other"].resolve() in paths and models["target"].resolve() in paths
    origins = dict((str(p), o) for p, o in found)
    assert origins[str(models["draft"])] == "hub cache: someone/tiny-draft@0123456789ab"
    assert mfo.local_models([tmp_path / "no-cache"], [str(tmp_path / "none")]) == []
