"""The shipped and the home's own configuration: manifests, policies and prompt suites.

Trusted YAML read from disk and validated into contracts; a broken file raises with its name.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from mcp_infra.contracts import ID_PATTERN, Manifest, Policy
from mcp_infra.core.suites import Suite
from mcp_infra.errors import McpInfraError
from mcp_infra.state.datafiles import shipped_dir
from mcp_infra.state.filecache import load_yaml


class RegistryError(McpInfraError, ValueError):
    """A manifest file that does not load; the message names the file and the problem."""


def registry_dir() -> Path:
    return shipped_dir("registry")


def load_manifest(path: Path) -> Manifest:
    try:
        data = load_yaml(path)
        manifest = Manifest.model_validate(data)
    except (OSError, yaml.YAMLError) as exc:
        raise RegistryError(f"{path.name}: cannot read: {exc}") from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
            for err in exc.errors()[:8]
        )
        raise RegistryError(f"{path.name}: invalid manifest: {problems}") from exc
    if manifest.id != path.stem:
        raise RegistryError(f"{path.name}: manifest id {manifest.id!r} must equal the file name")
    return manifest


def load_registry(directory: Path | None = None, extra: Path | None = None) -> dict[str, Manifest]:
    """All manifests by id: the shipped registry plus the home's own ``registry/`` folder.

    A broken file raises (for callers that must have every manifest), and a home manifest may
    add candidates but never shadow a shipped one. ``read_registry`` reports them instead."""
    manifests, problems = read_registry(directory, extra)
    if problems:
        raise RegistryError(problems[0])
    return manifests


def read_registry(
    directory: Path | None = None, extra: Path | None = None
) -> tuple[dict[str, Manifest], list[str]]:
    """The manifests that load, and one line per file that does not: a broken or shadowing
    file is reported beside the others, never hides them."""
    manifests: dict[str, Manifest] = {}
    problems: list[str] = []
    for folder in (directory or registry_dir(), extra):
        if folder is None or not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.yaml")):
            try:
                manifest = load_manifest(path)
            except RegistryError as exc:
                problems.append(str(exc))
                continue
            if manifest.id in manifests:
                problems.append(f"{path}: manifest id {manifest.id!r} is already defined")
                continue
            manifests[manifest.id] = manifest
    return manifests, problems


def policy_dir() -> Path:
    return shipped_dir("policy")


def load_policy(
    name: str = "default", directory: Path | None = None, extra: Path | None = None
) -> Policy:
    """A policy by name: the home's ``policy/`` folder first (a person's own), then the shipped."""
    path = (directory or policy_dir()) / f"{name}.yaml"
    if extra is not None and (extra / f"{name}.yaml").is_file():
        path = extra / f"{name}.yaml"
    data = load_yaml(path)
    return Policy.model_validate(data)


SUITES_DIR = shipped_dir("suites")


def list_suites(suites_dir: Path | None = None) -> list[str]:
    """Names of the suites in ``suites_dir`` (default: the repository's policy/suites)."""
    folder = Path(suites_dir) if suites_dir is not None else SUITES_DIR
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_suite(name: str, suites_dir: Path | None = None) -> Suite:
    """Load and validate ``<suites_dir>/<name>.yaml``; its ``id`` must equal ``name``.

    The name is checked against the id pattern first, so it can never address a path outside
    the suites folder.
    """
    if not re.fullmatch(ID_PATTERN, name):
        raise ValueError(f"invalid suite name {name!r}")
    folder = Path(suites_dir) if suites_dir is not None else SUITES_DIR
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(list_suites(folder)) or "none"
        raise FileNotFoundError(f"no suite {name!r} in {folder} (known: {known})")
    data = load_yaml(path)
    suite = Suite.model_validate(data)
    if suite.id != name:
        raise ValueError(f"{path} declares id {suite.id!r}, expected {name!r}")
    return suite
