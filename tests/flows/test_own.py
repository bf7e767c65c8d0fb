"""`init --model`: a home whose live service serves a model folder the project did not build,
the catalog generated for it, and every bad input refused with its own error, writing nothing.

Fast: the models are built in-process (tests/helpers/ownmodels.py); the runtimes' --help texts
are the recorded ones (``seed_help``), so no runtime process starts here.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import ServiceConfig
from mcp_infra.faces import cli, render
from mcp_infra.flows import api as app
from mcp_infra.flows.own import OWN_BASELINE
from mcp_infra.state import modelfolder as mfo
from mcp_infra.state.catalog import policy_dir
from mcp_infra.state.context import HomeContext
from mcp_infra.state.store import Home, read_model
from tests.helpers.ownmodels import DRAFTER, OTHER_TOKENIZER, build_model, into_hub_cache, seed_help


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("own")
    return {
        "target": build_model(root / "target"),
        "other": build_model(root / "dirs" / "other", OTHER_TOKENIZER),
        "draft": into_hub_cache(root / "hub", "someone/tiny-draft", DRAFTER),
    }


@pytest.fixture
def cache(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    hub = built["draft"].parents[2]
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub


@pytest.fixture
def fresh(tmp_path: Path, cache: Path) -> Home:
    seed_help(tmp_path / "home")
    return Home(tmp_path / "home")


def snapshot(root: Path) -> dict[str, str]:
    """Every file under a folder with the sha256 of its bytes (a home "as it was")."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_init_serves_the_folder_and_generates_its_catalog(
    fresh: Home, built: dict[str, Path]
) -> None:
    view = app.init_model(
        fresh, str(built["target"]), app.InitOptions(model_dirs=[str(built["other"].parent)])
    )
    assert view.config == "written" and view.template == "mlx_lm_server"
    config = read_model(fresh.config, ServiceConfig)
    assert config.model is not None and config.model.digest == view.model.digest
    assert config.baseline.candidate_id == OWN_BASELINE
    assert config.baseline.artifact_hashes == {"target": f"files:{view.model.digest}"}
    assert view.candidates == {
        "server_tuning": 8,
        "kv_cache": 2,
        "quantization": 7,
        "acceleration_plugin": 4,
    }
    recorded = mfo.inventory_path(fresh, view.model.digest)
    assert {f["path"] for f in json.loads(recorded.read_text())["files"]} == {
        p.name for p in built["target"].iterdir()
    }


def test_the_registry_lists_the_catalog_beside_the_pinned_entries(
    fresh: Home, built: dict[str, Path]
) -> None:
    app.init_model(fresh, str(built["target"]), app.InitOptions(model_dirs=[str(built["other"])]))
    view = app.registry_view(fresh)
    own = {c.id: c for c in view.candidates if c.id.startswith("own-")}
    assert len(own) >= 8 and len({c.candidate_class for c in own.values()}) >= 3
    assert {"demo-tiny:draft-k2", "qwen38-dflash2-v1:dflash-b3"} <= {c.id for c in view.candidates}
    failing = {c.id: {k.name: k.detail for k in c.checks if not k.passed} for c in own.values()}
    assert failing["own-draft-tiny-draft:k2"] == {}
    assert failing["own-kv:kv4-g32"] == {}
    assert list(failing["own-draft-other:k2"]) == ["drafter_tokenizer"]
    demo_kv = next(c for c in view.candidates if c.id == "demo-tiny:kv8")
    refused = {k.name for k in demo_kv.checks if not k.passed}
    assert {"same_target", "kv_group"} <= refused
    assert [n.subject for n in view.not_offered] == ["own MTP head"]
    # What may be proposed comes first: another model's pinned entries fail preflight and last.
    passed = [c.preflight_passed for c in view.candidates]
    assert passed[0] and passed == sorted(passed, reverse=True) and not passed[-1]
    builds = [c.title for c in own.values() if c.candidate_class == "quantization"]
    assert any(t.startswith("a build: 8-bit affine weights in groups of 64") for t in builds)
    text = render.registry_text(view)
    assert "not offered for this model: own MTP head" in text
    # No cycle has measured anything here: every candidate's cost is the same, said once.
    assert text.count("alone in a plan") == 1, text
    assert "\neach candidate that passes preflight, alone in a plan: projected cost unknown" in text


def test_registry_filters_by_class_preflight_and_verdict(
    fresh: Home, built: dict[str, Path]
) -> None:
    app.init_model(fresh, str(built["target"]))
    kv = app.registry_view(fresh, only=app.RegistryFilter(candidate_class="kv_cache"))
    assert {c.id for c in kv.candidates} == {"own-kv:kv8-g32", "own-kv:kv4-g32", "demo-tiny:kv8"}
    passing = app.registry_view(fresh, only=app.RegistryFilter(preflight="passed"))
    assert passing.candidates and all(c.preflight_passed for c in passing.candidates)
    assert all(c.id.startswith("own-") for c in passing.candidates)
    tried = app.registry_view(fresh, only=app.RegistryFilter(verdict="qualified"))
    assert tried.candidates == []


def test_one_invalid_manifest_is_reported_beside_the_others(
    fresh: Home, built: dict[str, Path]
) -> None:
    app.init_model(fresh, str(built["target"]))
    fresh.user_registry.mkdir()
    (fresh.user_registry / "broken.yaml").write_text(
        yaml.safe_dump({"schema_version": 1, "id": "broken", "target": {"path": "x"}})
    )
    view = app.registry_view(fresh)
    assert any(c.id == "own-kv:kv8-g32" for c in view.candidates)
    assert len(view.problems) == 1 and view.problems[0].startswith("broken.yaml: invalid manifest")


def test_a_home_manifest_may_name_a_local_folder_as_its_target(
    fresh: Home, built: dict[str, Path]
) -> None:
    app.init_model(fresh, str(built["target"]))
    fresh.user_registry.mkdir()
    manifest = {
        "schema_version": 1,
        "id": "mine-prefill",
        "title": "my own setting",
        "class": "server_tuning",
        "semantics": "lossless",
        "license_reviewed": True,
        "runtime": {"template": "mlx_lm_server", "platforms": ["linux-x86_64", "darwin-arm64"]},
        "target": {"role": "target", "path": str(built["target"])},
        "variants": [{"id": "p256", "knobs": {"prefill_step_size": 256}}],
    }
    (fresh.user_registry / "mine-prefill.yaml").write_text(yaml.safe_dump(manifest))
    elsewhere = {**manifest, "id": "elsewhere", "target": {"role": "target", "path": "/no/such"}}
    (fresh.user_registry / "elsewhere.yaml").write_text(yaml.safe_dump(elsewhere))
    view = app.registry_view(fresh)
    by_id = {c.id: c for c in view.candidates}
    assert view.problems == []
    assert by_id["mine-prefill:p256"].preflight_passed
    refused = {k.name: k.detail for k in by_id["elsewhere:p256"].checks if not k.passed}
    assert refused["same_target"] == (
        "another model's candidate: its target is /no/such, not the live model"
    )


def test_a_hub_repo_in_the_local_cache_is_a_model_too(fresh: Home, built: dict[str, Path]) -> None:
    view = app.init_model(fresh, "someone/tiny-draft")
    assert view.model.repo == "someone/tiny-draft" and view.model.path == str(built["draft"])
    assert read_model(fresh.config, ServiceConfig).baseline.model_path == str(built["draft"])


def test_init_again_updates_the_model_and_keeps_the_rest(
    fresh: Home, built: dict[str, Path]
) -> None:
    first = app.init_model(fresh, str(built["target"]), app.InitOptions(port=18123))
    again = app.init_model(fresh, "someone/tiny-draft")
    assert (first.config, again.config) == ("written", "updated")
    config = read_model(fresh.config, ServiceConfig)
    assert config.port == 18123 and config.model and config.model.repo == "someone/tiny-draft"
    assert HomeContext(fresh).catalog is not None


def _bad_folders(root: Path, target: Path) -> dict[str, tuple[Path, type[Exception], str]]:
    def copy(name: str, drop: str | None = None) -> Path:
        folder = shutil.copytree(target, root / name)
        if drop:
            for path in folder.glob(drop):
                path.unlink()
        return folder

    odd = copy("odd-arch")
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "model_type": "zz_unknown"}))
    return {
        "no config": (copy("no-config", "config.json"), mfo.NotAModelFolder, "config.json"),
        "no weights": (copy("no-weights", "*.safetensors"), mfo.NotAModelFolder, "weights"),
        "no tokenizer": (copy("no-tok", "tokenizer.json"), mfo.NotAModelFolder, "a tokenizer"),
        "unknown architecture": (odd, mfo.UnsupportedArchitecture, "model_type 'zz_unknown'"),
    }


@pytest.mark.parametrize(
    "case", ["no config", "no weights", "no tokenizer", "unknown architecture"]
)
@pytest.mark.parametrize("existing", [False, True])
def test_a_bad_folder_gets_its_own_error_and_the_home_stays_as_it_was(
    tmp_path: Path, cache: Path, built: dict[str, Path], case: str, existing: bool
) -> None:
    home = Home(tmp_path / "home")
    if existing:
        seed_help(home.root)
        app.init_model(home, str(built["target"]))
    folder, error, said = _bad_folders(tmp_path / "bad", built["target"])[case]
    before = snapshot(home.root)
    with pytest.raises(error, match=said.replace("(", r"\(")):
        app.init_model(home, str(folder))
    assert snapshot(home.root) == before
    assert home.root.exists() == existing


def test_a_model_that_does_not_fit_is_refused(
    tmp_path: Path, cache: Path, built: dict[str, Path]
) -> None:
    home = Home(tmp_path / "home")
    home.user_policy.mkdir(parents=True)
    data = yaml.safe_load((policy_dir() / "default.yaml").read_text())
    data["name"] = "tiny-budget"
    data.setdefault("service", {})["memory_budget_fraction"] = 1e-6
    (home.user_policy / "tiny-budget.yaml").write_text(yaml.safe_dump(data))
    before = snapshot(home.root)
    with pytest.raises(mfo.DoesNotFit, match="does not fit this machine under policy tiny-budget"):
        app.init_model(home, str(built["target"]), app.InitOptions(policy="tiny-budget"))
    assert snapshot(home.root) == before


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("someone/absent", "not in the local Hugging Face cache"),
        ("/no/such/folder", "no such folder"),
    ],
)
def test_a_model_that_is_not_here_is_refused(
    tmp_path: Path, cache: Path, given: str, said: str
) -> None:
    home = Home(tmp_path / "home")
    with pytest.raises(mfo.ModelFolderError, match=said):
        app.init_model(home, given)
    assert not home.root.exists()


def test_the_cli_says_why_and_exits_2(
    tmp_path: Path, cache: Path, built: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _bad_folders(tmp_path / "bad", built["target"])["no weights"][0]
    code = cli.main(["--home", str(tmp_path / "home"), "init", "--model", str(folder)])
    assert code == 2
    assert "is not a model folder: it has no weights (*.safetensors)" in capsys.readouterr().err


def test_a_folder_changed_after_init_is_refused_before_any_start(
    fresh: Home, tmp_path: Path, built: dict[str, Path]
) -> None:
    from mcp_infra.procs.runtime import ServerStartError
    from mcp_infra.procs.service import start_backend

    folder = shutil.copytree(built["target"], tmp_path / "mine")
    app.init_model(fresh, str(folder))
    (folder / "tokenizer_config.json").write_text("{}")
    config = read_model(fresh.config, ServiceConfig)
    before = snapshot(fresh.root)
    with pytest.raises(ServerStartError) as caught:
        start_backend(
            fresh,
            config.baseline,
            role="backend",
            log=fresh.logs / "x.log",
            cycle_id=None,
            timeout=5,
        )
    assert "tokenizer_config.json: " in str(caught.value) and "init --model" in str(caught.value)
    assert snapshot(fresh.root) == before


def test_a_catalog_that_cannot_be_made_is_reported_not_raised(
    fresh: Home, built: dict[str, Path]
) -> None:
    app.init_model(fresh, str(built["target"]))
    made = fresh.root / "catalog" / "generated.json"
    made.unlink()
    made.mkdir()  # a folder where the catalog's file belongs: it can be neither read nor written
    view = app.registry_view(fresh)
    assert any(c.id == "demo-tiny:draft-k2" for c in view.candidates)
    assert not any(c.id.startswith("own-") for c in view.candidates)
    assert len(view.problems) == 1
    assert view.problems[0].startswith("the catalog for the configured model: ")
