"""The identity of a model folder: the sha256 of every file in it, and what changed since.

One scheme for every folder of model files the project names (a user's model folder, a build
made by ``mlx_lm.convert``, a converted GGUF): each file by relative path, size and sha256,
and one digest over that sorted list (``store.inventory_digest``, as for hub snapshots).
Links are followed: a file is what it holds, wherever it lives (hub snapshots link to blobs).
"""

from __future__ import annotations

import os
from pathlib import Path

from mcp_infra.contracts import InventoryFile
from mcp_infra.errors import McpInfraError
from mcp_infra.state.store import file_sha256, inventory_digest

__all__ = [
    "FolderError",
    "folder_digest",
    "folder_inventory",
    "folder_size",
    "inventory_changes",
    "inventory_digest",
]


class FolderError(McpInfraError, ValueError):
    """A model folder that cannot be read as one (missing, a broken link, not a folder)."""


def _files(folder: Path) -> dict[str, Path]:
    """Every regular file under ``folder`` by its relative POSIX path, links followed. Hidden
    entries (``.git``, the ``.cache`` that ``hf download --local-dir`` writes) are no part of
    a model: they change when nothing the runtime reads does."""
    if not folder.is_dir():
        raise FolderError(f"{folder}: not a folder")
    found: dict[str, Path] = {}
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in (n for n in names if not n.startswith(".")):
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if not path.exists():
                raise FolderError(f"{folder}: {rel} is a broken link")
            if path.is_file():
                found[rel] = path
    return dict(sorted(found.items()))


def folder_inventory(folder: Path) -> list[InventoryFile]:
    """(relative path, size, sha256) of every file, sorted by path (hashes memoized by stat)."""
    return [
        InventoryFile(path=rel, size=path.stat().st_size, sha256=file_sha256(path))
        for rel, path in _files(folder).items()
    ]


def folder_digest(folder: Path) -> str:
    """The folder's identity: sha256 over its sorted (path, size, sha256) list."""
    return inventory_digest(folder_inventory(folder))


def folder_size(folder: Path) -> int:
    """Bytes of every file under ``folder`` (links followed), without hashing."""
    return sum(path.stat().st_size for path in _files(folder).values())


def inventory_changes(recorded: list[InventoryFile], now: list[InventoryFile]) -> list[str]:
    """What differs between a recorded inventory and the folder now (empty: nothing), one line
    per file: missing, added, resized or changed."""
    before = {f.path: f for f in recorded}
    after = {f.path: f for f in now}
    problems = [f"missing: {name}" for name in sorted(set(before) - set(after))]
    problems += [f"added: {name}" for name in sorted(set(after) - set(before))]
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        if old.size != new.size:
            problems.append(f"{name}: {new.size} bytes, recorded {old.size}")
        elif old.sha256 != new.sha256:
            problems.append(f"{name}: sha256 {new.sha256[:12]}…, recorded {old.sha256[:12]}…")
    return problems
