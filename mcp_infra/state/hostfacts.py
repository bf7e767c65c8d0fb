"""Facts about this machine and its model folders: platform, packages, CPU, BLAS, memory, disk,
cached artifacts, and fingerprints of model folders.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import psutil

from mcp_infra.contracts import EnvironmentFingerprint, Recipe
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.preflight import HostFacts
from mcp_infra.state import artifacts as hub
from mcp_infra.state.artifacts import cached_hub_artifacts, hub_caches
from mcp_infra.state.filecache import installed_version as cached_version
from mcp_infra.state.folders import folder_digest
from mcp_infra.state.runtimes import control_python, control_site, platform_tag
from mcp_infra.state.store import sha256_file


def installed_version(package: str) -> str | None:
    """The installed version of a package (cached while the import path is unchanged)."""
    return cached_version(package)


def host_facts(home_root: Path, models_dir: Path, hf_cache: Path | None = None) -> HostFacts:
    """Snapshot this machine's facts for preflight."""
    packages = {
        name: v
        for name in (*ENGINE_PACKAGES, "mcp", "huggingface_hub")
        if (v := installed_version(name))
    }
    home_root.mkdir(parents=True, exist_ok=True)
    available = [
        f"demo:{name}"
        for name in ("target", "draft", "split-target")
        if (models_dir / name).is_dir()
    ]
    problems: dict[str, list[str]] = {}
    shared = hub.hub_cache()
    for cache in hub_caches(hf_cache):
        for key, snap in cached_hub_artifacts(cache):
            if key in available:
                continue
            available.append(key)
            result = hub.quick_check(snap)
            if not result.ok:
                problems[key] = result.problems
    probe = shared
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return HostFacts(
        platform=platform_tag(),
        packages=packages,
        memory_gb=psutil.virtual_memory().total / 2**30,
        free_disk_gb=shutil.disk_usage(home_root).free / 2**30,
        available_artifacts=available,
        artifact_problems=problems,
        cache_free_disk_gb=shutil.disk_usage(probe).free / 2**30,
        python=control_python(),
        shared_site=control_site(),
    )


# Packages whose versions decide whether a remembered outcome still holds (recipe memory), and
# the wider set recorded in a bundle's environment and checked by preflight.
ENGINE_PACKAGES = ("mlx", "mlx-lm", "mlx-vlm")
RECORDED_PACKAGES = (*ENGINE_PACKAGES, "mcp", "pydantic", "mcp-infra", "huggingface_hub")
FULL_HASH_LIMIT = 2**30


def cpu_name() -> str:
    """The CPU model as the OS names it (``/proc/cpuinfo`` on Linux)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def blas_name() -> str:
    """Which BLAS the servers run with: a preloaded library, or the wheel's bundled one."""
    return os.environ.get("LD_PRELOAD", "") or "bundled (no LD_PRELOAD)"


def accelerator_name() -> str:
    """What the MLX runtime computes on here: Apple's GPU through Metal, or the CPU (MLX's
    Linux CPU build). The servers run the same mlx, so this is what they computed on."""
    try:
        import mlx.core as mx
    except ImportError:
        return "unknown (mlx is not importable)"
    if not mx.metal.is_available():
        return "cpu"
    try:
        name = str(mx.device_info().get("device_name", ""))
    except (AttributeError, RuntimeError):
        name = ""
    return f"metal: {name or 'Apple GPU'}"


def fingerprint_environment(recipes: list[Recipe]) -> EnvironmentFingerprint:
    """This machine, its packages and every model folder the cycle's recipes run."""
    packages = {name: v for name in RECORDED_PACKAGES if (v := installed_version(name))}
    models: dict[str, str] = {}
    for recipe in recipes:  # every model folder a recipe of this cycle ran, by path
        for path in (recipe.model_path, recipe.draft_path):
            if path and path not in models:
                models[path] = folder_fingerprint(Path(path))
    return EnvironmentFingerprint(
        platform=platform.platform(),
        machine=platform.machine(),
        cpu=cpu_name(),
        cpu_count=os.cpu_count() or 0,
        memory_gb=round(psutil.virtual_memory().total / 2**30, 2),
        python=platform.python_version(),
        packages=packages,
        blas=blas_name(),
        accelerator=accelerator_name(),
        models=models,
    )


def folder_fingerprint(path: Path) -> str:
    """sha256 of a model folder's bytes; above 1 GiB (real models) a pinned hub snapshot is
    named by its revision folder and the file sizes, and its files' sha256 inventory is taken
    when it is prepared (`mcp-infra prepare`), not on every cycle."""
    if not path.is_dir():
        return "missing"
    files = sorted(p for p in path.rglob("*") if p.is_file())
    if sum(p.stat().st_size for p in files) <= FULL_HASH_LIMIT:
        return "sha256:" + model_fingerprint(path)
    sizes = ",".join(f"{p.relative_to(path)}={p.stat().st_size}" for p in files)
    return f"snapshot:{path.name};sizes-sha256:{sha256_bytes(sizes.encode())}"


def environment() -> dict[str, str]:
    """This machine and runtime, as the fields that decide whether a past outcome still holds."""
    env = {
        "os": platform.system().lower(),
        "machine": platform.machine(),
        "cpu": cpu_name(),
        "python": ".".join(platform.python_version().split(".")[:2]),
        "blas": blas_name(),
    }
    for name in ENGINE_PACKAGES:
        env[name] = installed_version(name) or "-"
    return env


def environment_from(fingerprint: EnvironmentFingerprint) -> dict[str, str]:
    """The same fields, read from a sealed bundle's ``environment.json``."""
    env = {
        "os": fingerprint.platform.split("-")[0].lower().replace("macos", "darwin"),
        "machine": fingerprint.machine,
        "cpu": fingerprint.cpu,
        "python": ".".join(fingerprint.python.split(".")[:2]),
        "blas": fingerprint.blas,
    }
    for name in ENGINE_PACKAGES:
        env[name] = fingerprint.packages.get(name, "-")
    return env


def model_fingerprint(path: Path) -> str:
    """The folder's identity: sha256 over its sorted (path, size, sha256) list, the one scheme
    for every model folder (``state.folders``), as `init --model` records it."""
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"not a model folder: {root}")
    return folder_digest(root)


SMALL_FILE_BYTES = 64 * 2**20


def artifact_identity(path: str | None) -> str:
    """What a model folder is, cheaply: see the module notes."""
    if not path:
        return "-"
    folder = Path(path)
    if not folder.is_dir():
        return f"missing:{path}"
    if folder.parent.name == "snapshots" and folder.parents[1].name.startswith("models--"):
        inventory = hub.read_inventory(folder)
        if inventory is not None:
            return f"inventory:{inventory.digest}"
        return f"hub:{folder.parents[1].name}@{folder.name}"
    parts = []
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = file.stat()
        rel = file.relative_to(folder).as_posix()
        if stat.st_size <= SMALL_FILE_BYTES:
            parts.append([rel, stat.st_size, sha256_file(file)])
        else:
            parts.append([rel, stat.st_size, stat.st_mtime_ns])
    return "files:" + sha256_bytes(canonical_json(parts))
