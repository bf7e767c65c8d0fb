"""The catalog generated for the home's own model: its facts gathered, its manifests made by
``core.catalog`` and kept in ``<home>/catalog/generated.json`` under a key of what they were
made from (the model's recorded digest, the runtimes' versions and --help, the other model
folders found and their files' sizes and times, this machine's platform and memory). A changed
model, runtime or set of other models makes it again; otherwise it is read back.

The runtimes' ``--help`` is read once per installed version (``catalog/help/``), so only the
first catalog of a runtime version starts ``python -m mlx_lm server --help``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from mcp_infra.contracts import (
    ArtifactRef,
    BuildSpec,
    CatalogFacts,
    ComputeDtype,
    DtypeProbe,
    FolderFacts,
    GeneratedCatalog,
    Manifest,
    RuntimeHelp,
    ServiceConfig,
)
from mcp_infra.core import catalog as generator
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.modelfacts import same_model
from mcp_infra.core.preflight import artifact_key
from mcp_infra.core.templates import SERVER_MODULES, help_choices, help_flags
from mcp_infra.state.artifacts import artifact_path, hub_caches
from mcp_infra.state.filecache import installed_version
from mcp_infra.state.modelfolder import (
    folder_facts,
    local_models,
    record_inventory,
    runtime_files,
)
from mcp_infra.state.runtimes import platform_tag
from mcp_infra.state.store import Home, read_optional, utcnow, write_bytes_atomic, write_model

HELP_TIMEOUT_S = 120.0
TOOLS: dict[str, tuple[list[str], str]] = {
    "mlx_lm_server": (SERVER_MODULES["mlx_lm_server"], "mlx-lm"),
    "mlx_vlm_server": (SERVER_MODULES["mlx_vlm_server"], "mlx-vlm"),
    "mlx_lm.convert": (["-m", "mlx_lm", "convert"], "mlx-lm"),
}
"""Each runtime tool whose --help the catalog reads: how it starts and its package."""


def catalog_dir(home: Home) -> Path:
    return home.root / "catalog"


def catalog_path(home: Home) -> Path:
    return catalog_dir(home) / "generated.json"


def help_path(home: Home, name: str, version: str) -> Path:
    return catalog_dir(home) / "help" / f"{name}-{version}.txt"


def help_text(home: Home, name: str) -> tuple[str, str] | None:
    """(version, --help text) of an installed runtime tool, read once per version."""
    module, package = TOOLS[name]
    version = installed_version(package)
    if version is None:
        return None
    path = help_path(home, name, version)
    if path.is_file():
        return version, path.read_text(encoding="utf-8", errors="replace")
    try:
        done = subprocess.run(  # argv list, never a shell
            [sys.executable, *module, "--help"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=HELP_TIMEOUT_S,
            check=False,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    text = done.stdout.decode("utf-8", errors="replace")
    if done.returncode != 0 or "--" not in text:
        return None
    write_bytes_atomic(path, text.encode())
    return version, text


def runtime_helps(home: Home) -> list[RuntimeHelp]:
    """Each installed tool's --help as flags and choices (read side by side: each start
    imports mlx, seconds apiece)."""
    with ThreadPoolExecutor(max_workers=len(TOOLS)) as pool:
        texts = dict(zip(TOOLS, pool.map(lambda name: help_text(home, name), TOOLS), strict=True))
    helps = []
    for name, found in texts.items():
        if found is not None:
            version, text = found
            helps.append(
                RuntimeHelp(
                    name=name, version=version, flags=help_flags(text), choices=help_choices(text)
                )
            )
    return helps


def _stamp(folder: Path) -> list[object]:
    out: list[object] = []
    for name, path in runtime_files(folder).items():
        info = path.stat()
        out.append([name, info.st_size, info.st_mtime_ns])
    return out


def _others(home: Home, config: ServiceConfig) -> list[tuple[Path, str]]:
    return local_models(hub_caches(home.hf_cache), list(config.model_dirs))


def catalog_key(
    config: ServiceConfig, helps: list[RuntimeHelp], others: list[tuple[Path, str]]
) -> str:
    """What the catalog is made from, as one digest (cheap: sizes and times, no hashing)."""
    assert config.model is not None
    return sha256_bytes(
        canonical_json(
            {
                "version": generator.CATALOG_VERSION,
                "model": config.model.digest,
                "runtimes": [h.model_dump(mode="json") for h in helps],
                "others": [[str(p), origin, _stamp(p)] for p, origin in others],
                "platform": platform_tag(),
                "memory": round(psutil.virtual_memory().total / 2**30, 1),
            }
        )
    )


def gather(
    home: Home, config: ServiceConfig, helps: list[RuntimeHelp], others: list[tuple[Path, str]]
) -> CatalogFacts:
    """The catalog's facts. Every other model that may draft (small enough) or be a build's
    source (the target's model unquantized) is hashed and its file list recorded: each is
    checked against it before it is used."""
    assert config.model is not None
    target = folder_facts(Path(config.model.path), "the configured model").model_copy(
        update={"digest": config.model.digest}
    )
    found: list[FolderFacts] = []
    for path, origin in others:
        facts = folder_facts(path, origin)
        if facts.path == target.path:
            continue
        small = facts.weights_bytes <= target.weights_bytes * generator.DRAFTER_MAX_SHARE
        unquantized = bool(facts.shape and facts.shape.quantized is None)
        if (small or unquantized and same_model(target, facts)) and not facts.missing:
            facts = facts.model_copy(update={"digest": record_inventory(home, path).digest})
        found.append(facts)
    gathered = CatalogFacts(
        target=target,
        runtimes=helps,
        others=found,
        memory_gb=psutil.virtual_memory().total / 2**30,
        platform=platform_tag(),
    )
    source, _ = generator.build_source(gathered)
    if source is None or not any(h.name == "mlx_lm.convert" for h in helps):
        return gathered
    dtype = compute_dtype(home, Path(source.path))
    return gathered.model_copy(update={"compute_dtype": dtype})


PROBED = BuildSpec(q_bits=8)
"""The build whose decode step is timed in each dtype (state.builds.probe_compute_dtype)."""


def compute_dtype(home: Home, source: Path) -> ComputeDtype | None:
    """The dtype this machine runs a quantized build of ``source``'s shapes fastest in:
    measured once per shapes, machine and mlx version, kept in ``catalog/dtype-probe.json``."""
    from mcp_infra.state.builds import probe_compute_dtype
    from mcp_infra.state.hostfacts import accelerator_name, cpu_name

    shape = folder_facts(source).shape
    if shape is None or not (shape.hidden_size and shape.intermediate_size):
        return None
    path = catalog_dir(home) / "dtype-probe.json"
    machine = accelerator_name() if accelerator_name() != "cpu" else cpu_name()
    key = (shape.hidden_size, shape.intermediate_size, machine, installed_version("mlx"))
    for kept in (read_optional(path, DtypeProbe), _probes.get(key)):
        probed = kept and (kept.hidden_size, kept.intermediate_size, kept.machine, kept.mlx_version)
        if kept is not None and probed == key:
            if not path.exists():
                write_model(path, kept)
            return kept.fastest
    try:
        probe = probe_compute_dtype(source, PROBED)
    except (ImportError, RuntimeError, ValueError, KeyError, OSError):
        return None
    _probes[key] = probe
    write_model(path, probe)
    return probe.fastest


_probes: dict[tuple[int, int, str, str | None], DtypeProbe] = {}
"""Probes this process made, by shapes, machine and mlx version (the machine stays the same)."""


def ensure_catalog(home: Home, config: ServiceConfig) -> GeneratedCatalog | None:
    """The catalog of the configured model, made again only when its key changed (None: the
    home serves no model of `init --model`)."""
    if config.model is None:
        return None
    helps = runtime_helps(home)
    others = _others(home, config)
    key = catalog_key(config, helps, others)
    kept = read_optional(catalog_path(home), GeneratedCatalog)
    if kept is not None and kept.key == key:
        return kept
    manifests, notes = generator.generate(gather(home, config, helps, others))
    made = GeneratedCatalog(
        key=key,
        made_at=utcnow(),
        target_digest=config.model.digest,
        manifests=manifests,
        notes=notes,
    )
    write_model(catalog_path(home), made)
    return made


def bind_configured(manifest: Manifest, path: str, digest: str | None) -> Manifest:
    """A manifest whose artifacts say "the configured target", with that target's folder (and
    digest) written in: what it serves in this home, and what its hash and recipes name."""
    if not any(a.configured for a in (manifest.target, *manifest.artifacts)):
        return manifest

    def bound(artifact: ArtifactRef) -> ArtifactRef:
        if not artifact.configured:
            return artifact
        return ArtifactRef(role=artifact.role, path=path, digest=digest)

    return manifest.model_copy(
        update={
            "target": bound(manifest.target),
            "artifacts": [bound(a) for a in manifest.artifacts],
        }
    )


def configured_target(config: ServiceConfig) -> tuple[str, str | None]:
    """The configured target: the baseline's folder, and its digest where `init` recorded it."""
    path = config.baseline.model_path
    model = config.model
    return path, model.digest if model is not None and model.path == path else None


def model_facts(
    home: Home, config: ServiceConfig | None, manifests: dict[str, Manifest]
) -> dict[str, object]:
    """``HostFacts``' model part: the live model's folder (the configured baseline's), where
    each manifest artifact resolves to here, and the facts of every such folder that exists."""
    target = None
    if config is not None:
        path, digest = configured_target(config)
        target = folder_facts(Path(path), "the live model").model_copy(update={"digest": digest})
    paths: dict[str, str] = {}
    folders: dict[str, FolderFacts] = {target.path: target} if target else {}
    for manifest in manifests.values():
        for artifact in (manifest.target, *manifest.artifacts):
            key = artifact_key(artifact)
            if key in paths:
                continue
            where = Path(artifact_path(artifact, home.models, home.hf_cache)).resolve()
            paths[key] = str(where)
            if str(where) not in folders and where.is_dir():
                folders[str(where)] = folder_facts(where)
    return {"target": target, "artifact_paths": paths, "folders": folders}
