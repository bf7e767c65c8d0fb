"""Runtime environments as pinned artifacts: a newer (or other) mlx-lm / mlx-vlm in its own
virtual environment under ``<home>/runtimes/<content hash>/``, built with the ordinary tools and
checked like a model artifact before each use.

* **Pinned or refused.** Every package names an exact version and its sha256; pip installs them
  with ``--require-hashes --no-deps`` (``uv pip install`` with the same flags where ``uv`` is on
  the PATH), so nothing unpinned and nothing unlisted is ever installed.
* **Two modes** (``RuntimeEnvSpec.site``). ``isolated``: only the pinned packages, which must be
  the whole closure (``pip check`` after the build). ``shared``: the pinned packages first on the
  path, then the control plane's own site-packages (mlx and the rest, added by a ``.pth`` line
  the way ``site.addsitedir`` adds a site). Shared is what makes a pure-Python release of mlx-lm
  cheap to try (one wheel), at the price of depending on the control plane's mlx: that is why
  the lock records every package the environment sees, where it is found, and is compared again
  before each use (a changed mlx of the control plane changes the lock and refuses the recipe).
* **The lock** (``RuntimeLock``, ``lock.json`` beside the environment): every visible package and
  version, the flags each launch template's server lists in its ``--help`` (read once, at build
  time, so preflight refuses an unknown flag), and the sha256 of every file of the environment.
  A recipe records the lock's digests; ``verify_recipe_runtime`` re-hashes the environment (hashes
  memoized by stat, as for model snapshots) and refuses any difference before a server starts.
* **Offline** (``offline=True`` or ``PIP_NO_INDEX`` set): nothing is built; what is built is used,
  and what is missing is named.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform as pyplatform
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from mcp_infra.contracts import (
    InventoryFile,
    LockedPackage,
    Policy,
    Recipe,
    RecipeRuntime,
    RuntimeEnvSpec,
    RuntimeLock,
)
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.preflight import (
    RUNTIME_PACKAGES,
    RuntimeFacts,
    env_hash,
    env_label,
    normalize_name,
    pin_problems,
)
from mcp_infra.core.templates import SERVER_MODULES, help_flags
from mcp_infra.errors import McpInfraError
from mcp_infra.state.store import (
    CycleFiles,
    Home,
    file_sha256,
    inventory_digest,
    read_model,
    utcnow,
    write_model,
)

ENV_DIR = "env"
LOCK_FILE = "lock.json"
BUILD_LOG = "build.log"
SHARED_PTH = "_mcp_infra_shared_site.pth"
HELP_TIMEOUT_S = 120.0
BUILD_TIMEOUT_S = 1800.0
GB = 1e9  # package sizes, as registries state them, in decimal gigabytes
DISK_MARGIN_GB = 1.0


class RuntimeEnvError(McpInfraError, RuntimeError):
    """A runtime environment cannot be built or used; the message says why and what to do."""


class RuntimeRefused(RuntimeEnvError):
    """The environment's spec is refused before anything is built (unpinned, wrong Python,
    over a budget)."""


class RuntimeMissing(RuntimeEnvError):
    """The environment is not built (and offline, cannot be)."""


class RuntimeTampered(RuntimeEnvError):
    """A built environment no longer matches its lock: it is not used."""


class BuildResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env_hash: str
    path: str
    label: str
    reused: bool
    builder: str
    seconds: float
    download_bytes: int
    python: str
    packages: int
    size_bytes: int
    lock_digest: str
    files_digest: str
    accepted_flags: dict[str, list[str]]


# ---------------------------------------------------------------------------------------------
# Where, and for which control plane
# ---------------------------------------------------------------------------------------------


def platform_tag() -> str:
    """This machine as manifests name platforms (``linux-x86_64``, ``darwin-arm64``)."""
    system = pyplatform.system().lower()
    machine = pyplatform.machine().lower()
    if machine in {"amd64", "x64"}:
        machine = "x86_64"
    if machine == "aarch64" and system == "darwin":
        machine = "arm64"
    return f"{system}-{machine}"


def control_site() -> str:
    """The control plane's site-packages (what a ``shared`` environment sees after its own)."""
    return sysconfig.get_paths()["purelib"]


def control_python() -> str:
    return pyplatform.python_version()


def spec_hash(spec: RuntimeEnvSpec) -> str:
    """The content hash of ``spec`` built by this control plane (``core.preflight.env_hash``)."""
    return env_hash(spec, control_python(), platform_tag(), control_site())


def folder(runtimes: Path, digest: str) -> Path:
    return runtimes / digest


def env_python(env: Path) -> Path:
    return env / "bin" / "python"


def env_site(env: Path) -> Path:
    major, minor = sys.version_info[:2]
    return env / "lib" / f"python{major}.{minor}" / "site-packages"


def read_lock(runtime_dir: Path) -> RuntimeLock | None:
    path = runtime_dir / LOCK_FILE
    if not path.is_file():
        return None
    try:
        return read_model(path, RuntimeLock)
    except Exception:  # a corrupt lock proves nothing: the environment counts as not built
        return None


# ---------------------------------------------------------------------------------------------
# The lock: visible packages and files
# ---------------------------------------------------------------------------------------------


def visible_packages(site: Path, shared_site: str | None) -> list[LockedPackage]:
    """Every distribution the environment's interpreter finds, the first one of each name (its
    own site first, then the shared one), sorted by name."""
    found: dict[str, LockedPackage] = {}
    places: list[tuple[str, str]] = [("environment", str(site))]
    if shared_site:
        places.append(("shared", shared_site))
    for location, path in places:
        for dist in metadata.distributions(path=[path]):
            name = dist.metadata["Name"]
            if not name:
                continue
            key = normalize_name(name)
            if key not in found:
                found[key] = LockedPackage(
                    name=key,
                    version=dist.version,
                    location=location,  # type: ignore[arg-type]
                )
    return [found[k] for k in sorted(found)]


def lock_digest(packages: list[LockedPackage]) -> str:
    return sha256_bytes(canonical_json([[p.name, p.version, p.location] for p in packages]))


class _Entry(NamedTuple):
    path: Path
    size: int  # a link: the length of its target
    stat: os.stat_result | None  # a link: None


def _entries(env: Path) -> dict[str, _Entry]:
    """Every file and link under ``env`` by relative name, from one ``scandir`` walk (an
    isolated environment holds some ten thousand files)."""
    found: dict[str, _Entry] = {}
    prefix = len(str(env)) + 1
    stack = [str(env)]
    while stack:
        with os.scandir(stack.pop()) as listing:
            for item in listing:
                if item.is_symlink():
                    size = len(os.readlink(item.path))
                    found[item.path[prefix:]] = _Entry(Path(item.path), size, None)
                elif item.is_dir():
                    stack.append(item.path)
                elif item.is_file():
                    info = item.stat()
                    found[item.path[prefix:]] = _Entry(Path(item.path), info.st_size, info)
    return dict(sorted(found.items()))


def _file_entry(name: str, entry: _Entry) -> InventoryFile:
    if entry.stat is None:  # the interpreter links: what they point at is what is recorded
        target = os.readlink(entry.path).encode()
        return InventoryFile(path=name, size=len(target), sha256=sha256_bytes(b"link:" + target))
    digest = file_sha256(entry.path, stat=entry.stat)
    return InventoryFile(path=name, size=entry.size, sha256=digest)


def inventory(env: Path) -> list[InventoryFile]:
    """The sha256 of every file of an environment (symlinks by their target)."""
    return [_file_entry(name, entry) for name, entry in _entries(env).items()]


def compare(runtime_dir: Path, lock: RuntimeLock, *, full: bool) -> list[str]:
    """What differs between a built environment and its lock (empty: nothing). ``full``: every
    file's sha256, else the file set and sizes only (cheap enough for every read)."""
    env = runtime_dir / ENV_DIR
    if not env_python(env).exists():
        return [f"no interpreter at {env_python(env)}"]
    local = _entries(env)
    recorded = {f.path: f for f in lock.files}
    problems = [f"missing: {n}" for n in sorted(set(recorded) - set(local))]
    problems += [f"not in the lock: {n}" for n in sorted(set(local) - set(recorded))]
    for name in sorted(set(local) & set(recorded)):
        entry, want = local[name], recorded[name]
        if entry.size != want.size:
            problems.append(f"{name}: {entry.size} bytes, the lock says {want.size}")
        elif full and _file_entry(name, entry).sha256 != want.sha256:
            problems.append(f"{name}: sha256 differs from the lock's {want.sha256[:12]}…")
    seen = visible_packages(env_site(env), lock.shared_site)
    if seen != lock.packages:
        before = {p.name: p for p in lock.packages}
        now = {p.name: p for p in seen}
        for name in sorted(set(before) | set(now)):
            old, new = before.get(name), now.get(name)
            if old != new:
                problems.append(
                    f"package {name}: "
                    + (f"{old.version} ({old.location})" if old else "absent")
                    + " in the lock, now "
                    + (f"{new.version} ({new.location})" if new else "absent")
                )
    if lock_digest(lock.packages) != lock.lock_digest:
        problems.append("the lock's package digest does not match its package list")
    if inventory_digest(lock.files) != lock.files_digest:
        problems.append("the lock's file digest does not match its file list")
    return problems


# ---------------------------------------------------------------------------------------------
# Facts for preflight, and checks before use
# ---------------------------------------------------------------------------------------------


def runtime_facts(runtimes: Path) -> dict[str, RuntimeFacts]:
    """Every built environment of a home, by content hash, as a quick look finds it."""
    found: dict[str, RuntimeFacts] = {}
    for lock_path in sorted(runtimes.glob(f"*/{LOCK_FILE}")) if runtimes.is_dir() else []:
        runtime_dir = lock_path.parent
        lock = read_lock(runtime_dir)
        if lock is None:
            continue
        problems = compare(runtime_dir, lock, full=False)
        if lock.env_hash != runtime_dir.name:
            problems.insert(0, f"its lock names {lock.env_hash[:12]}, not its folder")
        found[runtime_dir.name] = RuntimeFacts(
            built=True,
            problems=problems,
            packages={p.name: p.version for p in lock.packages},
            accepted_flags=lock.accepted_flags,
            size_bytes=lock.size_bytes,
            lock_digest=lock.lock_digest,
        )
    return found


def as_recipe_runtime(lock: RuntimeLock) -> RecipeRuntime:
    return RecipeRuntime(
        env_hash=lock.env_hash,
        python=lock.python,
        lock_digest=lock.lock_digest,
        files_digest=lock.files_digest,
        label=env_label(lock.spec),
    )


def ensure_runtime(spec: RuntimeEnvSpec, runtimes: Path) -> RecipeRuntime:
    """The built, untampered environment of ``spec`` (every file re-hashed); raises
    ``RuntimeMissing`` or ``RuntimeTampered``."""
    digest = spec_hash(spec)
    runtime_dir = folder(runtimes, digest)
    lock = read_lock(runtime_dir)
    if lock is None:
        raise RuntimeMissing(
            f"runtime environment {digest[:12]} ({env_label(spec)}) is not built: "
            "run `mcp-infra prepare CANDIDATE`"
        )
    problems = compare(runtime_dir, lock, full=True)
    if lock.env_hash != digest:
        problems.insert(0, f"its lock names {lock.env_hash[:12]}, not its folder")
    if problems:
        raise RuntimeTampered(
            f"runtime environment {digest[:12]} differs from its lock: " + "; ".join(problems[:5])
        )
    return as_recipe_runtime(lock)


def verify_recipe_runtime(runtime: RecipeRuntime) -> None:
    """Before a server starts from its own environment: the environment is the one the recipe
    recorded (same lock and file digests) and still matches its lock byte for byte."""
    env = Path(runtime.python).parent.parent
    runtime_dir = env.parent
    lock = read_lock(runtime_dir)
    if lock is None or lock.env_hash != runtime.env_hash:
        raise RuntimeMissing(
            f"runtime environment {runtime.env_hash[:12]} ({runtime.label}) is not built at "
            f"{runtime_dir}: run `mcp-infra prepare CANDIDATE`"
        )
    problems = compare(runtime_dir, lock, full=True)
    if (lock.lock_digest, lock.files_digest) != (runtime.lock_digest, runtime.files_digest):
        problems.insert(0, "its lock is not the one this recipe was resolved with")
    if problems:
        raise RuntimeTampered(
            f"runtime environment {runtime.env_hash[:12]} ({runtime.label}) differs from its "
            "lock: " + "; ".join(problems[:5])
        )


# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------


def is_offline() -> bool:
    return (os.environ.get("PIP_NO_INDEX") or "").strip().lower() in {"1", "true", "yes", "on"}


def download_bytes(spec: RuntimeEnvSpec) -> int:
    """What building downloads at most, as the manifest states the sizes (0 where unstated)."""
    return sum(p.size_bytes or 0 for p in spec.packages)


def refusals(spec: RuntimeEnvSpec, policy: Policy, free_bytes: int) -> list[str]:
    """Why ``spec`` may not be built here (empty: it may)."""
    problems = pin_problems(spec)
    have = ".".join(control_python().split(".")[:2])
    if have != spec.python:
        problems.append(f"it needs Python {spec.python}; the control plane runs Python {have}")
    download = download_bytes(spec)
    if download / GB > policy.budgets.download_gb:
        problems.append(
            f"{download / GB:.2f} GB to download exceeds the policy's download budget of "
            f"{policy.budgets.download_gb:g} GB"
        )
    if free_bytes < 3 * download + DISK_MARGIN_GB * GB:
        problems.append(
            f"only {free_bytes / GB:.2f} GB free for the environment; its {download / GB:.2f} "
            f"GB of downloads unpack to more (+{DISK_MARGIN_GB:g} GB margin)"
        )
    return problems


def _free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _run(argv: list[str], log: Path, timeout: float, what: str) -> None:
    """One build step (an argv list, never a shell), its output appended to the build log."""
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        try:
            done = subprocess.run(  # argv list, never a shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                env=_step_env(),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeEnvError(f"{what}: no result after {timeout:.0f} s (see {log})") from exc
    if done.returncode != 0:
        tail = log.read_bytes()[-800:].decode("utf-8", errors="replace").strip()
        raise RuntimeEnvError(f"{what} failed (exit {done.returncode}); {log}: …{tail}")


def _step_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "PYTHONNOUSERSITE": "1"})
    env.pop("PYTHONPATH", None)
    return env


def _read_help(python: Path, template: str, log: Path) -> str:
    argv = [str(python), *SERVER_MODULES[template], "--help"]
    try:
        done = subprocess.run(  # argv list, never a shell
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=HELP_TIMEOUT_S,
            env=_step_env(),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeEnvError(
            f"{template} --help gave no answer in {HELP_TIMEOUT_S:.0f} s"
        ) from exc
    text = done.stdout.decode("utf-8", errors="replace")
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode() + done.stdout + done.stderr)
    if done.returncode != 0 or "--model" not in text:
        raise RuntimeEnvError(
            f"{template} in the new environment does not start (`{' '.join(argv[1:])}` exit "
            f"{done.returncode}): {done.stderr.decode('utf-8', errors='replace')[-400:]}"
        )
    return text


def builder_name() -> str:
    return "uv" if shutil.which("uv") else "venv + pip"


def build(
    spec: RuntimeEnvSpec,
    runtimes: Path,
    policy: Policy,
    *,
    offline: bool | None = None,
    progress: bool = True,
    free_bytes: int | None = None,
) -> BuildResult:
    """Build ``spec``'s environment (or reuse it when it is built and matches its lock), read
    its servers' ``--help``, hash it and write its lock. Refuses an unpinned spec, another
    Python, a download over the budget; offline, names what is missing."""
    started = time.monotonic()
    digest = spec_hash(spec)
    runtime_dir = folder(runtimes, digest)
    label = env_label(spec)

    def say(text: str) -> None:
        if progress:
            print(f"runtime {digest[:12]} ({label}): {text}", file=sys.stderr, flush=True)

    lock = read_lock(runtime_dir)
    if lock is not None:
        problems = compare(runtime_dir, lock, full=True)
        if not problems:
            say("built already; its files and packages match the lock")
            return _result(lock, runtime_dir, label, True, started, 0)
        raise RuntimeTampered(
            f"runtime environment {digest[:12]} differs from its lock: {'; '.join(problems[:5])}; "
            f"remove {runtime_dir} and prepare again"
        )
    refused = refusals(spec, policy, _free_bytes(runtimes) if free_bytes is None else free_bytes)
    if refused:
        raise RuntimeRefused(f"runtime environment {label}: not built: " + "; ".join(refused))
    if is_offline() if offline is None else offline:
        raise RuntimeMissing(
            f"offline: runtime environment {digest[:12]} is not built and cannot be: missing "
            + ", ".join(f"{p.name}=={p.version}" for p in spec.packages)
            + f" (prepare where the package index is reachable; it builds into {runtime_dir})"
        )
    with _building(runtimes, digest):
        if (done := read_lock(runtime_dir)) is not None:  # built meanwhile by another prepare
            return _result(done, runtime_dir, label, True, started, 0)
        return _build(spec, runtime_dir, say, started)


@contextlib.contextmanager
def _building(runtimes: Path, digest: str) -> Iterator[None]:
    """One build of an environment at a time (an flock: it dies with its holder)."""
    runtimes.mkdir(parents=True, exist_ok=True)
    with (runtimes / f".{digest}.lock").open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise RuntimeEnvError(
                f"runtime environment {digest[:12]} is being built by another process"
            ) from exc
        yield


def _build(
    spec: RuntimeEnvSpec, runtime_dir: Path, say: Callable[[str], None], started: float
) -> BuildResult:
    """Create, install, read --help, hash, lock: the build itself, under its flock."""
    label = env_label(spec)
    runtime_dir.mkdir(parents=True, exist_ok=True)
    env = runtime_dir / ENV_DIR
    if env.exists():  # a build that did not finish: never half-used
        shutil.rmtree(env)
    log = runtime_dir / BUILD_LOG
    log.write_bytes(b"")
    try:
        builder = _install(spec, env, runtime_dir, log, say)
        say("reading the launch templates' --help in the new environment")
        shared = control_site() if spec.site == "shared" else None
        names = {p.name for p in visible_packages(env_site(env), shared)}
        helps = {
            template: _read_help(env_python(env), template, log)
            for template, package in RUNTIME_PACKAGES.items()
            if package in names
        }
        say("hashing every file of the environment")
        lock = make_lock(spec, runtime_dir, helps, builder, time.monotonic() - started)
    except BaseException:
        shutil.rmtree(env, ignore_errors=True)
        raise
    write_model(runtime_dir / LOCK_FILE, lock)
    say(f"built: {len(lock.packages)} packages visible, {lock.size_bytes / 1e6:.1f} MB on disk")
    return _result(lock, runtime_dir, label, False, started, download_bytes(spec))


def make_lock(
    spec: RuntimeEnvSpec,
    runtime_dir: Path,
    helps: dict[str, str],
    builder: str,
    build_s: float | None = None,
) -> RuntimeLock:
    """The lock of the environment in ``runtime_dir``: what it sees, its servers' flags (from
    their ``--help`` texts), every file's sha256."""
    env = runtime_dir / ENV_DIR
    shared = control_site() if spec.site == "shared" else None
    packages = visible_packages(env_site(env), shared)
    files = inventory(env)
    return RuntimeLock(
        env_hash=runtime_dir.name,
        spec=spec,
        python=str(env_python(env)),
        python_version=control_python(),
        platform=platform_tag(),
        shared_site=shared,
        packages=packages,
        lock_digest=lock_digest(packages),
        accepted_flags={t: help_flags(text) for t, text in helps.items()},
        help_sha256={t: sha256_bytes(text.encode()) for t, text in helps.items()},
        files=files,
        files_digest=inventory_digest(files),
        size_bytes=sum(f.size for f in files),
        built_at=utcnow(),
        build_s=None if build_s is None else round(build_s, 2),
        builder=builder,
    )


def _install(
    spec: RuntimeEnvSpec, env: Path, runtime_dir: Path, log: Path, tell: Callable[[str], None]
) -> str:
    """Create the environment and install exactly the pinned packages into it."""
    requirements = runtime_dir / "requirements.txt"
    requirements.write_text("".join(p.requirement() + "\n" for p in spec.packages))
    uv = shutil.which("uv")
    tell(f"creating the environment ({'uv venv' if uv else 'python -m venv'})")
    if uv:
        _run([uv, "venv", "--python", sys.executable, str(env)], log, 300, "uv venv")
    else:
        _run([sys.executable, "-m", "venv", "--without-pip", str(env)], log, 300, "python -m venv")
    if spec.site == "shared":  # the control plane's site after the environment's own
        (env_site(env) / SHARED_PTH).write_text(
            f"import site; site.addsitedir({control_site()!r})\n"
        )
    tell(f"installing {len(spec.packages)} pinned package(s), hashes required")
    common = ["--no-deps", "--require-hashes", "-r", str(requirements)]
    if uv:
        argv = [uv, "pip", "install", "--python", str(env_python(env)), "--compile-bytecode"]
        argv += (
            common  # bytecode as pip writes it: nothing is compiled later, into the lock's files
        )
    else:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env_python(env)),
            "install",
            "--ignore-installed",
            "--no-input",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            *common,
        ]
    _run(argv, log, BUILD_TIMEOUT_S, "installing the pinned packages")
    if spec.site == "isolated":  # the pins must be the whole closure
        _run(
            [sys.executable, "-m", "pip", "--python", str(env_python(env)), "check"],
            log,
            300,
            "pip check (an isolated environment must pin every dependency)",
        )
    return "uv" if uv else "venv + pip"


def _result(
    lock: RuntimeLock, runtime_dir: Path, label: str, reused: bool, started: float, fetched: int
) -> BuildResult:
    return BuildResult(
        env_hash=lock.env_hash,
        path=str(runtime_dir),
        label=label,
        reused=reused,
        builder=lock.builder,
        seconds=round(time.monotonic() - started, 2),
        download_bytes=fetched,
        python=lock.python,
        packages=len(lock.packages),
        size_bytes=lock.size_bytes,
        lock_digest=lock.lock_digest,
        files_digest=lock.files_digest,
        accepted_flags=lock.accepted_flags,
    )


# ---------------------------------------------------------------------------------------------
# Evidence
# ---------------------------------------------------------------------------------------------


def keep_runtime_locks(home: Home, cycle_dir: Path, recipes: list[Recipe]) -> list[str]:
    """Copy the lock of every environment a cycle's recipes run from into its folder
    (``runtimes/<hash>.json``), so the sealed bundle records each environment's full lock;
    ``state.recomputed.check_runtime_locks`` checks them against the recipes."""
    kept: list[str] = []
    for recipe in recipes:
        runtime = recipe.runtime
        if runtime is None or runtime.env_hash in kept:
            continue
        lock = read_lock(folder(home.runtimes, runtime.env_hash))
        if lock is not None:
            write_model(CycleFiles(cycle_dir).runtime_lock(runtime.env_hash), lock)
            kept.append(runtime.env_hash)
    return kept
