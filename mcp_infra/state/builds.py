"""Quantized builds of a model folder, made with ``mlx_lm convert`` into ``<home>/builds/``.

* **Before.** The spec must be one the installed converter offers (its ``--help``), the source
  must be unquantized (a build starts from higher precision), and the estimated output must fit
  the free disk and the policy's disk budget (``core.builds``). Nothing is written before that.
* **Making.** ``python -m mlx_lm convert --hf-path SRC --mlx-path TMP …`` as an argv list, offline,
  into a temporary folder inside ``builds/``; the output is hashed (``state.folders``), its
  record is written, then it is renamed to ``builds/<key>-<digest[:12]>/`` with the record
  ``builds/<key>-<digest[:12]>.json`` beside it (a crash leaves at most a record without its
  folder, which is ignored and rebuilt).
* **Reuse.** A build of the same spec, source digest and mlx-lm version whose files match its
  record is returned as it is; one whose files changed is refused with what changed.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from mcp_infra.contracts import Budgets, BuildRecord, BuildSpec, ComputeDtype, DtypeProbe
from mcp_infra.core.builds import (
    disk_problems,
    fastest_dtype,
    need_bytes,
    offered_choices,
    unoffered,
)
from mcp_infra.errors import McpInfraError
from mcp_infra.state.folders import folder_digest, folder_inventory, folder_size, inventory_changes
from mcp_infra.state.store import inventory_digest, read_model, utcnow, write_model

__all__ = [
    "BuildError",
    "BuildRefused",
    "BuildTampered",
    "convert_help",
    "find_build",
    "make_build",
    "probe_compute_dtype",
    "source_bits",
    "verify_build",
]

HELP_TIMEOUT_S = 120.0
PROBE_ROUNDS = 3  # interleaved rounds per dtype; the best counts (the least disturbed)
PROBE_ROUND_S = 0.25  # seconds of decode steps per dtype and round
PROBE_LAYERS = 2  # decoder layers of the probe model: every kind of op, little memory
PROBE_VOCAB = 32768  # its vocabulary at most (the output projection of a large one dominates)
_SAFETENSORS_BITS = {"F32": 32, "F16": 16, "BF16": 16, "F64": 64}


class BuildError(McpInfraError, RuntimeError):
    """A build failed; the message says what the converter said."""


class BuildRefused(BuildError):
    """A build that must not be made: a spec the converter lacks, a quantized source, no room."""


class BuildTampered(BuildError):
    """A build whose files no longer match its record."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONNOUSERSITE": "1"})
    return env


def _capture(argv: list[str], timeout: float | None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(  # argv list, never a shell
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=_env(),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"`{' '.join(argv[1:])}` gave no answer in {timeout:.0f} s") from exc


@cache
def convert_help(python: str) -> tuple[str, str]:
    """(``mlx_lm convert --help`` text, mlx-lm version) of an interpreter, read once."""
    done = _capture([python, "-m", "mlx_lm", "convert", "--help"], HELP_TIMEOUT_S)
    text = done.stdout.decode("utf-8", errors="replace")
    if done.returncode != 0 or "--mlx-path" not in text:
        raise BuildError(
            f"{python} -m mlx_lm convert --help failed (exit {done.returncode}): "
            + done.stderr.decode("utf-8", errors="replace")[-400:]
        )
    probe = "import importlib.metadata as m; print(m.version('mlx-lm'))"
    version = _capture([python, "-c", probe], HELP_TIMEOUT_S).stdout.decode().strip()
    return text, version or "unknown"


def source_bits(source: Path) -> int:
    """The float width of an unquantized source (its largest tensor's dtype); refuses a
    quantized one (a build starts from a source of higher precision)."""
    try:
        config = json.loads((source / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise BuildRefused(f"{source}: no readable config.json: {exc}") from exc
    if "quantization" in config or "quantization_config" in config:
        raise BuildRefused(
            f"{source} is quantized already: a build starts from a source of higher precision"
        )
    largest, bits = -1, 0
    for shard in sorted(source.glob("*.safetensors")):
        with shard.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            size = entry["data_offsets"][1] - entry["data_offsets"][0]
            if size > largest:
                largest, bits = size, _SAFETENSORS_BITS.get(entry["dtype"], 0)
    if not bits:
        raise BuildRefused(f"{source}: no float safetensors weights to build from")
    return bits


def _records(builds: Path) -> Iterator[tuple[Path, BuildRecord]]:
    for path in sorted(builds.glob("*.json")):
        with contextlib.suppress(Exception):  # another file, or a corrupt record: proves nothing
            yield path, read_model(path, BuildRecord)


def verify_build(record: BuildRecord) -> None:
    """Raise ``BuildTampered`` naming what changed if the build's files differ from its record
    (hashes memoized by stat: cheap before each start)."""
    folder = Path(record.folder)
    if not folder.is_dir():
        raise BuildTampered(f"build {record.key}: {folder} is gone")
    changes = inventory_changes(record.files, folder_inventory(folder))
    if changes or inventory_digest(record.files) != record.digest:
        raise BuildTampered(
            f"build {record.key} at {folder} differs from its record: "
            + "; ".join(changes[:5] or ["the record's digest does not match its file list"])
            + f"; remove {folder} and its record to build it again"
        )


def find_build(
    builds: Path, spec: BuildSpec, source_digest: str, mlx_lm_version: str
) -> BuildRecord | None:
    """The recorded build of ``spec`` from this source by this mlx-lm, checked against its
    record (``BuildTampered`` if its files changed); None if there is none."""
    for _, record in _records(builds):
        same = (record.spec, record.source_digest, record.mlx_lm_version) == (
            spec,
            source_digest,
            mlx_lm_version,
        )
        if same and Path(record.folder).is_dir():
            verify_build(record)
            return record
    return None


@contextlib.contextmanager
def _locked(builds: Path) -> Iterator[None]:
    """One build at a time per home (an flock: it dies with its holder)."""
    builds.mkdir(parents=True, exist_ok=True)
    with (builds / ".lock").open("a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield


def _check_room(builds: Path, spec: BuildSpec, source: Path, budgets: Budgets) -> None:
    need = need_bytes(spec, folder_size(source), source_bits(source))
    used = sum(folder_size(Path(r.folder)) for _, r in _records(builds) if Path(r.folder).is_dir())
    problems = disk_problems(need, shutil.disk_usage(builds).free, used, budgets.disk_gb)
    if problems:
        raise BuildRefused(f"build {spec.key()} of {source}: " + "; ".join(problems))


def make_build(
    source: Path, spec: BuildSpec, builds: Path, budgets: Budgets, python: str = sys.executable
) -> BuildRecord:
    """Make (or reuse) the build ``spec`` of the model folder ``source`` under ``builds``
    (``Home.builds``) with ``python``'s mlx-lm; see the module notes. Returns its record."""
    source = Path(source).resolve()
    help_text, version = convert_help(python)
    problem = unoffered(spec, offered_choices(help_text))
    if problem:
        raise BuildRefused(f"build {spec.key()}: {problem}")
    with _locked(builds):
        source_digest = folder_digest(source)
        found = find_build(builds, spec, source_digest, version)
        if found is not None:
            return found
        _check_room(builds, spec, source, budgets)
        return _convert(source, source_digest, spec, builds, (python, version))


def _convert(
    source: Path, source_digest: str, spec: BuildSpec, builds: Path, runtime: tuple[str, str]
) -> BuildRecord:
    python, version = runtime
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.key()}-", dir=builds))
    try:
        out = staging / "model"
        argv = [python, "-m", "mlx_lm", "convert", "--hf-path", str(source)]
        argv += ["--mlx-path", str(out), *spec.convert_args()]
        done = _capture(argv, None)
        if done.returncode != 0 or not out.is_dir():
            tail = done.stderr.decode("utf-8", errors="replace").strip()[-600:]
            raise BuildError(f"build {spec.key()}: mlx_lm convert failed: …{tail}")
        files = folder_inventory(out)
        digest = inventory_digest(files)
        final = builds / f"{spec.key()}-{digest[:12]}"
        if final.exists() and inventory_changes(files, folder_inventory(final)):
            raise BuildTampered(f"{final} exists and differs from this build: remove it")
        record = BuildRecord(
            spec=spec,
            key=spec.key(),
            source=str(source),
            source_digest=source_digest,
            argv=argv,
            mlx_lm_version=version,
            folder=str(final),
            files=files,
            digest=digest,
            size_bytes=sum(f.size for f in files),
            duration_s=round(time.monotonic() - started, 3),
            created_at=utcnow(),
        )
        write_model(final.with_name(final.name + ".json"), record)
        if not final.exists():  # else the same bytes made again (another mlx-lm, a lost record)
            os.replace(out, final)
        return record
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def probe_compute_dtype(source: Path, spec: BuildSpec) -> DtypeProbe:
    """Time one-token decode steps of a small model of ``source``'s architecture and shapes
    (``PROBE_LAYERS`` layers, the vocabulary capped at ``PROBE_VOCAB``, random weights), cast
    and quantized as ``mlx_lm convert`` would make ``spec``, in float32, bfloat16 and float16
    (interleaved rounds, best of each), and name the fastest. On a CPU without bfloat16
    arithmetic a bfloat16 build can be several times slower than a float32 one of the same
    bits: this is measured per machine, never assumed."""
    from mcp_infra.state.hostfacts import accelerator_name, cpu_name, installed_version

    config = json.loads((source / "config.json").read_text())
    config.pop("quantization", None)
    config.pop("quantization_config", None)
    config["num_hidden_layers"] = min(int(config["num_hidden_layers"]), PROBE_LAYERS)
    config["vocab_size"] = min(int(config["vocab_size"]), PROBE_VOCAB)
    dtypes: list[ComputeDtype] = ["float32", "bfloat16", "float16"]
    steps = {d: _probe_model(config, spec, d) for d in dtypes}
    rates: dict[ComputeDtype, float] = {d: 0.0 for d in dtypes}
    for _ in range(PROBE_ROUNDS):
        for dtype in dtypes:
            rates[dtype] = max(rates[dtype], _steps_per_s(steps[dtype]))
    accelerator = accelerator_name()
    return DtypeProbe(
        key=BuildSpec.model_validate({**spec.model_dump(), "dtype": None}).key()
        if spec.quantize
        else "unquantized",
        model_type=str(config["model_type"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        layers=config["num_hidden_layers"],
        vocab_size=config["vocab_size"],
        rates={d: round(r, 2) for d, r in rates.items()},
        fastest=fastest_dtype(rates),
        machine=cpu_name() if accelerator == "cpu" else accelerator,
        mlx_version=installed_version("mlx") or "unknown",
        measured_at=utcnow(),
    )


def _probe_model(
    config: dict[str, Any], spec: BuildSpec, dtype: ComputeDtype
) -> Callable[[], Any]:  # Any: config JSON; the step returns an mlx array (no stubs)
    """A decode step of a random model built from ``config``, made as ``spec`` in ``dtype``."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.convert import mixed_quant_predicate_builder
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import _get_classes, quantize_model

    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    cast = getattr(mx, dtype)
    model.update(
        tree_map(
            lambda v: v.astype(cast) if mx.issubdtype(v.dtype, mx.floating) else v,
            model.parameters(),
        )
    )
    eff = spec.effective()
    if eff is not None:
        group, bits = eff
        predicate = (
            mixed_quant_predicate_builder(spec.quant_predicate, model, group)
            if spec.quant_predicate
            else None
        )
        # mlx-lm's builder returns the two-argument predicate its quantizer calls; only
        # their annotations disagree (a third-party typing slip). Its [INFO] line is not ours.
        with contextlib.redirect_stdout(io.StringIO()):
            model, _ = quantize_model(
                model,
                {},
                group,
                bits,
                mode=spec.q_mode,
                quant_predicate=predicate,  # type: ignore[arg-type]
            )
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[1, 2, 3, 4, 5, 6, 7, 8]]), cache=cache))
    token = mx.array([[9]])

    def step() -> Any:
        return model(token, cache=cache)

    mx.eval(step())
    return step


def _steps_per_s(step: Callable[[], Any]) -> float:  # Any: an mlx array
    import mlx.core as mx

    done, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < PROBE_ROUND_S:
        mx.eval(step())
        done += 1
    return done / elapsed
