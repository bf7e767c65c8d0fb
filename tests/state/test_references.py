"""Where a configuration's kept answers live (``state.references``): one file per
configuration, under a key that any change to what decides its answers changes."""

from __future__ import annotations

from pathlib import Path

from mcp_infra.contracts import Knobs, Recipe
from mcp_infra.core.reference import answers_of
from mcp_infra.state import references
from mcp_infra.state.store import Home
from tests.core.test_reference import CAP, PASS, TASKS, measured


def recipe(folder: Path, **knobs: object) -> Recipe:
    return Recipe(
        candidate_id="demo:target",
        template="mlx_lm_server",
        model_path=str(folder),
        knobs=Knobs.model_validate(knobs),
    )


def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"\x00" * 64)
    return folder


def test_the_key_is_the_configuration_not_its_name(tmp_path: Path) -> None:
    folder = model(tmp_path)
    key = references.reference_key(recipe(folder))
    renamed = recipe(folder).model_copy(update={"candidate_id": "demo:draft-k4"})
    assert references.reference_key(renamed) == key  # a promoted winner is the next baseline
    assert references.reference_key(recipe(folder, num_draft_tokens=2)) != key
    (folder / "model.safetensors").write_bytes(b"\x01" + b"\x00" * 63)  # one byte of weights
    assert references.reference_key(recipe(folder)) != key


def test_answers_are_kept_merged_and_read_back_for_their_configuration(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    folder = model(tmp_path)
    live = recipe(folder)
    assert references.load(home, live) is None
    references.keep(home, live, answers_of(measured(), PASS[:2], [], CAP, "c-1"))
    references.keep(home, live, answers_of(measured(), PASS, TASKS, CAP, "c-2"))
    kept = references.load(home, live)
    assert kept is not None and len(kept.answers) == 5
    assert {a.cycle_id for a in kept.answers} == {"c-2"}  # the newest of each
    assert references.load(home, recipe(folder, prompt_cache_size=0)) is None  # another one
    files = list(home.references.glob("*.json"))
    assert [f.stem for f in files] == [references.reference_key(live)]


def test_an_unreadable_file_only_means_asking_again(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    live = recipe(model(tmp_path))
    references.keep(home, live, answers_of(measured(), PASS, [], CAP, "c-1"))
    (path,) = home.references.glob("*.json")
    path.write_text("{ not json")
    assert references.load(home, live) is None
    references.keep(home, live, answers_of(measured(), PASS, [], CAP, "c-2"))  # written anew
    kept = references.load(home, live)
    assert kept is not None and {a.cycle_id for a in kept.answers} == {"c-2"}


def test_only_the_configurations_written_last_are_kept(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()
    folder = model(tmp_path)
    configurations = [recipe(folder, num_draft_tokens=k) for k in range(1, references.KEEP + 3)]
    for live in configurations:
        references.keep(home, live, answers_of(measured(), PASS, [], CAP, "c-1"))
    assert len(list(home.references.glob("*.json"))) == references.KEEP
    assert references.load(home, configurations[-1]) is not None
    assert references.load(home, configurations[0]) is None


def test_a_split_configurations_answers_are_never_kept(tmp_path: Path) -> None:
    """Its greedy outputs depend on its hosts too (the order of reductions across them)."""
    home = Home(tmp_path / "home").ensure()
    split = recipe(model(tmp_path), ranks=2)
    references.keep(home, split, answers_of(measured(), PASS, [], CAP, "c-1"))
    assert references.load(home, split) is None
    assert not home.references.exists() or not list(home.references.glob("*.json"))
