"""The read cache behind fast `status`/`registry`: an edited file is read again, and a caller
cannot change what the next caller gets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_infra.state.filecache import installed_version, load_yaml
from mcp_infra.state.store import Home


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


@pytest.mark.anyio
async def test_registry_answer_follows_a_new_manifest(home: Home, anyio_backend: str) -> None:
    """The `registry` tool's cached answer is recomputed when a manifest is added."""
    import yaml
    from mcp import Client

    from mcp_infra.faces.mcp_server import build_server
    from mcp_infra.state.datafiles import shipped_dir

    async with Client(build_server(home, "read-only", start_supervisor=False)) as client:
        first = await client.call_tool("registry", {})
        again = await client.call_tool("registry", {})
        assert first.structured_content == again.structured_content
        data = yaml.safe_load((shipped_dir("registry") / "demo-tiny.yaml").read_text())
        data["id"] = "demo-copy"
        home.user_registry.mkdir(parents=True, exist_ok=True)
        (home.user_registry / "demo-copy.yaml").write_text(yaml.safe_dump(data))
        later = await client.call_tool("registry", {})
        copy = await client.call_tool("registry", {"candidate_id": "demo-copy:draft-k2"})
    # the list pages; its summary opens every page and counts every manifest
    assert "demo-copy" in later.structured_content["summary"]["manifests"]
    assert "demo-copy" not in first.structured_content["summary"]["manifests"]
    assert [c["id"] for c in copy.structured_content["candidates"]] == ["demo-copy:draft-k2"]
