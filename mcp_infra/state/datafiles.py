"""Where the shipped manifests, policies and suites are, however mcp-infra was installed.

The repository's top-level ``registry/`` and ``policy/`` folders are the only copy. A wheel
(``pip install .``, ``pipx install .``, ``uvx --from .``) carries them as package data under
``mcp_infra/shipped/`` (setuptools maps the folders there, see pyproject.toml); a source checkout
or an editable install has no such folder and reads the repository's own folders, so edits are
seen at once.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Literal

Kind = Literal["registry", "policy", "suites"]
_PARTS: dict[str, tuple[str, ...]] = {
    "registry": ("registry",),
    "policy": ("policy",),
    "suites": ("policy", "suites"),
}


def shipped_dir(kind: Kind) -> Path:
    """The folder of shipped ``kind`` files: the wheel's package data, else the checkout's."""
    parts = _PARTS[kind]
    packaged = files("mcp_infra").joinpath("shipped", *parts)
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2].joinpath(*parts)
