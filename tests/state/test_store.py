"""The home directory: atomic contract files, the fsynced journal, the supervisor lock."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mcp_infra.contracts import CycleState, Event, Recipe
from mcp_infra.state.evidence import list_cycles
from mcp_infra.state.store import (
    CorruptFile,
    Home,
    LockHeld,
    read_model,
    write_bytes_atomic,
    write_model,
)
from tests.helpers.paths import SHIPPED

RECIPE = Recipe(candidate_id="demo-tiny:target", template="mlx_lm_server", model_path="/m")


def test_contract_roundtrip_json_and_yaml(tmp_path: Path) -> None:
    for name in ("r.json", "r.yaml"):
        write_model(tmp_path / name, RECIPE)
        assert read_model(tmp_path / name, Recipe) == RECIPE
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_corrupt_or_foreign_files_are_reported_not_trusted(tmp_path: Path) -> None:
    (tmp_path / "trunc.json").write_text(RECIPE.model_dump_json()[:20])
    with pytest.raises(CorruptFile, match="trunc.json"):
        read_model(tmp_path / "trunc.json", Recipe)
    data = RECIPE.model_dump(mode="json") | {"surprise": 1}
    (tmp_path / "extra.json").write_text(json.dumps(data))
    with pytest.raises(CorruptFile, match="extra.json"):
        read_model(tmp_path / "extra.json", Recipe)


def test_failed_write_leaves_the_previous_file_intact(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_model(target, RECIPE)
    before = target.read_bytes()

    with pytest.raises(TypeError):
        write_bytes_atomic(target, object())  # type: ignore[arg-type]
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_home_raises_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_model(target, RECIPE)
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            write_model(target, RECIPE.model_copy(update={"model_path": "/other"}))
    finally:
        tmp_path.chmod(0o700)
    assert read_model(target, Recipe) == RECIPE


def test_journal_appends_and_reports_a_torn_line(tmp_path: Path) -> None:
    home = Home(tmp_path).ensure()
    for state in (CycleState.QUEUED, CycleState.PREFLIGHT):
        home.append_event(Event(ts=datetime.now(UTC), cycle_id="c-1", state=state, message="m"))
    with home.journal("c-1").open("a") as handle:
        handle.write('{"schema_version": 1, "ts": "2026-')  # a write cut by a power loss
    events, problems = home.read_journal("c-1")
    assert [e.state for e in events] == [CycleState.QUEUED, CycleState.PREFLIGHT]
    assert problems == ["journal.ndjson line 3 is not a valid event (torn write?)"]


def test_only_one_supervisor_holds_the_lock(tmp_path: Path) -> None:
    home = Home(tmp_path).ensure()
    code = (
        "import sys,time; from mcp_infra.state.store import Home\n"
        "with Home(sys.argv[1]).supervisor_lock():\n print('held', flush=True); time.sleep(30)"
    )
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == b"held"
        assert home.lock_is_held()
        with pytest.raises(LockHeld), home.supervisor_lock():
            pass
    finally:
        other.kill()
        other.wait()
    assert not home.lock_is_held()  # the lock dies with its holder: no stale lock files
    with home.supervisor_lock():
        assert home.lock_is_held()


@contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """This process may write no file past ``limit`` bytes: what a full disk does to a write
    (EFBIG instead of ENOSPC; Python ignores SIGXFSZ), without a disk to fill."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_journal_line_without_room_is_cut_off_not_left_torn(tmp_path: Path) -> None:
    home = Home(tmp_path / "home").ensure()

    def event(message: str) -> Event:
        return Event(
            ts=datetime.now(UTC), cycle_id="c-1", state=CycleState.EXPERIMENT, message=message
        )

    home.append_event(event("first"))
    size = home.journal("c-1").stat().st_size
    with file_size_limit(size + 10), pytest.raises(OSError):  # ten bytes of the line fit
        home.append_event(event("second, longer than ten bytes"))
    assert home.journal("c-1").stat().st_size == size
    home.append_event(event("third"))
    events, problems = home.read_journal("c-1")
    assert [e.message for e in events] == ["first", "third"] and problems == []


def test_a_bundle_being_sealed_is_not_listed(tmp_path: Path) -> None:
    """``seal`` writes a bundle in a hidden folder and renames it when complete; pathlib's ``*``
    matches that folder too, so a cycle could be listed (twice, or before its bundle is in
    place) while it is sealed."""
    home = Home(tmp_path / "home").ensure()
    shipped = SHIPPED[0]
    shutil.copytree(shipped, home.evidence / shipped.name)
    shutil.copytree(shipped, home.evidence / f".{shipped.name}.tmp")
    assert [s.cycle_id for s in list_cycles(home)] == [shipped.name]
    assert home.bundle_dirs() == [home.evidence / shipped.name]
