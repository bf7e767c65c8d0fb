"""Reads that repeat on every `status` / `registry` call, cached while their files are unchanged.

An MCP session asks `registry` and `status` over and over; between two calls the manifests,
policies and installed packages almost never change. A parsed YAML file is kept keyed by the
file's identity, size and modification time (a changed file is parsed again); an installed
package's version is kept keyed by the modification times of the import path's folders (an
install or uninstall adds or removes a ``*.dist-info`` folder there). Callers get a deep copy,
so nothing they do changes the cache.
"""

from __future__ import annotations

import copy
import os
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from mcp_infra.contracts import JSONValue

# Any: the C loader exists only where PyYAML was built with libyaml (the stubs cannot say)
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_lock = threading.Lock()
_yaml: dict[str, tuple[tuple[int, int, int], JSONValue]] = {}
_versions: dict[str, tuple[tuple[int, ...], str | None]] = {}


def _identity(path: Path) -> tuple[int, int, int]:
    info = path.stat()
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def load_yaml(path: Path) -> JSONValue:
    """``yaml.safe_load`` of the file, parsed again only when the file changed."""
    key = str(path)
    stamp = _identity(path)
    with _lock:
        hit = _yaml.get(key)
    if hit is None or hit[0] != stamp:
        data = _safe_load(path.read_bytes())
        if _identity(path) == stamp:  # not rewritten while it was read
            with _lock:
                _yaml[key] = (stamp, data)
        return copy.deepcopy(data)
    return copy.deepcopy(hit[1])


def _safe_load(text: bytes) -> JSONValue:
    """``yaml.safe_load``, with libyaml's safe loader where PyYAML was built with it."""
    loader = _Loader(text)
    try:
        data: JSONValue = loader.get_single_data()
        return data
    finally:
        loader.dispose()


def _path_stamp() -> tuple[int, ...]:
    stamps = []
    for entry in sys.path:
        try:
            stamps.append(os.stat(entry or ".").st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


def installed_version(package: str) -> str | None:
    """``importlib.metadata.version``, looked up again only when the import path changed."""
    stamp = _path_stamp()
    with _lock:
        hit = _versions.get(package)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        version: str | None = metadata.version(package)
    except metadata.PackageNotFoundError:
        version = None
    with _lock:
        _versions[package] = (stamp, version)
    return version


def clear() -> None:
    with _lock:
        _yaml.clear()
        _versions.clear()
