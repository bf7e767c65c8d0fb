"""Model folders on this machine: their facts, their identity, and a check before each start.

* **Facts.** config.json, tokenizer.json, tokenizer_config.json and the weights' sizes are read
  into a ``FolderFacts`` (``core.modelfacts`` parses them), kept per process while the files'
  sizes and modification times are unchanged.
* **Identity.** A local folder is an artifact like a hub snapshot: the sha256 of its files as a
  sorted (path, size, sha256) list and one digest over it (``state.folders``, the scheme of
  hub inventories and builds too). The list is recorded in the home
  (``catalog/inventories/<digest>.json``) so that a folder changed later is refused with what
  changed: which file was added, removed or changed.
* **Loaders.** Which runtimes can load a folder's ``model_type``: the modules of
  ``mlx_lm.models`` (with mlx-lm's own remapping, e.g. mistral → llama) and ``mlx_vlm.models``,
  listed from the installed packages without importing them.
* **Hub repos** resolve from the local Hugging Face cache only (``huggingface_hub``'s cache
  APIs); nothing is downloaded.
* **Builds** made in the home are found by their record (spec, source digest, mlx-lm version)
  without hashing; their files are checked before each start like any folder's.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import re
import threading
from pathlib import Path

from mcp_infra.contracts import (
    REPO_PATTERN,
    REVISION_PATTERN,
    BuildRecord,
    BuildSpec,
    FolderFacts,
    FolderInventory,
    InventoryFile,
    JSONValue,
    ModelShape,
    Recipe,
    TemplateName,
)
from mcp_infra.core import modelfacts
from mcp_infra.errors import McpInfraError
from mcp_infra.state.filecache import installed_version
from mcp_infra.state.folders import FolderError, folder_inventory, inventory_changes
from mcp_infra.state.store import (
    Home,
    file_sha256,
    inventory_digest,
    read_model,
    read_optional,
    utcnow,
    write_model,
)


class ModelFolderError(McpInfraError, ValueError):
    """A model given to mcp-infra that it cannot serve; the message says why."""


class NotAModelFolder(ModelFolderError):
    """The folder lacks config.json, weights or a tokenizer (each named)."""


class UnsupportedArchitecture(ModelFolderError):
    """The installed runtime has no module for the folder's model_type."""


class DoesNotFit(ModelFolderError):
    """The model's estimated memory exceeds what the policy lets servers use here."""


class NotCached(ModelFolderError):
    """A hub repo that is not in the local Hugging Face cache (nothing is downloaded)."""


class FolderChanged(ModelFolderError):
    """A model folder's files differ from the ones recorded for it."""


# ---------------------------------------------------------------------------------------------
# Files, identity and the recorded inventory
# ---------------------------------------------------------------------------------------------


def runtime_files(folder: Path) -> dict[str, Path]:
    """Relative name → file, for the files a runtime reads (config, tokenizer, template,
    weights; links followed): what the facts are read from and stamped by."""
    root = Path(folder)
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_file() and modelfacts.is_runtime_file(name):
            found[name] = path
    return found


def inventory(folder: Path) -> list[InventoryFile]:
    """The folder's identity: (path, size, sha256) of each file (``state.folders``)."""
    try:
        return folder_inventory(Path(folder))
    except FolderError as exc:
        raise FolderChanged(str(exc)) from exc


def inventory_path(home: Home, digest: str) -> Path:
    return home.root / "catalog" / "inventories" / f"{digest}.json"


def record_inventory(home: Home, folder: Path) -> FolderInventory:
    """Hash the folder and keep its file list in the home, under its digest."""
    files = inventory(folder)
    record = FolderInventory(
        path=str(Path(folder).resolve()),
        files=files,
        digest=inventory_digest(files),
        recorded_at=utcnow(),
    )
    target = inventory_path(home, record.digest)
    if not target.exists():
        write_model(target, record)
    return record


def verify_folder(home: Home, folder: Path, digest: str) -> None:
    """Raise ``FolderChanged`` naming each changed, added or removed file when the folder's
    files no longer have the recorded digest."""
    if not Path(folder).is_dir():
        raise FolderChanged(f"{folder}: the model folder is gone (recorded as {digest[:12]}…)")
    now = inventory(Path(folder))
    if inventory_digest(now) == digest:
        return
    recorded = read_optional(inventory_path(home, digest), FolderInventory)
    what = (
        inventory_changes(recorded.files, now)
        if recorded is not None
        else ["its files differ (no file list was recorded for it in this home)"]
    )
    raise FolderChanged(
        f"{folder}: the model folder changed since it was recorded ({digest[:12]}…): "
        + "; ".join(what[:6])
        + (f"; and {len(what) - 6} more" if len(what) > 6 else "")
        + ". Run `mcp-infra init --model` again to serve it as it is now"
    )


FILES_PREFIX = "files:"


def verify_recipe_folders(home: Home, recipe: Recipe) -> None:
    """Before a start: every local folder a recipe names with a recorded digest
    (``artifact_hashes`` ``files:<digest>``) must still hold exactly those files."""
    paths = {"target": recipe.model_path, "draft": recipe.draft_path}
    for role, value in sorted(recipe.artifact_hashes.items()):
        path = paths.get(role)
        if path and value.startswith(FILES_PREFIX):
            verify_folder(home, Path(path), value.removeprefix(FILES_PREFIX))


# ---------------------------------------------------------------------------------------------
# Facts
# ---------------------------------------------------------------------------------------------

_cache_lock = threading.Lock()
_facts: dict[str, tuple[tuple[tuple[str, int, int], ...], FolderFacts]] = {}


def _read_json(path: Path) -> dict[str, JSONValue] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _stamp(files: dict[str, Path]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for name, path in files.items():
        info = path.stat()
        out.append((name, info.st_size, info.st_mtime_ns))
    return tuple(out)


def folder_facts(folder: Path, origin: str = "") -> FolderFacts:
    """What a folder holds, as facts (cached while its files' sizes and times are unchanged)."""
    root = Path(folder).resolve()
    if not root.is_dir():
        return FolderFacts(path=str(root), origin=origin, missing=["the folder itself"])
    files = runtime_files(root)
    stamp = _stamp(files)
    with _cache_lock:
        hit = _facts.get(str(root))
    if hit is not None and hit[0] == stamp:
        return hit[1].model_copy(update={"origin": origin or hit[1].origin})
    facts = _read_facts(root, files, origin)
    with _cache_lock:
        _facts[str(root)] = (stamp, facts)
    return facts


def _read_facts(root: Path, files: dict[str, Path], origin: str) -> FolderFacts:
    config = _read_json(root / "config.json")
    missing = modelfacts.missing_parts(files)
    if config is None and "config.json" in files:
        missing.append("a readable config.json (it is not a JSON object)")
    shape = modelfacts.shape_of(config) if config is not None else None
    if shape is not None and not shape.model_type:
        missing.append("model_type in config.json")
    tokenizer_config = _read_json(root / "tokenizer_config.json")
    raw = next(
        (
            (name, file_sha256(files[name]))
            for name in ("tokenizer.model", "vocab.json")
            if name in files
        ),
        None,
    )
    tokenizer = modelfacts.tokenizer_of(
        _read_json(root / "tokenizer.json") if "tokenizer.json" in files else None,
        tokenizer_config,
        config or {},
        raw_source=raw,
    )
    template = (tokenizer_config or {}).get("chat_template")
    return FolderFacts(
        path=str(root),
        origin=origin,
        missing=missing,
        shape=shape,
        tokenizer=tokenizer,
        chat_template=bool(template) or "chat_template.jinja" in files,
        weights_bytes=sum(p.stat().st_size for n, p in files.items() if n.endswith(".safetensors")),
        files_bytes=sum(p.stat().st_size for p in files.values()),
        loaders=loaders(shape) if shape is not None else [],
    )


# ---------------------------------------------------------------------------------------------
# Which runtime loads which model_type (read from the installed packages, not imported)
# ---------------------------------------------------------------------------------------------

_loader_cache: dict[str, tuple[str | None, frozenset[str], dict[str, str]]] = {}


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def _remapping(utils: Path) -> dict[str, str]:
    """mlx-lm's ``MODEL_REMAPPING`` literal (model_type → the module that loads it)."""
    try:
        tree = ast.parse(utils.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MODEL_REMAPPING" for t in node.targets
        ):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}
    return {}


def model_types(package: str) -> tuple[str | None, frozenset[str], dict[str, str]]:
    """(version, model modules, remapping) of an installed runtime package (mlx_lm, mlx_vlm)."""
    version = installed_version(package.replace("_", "-"))
    hit = _loader_cache.get(package)
    if hit is not None and hit[0] == version:
        return hit
    folder = _package_dir(package)
    names: set[str] = set()
    remap: dict[str, str] = {}
    if folder is not None and (folder / "models").is_dir():
        for entry in (folder / "models").iterdir():
            if entry.suffix == ".py" or (entry / "__init__.py").is_file():
                names.add(entry.stem if entry.suffix == ".py" else entry.name)
        if package == "mlx_lm":
            remap = _remapping(folder / "utils.py")
    result = (version, frozenset(names), remap)
    _loader_cache[package] = result
    return result


def loaders(shape: ModelShape) -> list[TemplateName]:
    """The launch templates whose runtime has a module for this model_type."""
    found: list[TemplateName] = []
    _, lm, remap = model_types("mlx_lm")
    if remap.get(shape.model_type, shape.model_type) in lm:
        found += ["mlx_lm_server", "mlx_lm_distributed"]
    _, vlm, _ = model_types("mlx_vlm")
    if shape.model_type in vlm:
        found.append("mlx_vlm_server")
    return found


# ---------------------------------------------------------------------------------------------
# Hub repos from the local cache, and the other models on this machine
# ---------------------------------------------------------------------------------------------

GIVEN_REPO = re.compile(r"^(?P<repo>[^@]+?)(?:@(?P<revision>[^@]+))?$")


def resolve_hub(given: str, cache: Path) -> tuple[Path, str, str]:
    """``REPO[@REVISION]`` → (snapshot folder, repo, 40-hex revision), from the local cache
    only: the revision may be a commit or a ref the cache knows (default ``main``)."""
    from huggingface_hub import try_to_load_from_cache

    match = GIVEN_REPO.match(given)
    repo = match.group("repo") if match else given
    ref = (match.group("revision") if match else None) or "main"
    if not re.fullmatch(REPO_PATTERN, repo):
        raise NotAModelFolder(
            f"{given}: neither a model folder on this machine nor a hub repo id (ORG/NAME)"
        )
    found = try_to_load_from_cache(repo, "config.json", cache_dir=str(cache), revision=ref)
    if not isinstance(found, str):
        raise NotCached(
            f"{repo}@{ref}: not in the local Hugging Face cache at {cache} (mcp-infra does not "
            "download a model at init; fetch it with your own tools, or give a folder)"
        )
    snapshot = Path(found).parent
    if not re.fullmatch(REVISION_PATTERN, snapshot.name):
        raise NotCached(f"{repo}@{ref}: the cache's snapshot {snapshot.name} is not a commit")
    return snapshot, repo, snapshot.name


def hub_snapshots(cache: Path) -> list[tuple[Path, str]]:
    """(snapshot folder, "hub cache: ORG/NAME@abcdef123456") of every model revision in a
    Hugging Face cache (``huggingface_hub.scan_cache_dir``)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(cache)
    except (CacheNotFound, OSError, ValueError):
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        for revision in sorted(repo.revisions, key=lambda r: r.commit_hash):
            origin = f"hub cache: {repo.repo_id}@{revision.commit_hash[:12]}"
            found.append((Path(revision.snapshot_path), origin))
    return found


def folder_models(folder: Path) -> list[tuple[Path, str]]:
    """A configured folder: itself if it holds config.json, else each child that does."""
    root = Path(folder).expanduser()
    if (root / "config.json").is_file():
        return [(root, f"folder {root}")]
    if not root.is_dir():
        return []
    return [
        (child, f"folder {root}")
        for child in sorted(root.iterdir())
        if child.is_dir() and (child / "config.json").is_file()
    ]


def local_models(caches: list[Path], model_dirs: list[str]) -> list[tuple[Path, str]]:
    """Every model folder on this machine the catalog may use, each once (by resolved path)."""
    seen: set[str] = set()
    found = []
    for path, origin in [
        *(item for cache in caches for item in hub_snapshots(cache)),
        *(item for folder in model_dirs for item in folder_models(Path(folder))),
    ]:
        key = str(path.resolve())
        if key not in seen:
            seen.add(key)
            found.append((path, origin))
    return found


# ---------------------------------------------------------------------------------------------
# Builds made in the home (``state.builds``), found for a recipe without hashing
# ---------------------------------------------------------------------------------------------


def recorded_build(builds: Path, spec: BuildSpec, source_digest: str) -> BuildRecord | None:
    """The record of ``spec`` built from this source by the installed mlx-lm, if one is in
    ``builds`` with its folder (read only: ``verify_build`` checks the files before use)."""
    version = installed_version("mlx-lm")
    for path in sorted(builds.glob("*.json")) if builds.is_dir() else []:
        with contextlib.suppress(Exception):  # another file, or a corrupt record: proves nothing
            record = read_model(path, BuildRecord)
            same = (record.spec, record.source_digest, record.mlx_lm_version) == (
                spec,
                source_digest,
                version,
            )
            if same and Path(record.folder).is_dir():
                return record
    return None


def not_built(builds: Path, spec: BuildSpec) -> str:
    """Where a recipe of a build that is not made yet points: a path that does not exist."""
    return str(builds / f"not-built-yet-{spec.key()}")
