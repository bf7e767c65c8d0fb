"""The read cache behind fast `status`/`registry`: an edited file is read again, and a caller
cannot change what the next caller gets."""

from __future__ import annotations

import os
from pathlib import Path

from mcp_infra.state.filecache import installed_version, load_yaml


def test_an_edit_is_seen_and_copies_are_private(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("a: 1\nb: [1, 2]\n")
    first = load_yaml(path)
    first["b"].append(3)
    assert load_yaml(path) == {"a": 1, "b": [1, 2]}
    path.write_text("a: 2\nb: [1, 2]\n")  # same size, new content
    stamp = path.stat().st_mtime_ns
    os.utime(path, ns=(stamp + 1_000_000, stamp + 1_000_000))
    assert load_yaml(path)["a"] == 2


def test_installed_version_matches_metadata() -> None:
    from importlib import metadata

    assert installed_version("pydantic") == metadata.version("pydantic")
    assert installed_version("no-such-package-mcp-infra") is None
