"""The home directory: the only shared truth between the MCP front, the CLI and the supervisor.

Every file is a contract written atomically (temp file, fsync, rename, fsync of the folder), the
journal is append-only and fsynced per line, and one lock decides which supervisor owns the
service. Readers never trust a file blindly: a corrupt one raises ``CorruptFile`` with its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from mcp_infra.contracts import BASELINE_ID, AuditRecord, Event, FrozenPlan, InventoryFile
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.errors import McpInfraError
from mcp_infra.state.filecache import load_yaml

M = TypeVar("M", bound=BaseModel)

ENV_HOME = "MCP_INFRA_HOME"


class CorruptFile(McpInfraError, RuntimeError):
    """A state file exists but does not parse as its contract: report it, never trust it."""


class LockHeld(McpInfraError, RuntimeError):
    """Another supervisor owns the service."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def default_home() -> Path:
    """``MCP_INFRA_HOME``, else the per-user data directory (XDG; Application Support on macOS)."""
    env = os.environ.get(ENV_HOME)
    if env:
        return Path(env).expanduser()
    if os.uname().sysname == "Darwin":
        return Path.home() / "Library" / "Application Support" / "mcp-infra"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mcp-infra"


def sha256_file(path: Path, progress: Callable[[int], object] | None = None) -> str:
    """The one file hasher; ``progress`` is told the size of each chunk read."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    return digest.hexdigest()


_MEMO: dict[tuple[str, int, int, int, int], str] = {}


def _stat_key(path: Path) -> tuple[str, int, int, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def file_sha256(
    path: Path,
    progress: Callable[[int], object] | None = None,
    stat: os.stat_result | None = None,
) -> str:
    """``sha256_file`` memoized per process by (path, size, mtime, ctime, inode): any write to a
    file changes its ctime, so an unchanged stat means unchanged bytes, and a long-lived
    supervisor does not re-read gigabytes per candidate. ``stat``: the file's own stat, already
    read by a directory walk (the path is then taken as it is, not resolved)."""
    key = (
        _stat_key(path)
        if stat is None
        else (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    )
    if key in _MEMO:
        if progress:
            progress(key[1])
        return _MEMO[key]
    _MEMO[key] = sha256_file(path, progress)
    return _MEMO[key]


def inventory_digest(files: list[InventoryFile]) -> str:
    """sha256 over the sorted (path, size, sha256) list of an inventory."""
    return sha256_bytes(
        canonical_json([[f.path, f.size, f.sha256] for f in sorted(files, key=lambda f: f.path)])
    )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


PRIVATE_FILE = 0o600  # home files: plans, the audit log and logs are the user's alone
PRIVATE_DIR = 0o700


def private_dir(path: Path) -> Path:
    """``mkdir -p`` whose every created folder is 0700 (whatever the umask)."""
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            continue
        os.chmod(folder, PRIVATE_DIR)
    return path


def open_append(path: Path) -> IO[bytes]:
    """Open a log or journal for appending, created 0600 (its folder 0700) if it is new."""
    private_dir(path.parent)
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE), "ab")


def write_bytes_atomic(path: Path, data: bytes, mode: int = PRIVATE_FILE) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_model(path: Path, model: BaseModel) -> None:
    """Write a contract as JSON (``.json``) or YAML (``.yaml``), atomically."""
    data = model.model_dump(mode="json", by_alias=True)
    if path.suffix in {".yaml", ".yml"}:
        payload = yaml.safe_dump(data, sort_keys=False, allow_unicode=True).encode()
    else:
        payload = (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode()
    write_bytes_atomic(path, payload)


def read_model(path: Path, cls: type[M]) -> M:
    """Read a contract; a file that exists but does not validate raises ``CorruptFile``."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    try:
        data = load_yaml(path) if path.suffix in {".yaml", ".yml"} else json.loads(raw)
        return cls.model_validate(data)
    except (ValueError, yaml.YAMLError, ValidationError) as exc:
        raise CorruptFile(f"{path} is not a valid {cls.__name__}: {str(exc)[:300]}") from exc


def read_optional(path: Path, cls: type[M]) -> M | None:
    try:
        return read_model(path, cls)
    except FileNotFoundError:
        return None


class CycleFiles:
    """The files of one cycle: its working folder under ``cycles/`` and its sealed bundle under
    ``evidence/`` have the same names, so one class names them both."""

    PLAN = "plan.json"
    VERDICT = "verdict.json"
    SUMMARY = "summary.json"
    MANIFEST = "MANIFEST.json"
    JOURNAL = "journal.ndjson"
    ENVIRONMENT = "environment.json"
    SIGNATURE = "SIGNATURE.dsse.json"
    BASELINE_RUN = "baseline.json"
    DISTRIBUTED = "distributed.json"

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def distributed(self) -> Path:
        """Split recipes: the hosts as preflight found them and every launch with its ranks."""
        return self.root / self.DISTRIBUTED

    @property
    def plan(self) -> Path:
        return self.root / self.PLAN

    @property
    def verdict(self) -> Path:
        return self.root / self.VERDICT

    @property
    def summary(self) -> Path:
        return self.root / self.SUMMARY

    @property
    def manifest(self) -> Path:
        return self.root / self.MANIFEST

    @property
    def journal(self) -> Path:
        return self.root / self.JOURNAL

    @property
    def environment(self) -> Path:
        return self.root / self.ENVIRONMENT

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def runtimes(self) -> Path:
        """The locks of the runtime environments the cycle's recipes ran from."""
        return self.root / "runtimes"

    def runtime_lock(self, env_hash: str) -> Path:
        return self.runtimes / f"{env_hash}.json"

    def run(self, candidate: str) -> Path:
        """The run file of a candidate (``baseline.json`` for the baseline)."""
        name = self.BASELINE_RUN if candidate == BASELINE_ID else f"{file_safe(candidate)}.json"
        return self.runs / name

    def is_sealed(self) -> bool:
        return self.manifest.exists()


def file_safe(candidate: str) -> str:
    """The one way a candidate id becomes part of a file name (``demo-tiny:draft-k4`` →
    ``demo-tiny__draft-k4``); ids are already restricted to ``[a-z0-9._-]`` and one colon."""
    return candidate.replace(":", "__")


class Home:
    """Paths of the home directory, and the few operations that must be done one way only."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root).expanduser().resolve() if root else default_home().resolve()

    # layout ---------------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def plans(self) -> Path:
        return self.root / "plans"

    @property
    def queue(self) -> Path:
        return self.plans / "queue"

    @property
    def cycles(self) -> Path:
        return self.root / "cycles"

    @property
    def evidence(self) -> Path:
        return self.root / "evidence"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def memory(self) -> Path:
        return self.root / "memory"

    @property
    def audit_log(self) -> Path:
        return self.root / "audit.ndjson"

    @property
    def user_registry(self) -> Path:
        return self.root / "registry"

    @property
    def user_policy(self) -> Path:
        return self.root / "policy"

    @property
    def runtimes(self) -> Path:
        """Pinned runtime environments, one folder per content hash (``state.runtimes``)."""
        return self.root / "runtimes"

    @property
    def hf_cache(self) -> Path:
        return self.root / "hf-cache"

    @property
    def references(self) -> Path:
        """Each configuration's reference answers (``state.references``)."""
        return self.root / "references"

    @property
    def builds(self) -> Path:
        """Quantized builds made by ``prepare`` (``state.builds``), each beside its record."""
        return self.root / "builds"

    # state/: what serves now, who supervises, what a cycle is doing ---------------------------
    @property
    def active_file(self) -> Path:
        """The live recipe (absent: the configured baseline)."""
        return self.state / "active.json"

    @property
    def previous_file(self) -> Path:
        return self.state / "previous.json"

    @property
    def service_file(self) -> Path:
        """The stable server's process record."""
        return self.state / "service.json"

    @property
    def candidates_dir(self) -> Path:
        """Process records of scratch servers, one per port."""
        return self.state / "candidates"

    @property
    def supervisor_file(self) -> Path:
        return self.state / "supervisor.json"

    @property
    def watcher_file(self) -> Path:
        return self.state / "watcher.json"

    @property
    def current_file(self) -> Path:
        """The cycle in progress, its state and candidate (a ``CurrentCycle``)."""
        return self.state / "current.json"

    @property
    def projections(self) -> Path:
        """Projected plan costs, cached by what they were priced from (``flows.projection``)."""
        return self.state / "projections"

    @property
    def needs_operator_file(self) -> Path:
        """Present while the service could not be restored (a ``NeedsOperatorRecord``)."""
        return self.state / "needs_operator.json"

    @property
    def lock_file(self) -> Path:
        return self.state / "supervisor.lock"

    # cycles and bundles ---------------------------------------------------------------------
    def cycle_dir(self, cycle_id: str) -> Path:
        return self.cycles / cycle_id

    def cycle_files(self, cycle_id: str) -> CycleFiles:
        return CycleFiles(self.cycle_dir(cycle_id))

    def bundle_files(self, cycle_id: str) -> CycleFiles:
        return CycleFiles(self.evidence / cycle_id)

    def bundle_dirs(self) -> list[Path]:
        """The evidence folder's bundle folders, by name, never the hidden one a bundle is
        written in (``state.evidence.seal`` renames ``.{cycle_id}.tmp`` into place when it is
        complete; pathlib's ``*`` would match it)."""
        if not self.evidence.is_dir():
            return []
        return sorted(
            p for p in self.evidence.iterdir() if p.is_dir() and not p.name.startswith(".")
        )

    def journal(self, cycle_id: str) -> Path:
        return self.cycle_files(cycle_id).journal

    def ensure(self) -> Home:
        """Create the layout; the home folder and every folder made here are 0700."""
        private_dir(self.root)
        with contextlib.suppress(OSError):  # a home made before, or by hand: made private too
            if stat.S_IMODE(self.root.stat().st_mode) & 0o077:
                os.chmod(self.root, PRIVATE_DIR)
        for path in (
            self.plans,
            self.queue,
            self.cycles,
            self.evidence,
            self.state,
            self.models,
            self.logs,
            self.memory,
            self.hf_cache,
        ):
            private_dir(path)
        return self

    # plans and queue ------------------------------------------------------------------------
    def plan_path(self, plan_id: str) -> Path:
        return self.plans / f"{plan_id}.json"

    def enqueue(self, plan: FrozenPlan) -> Path:
        """Freeze the plan on disk, then add it to the queue (ordered by name = time + id)."""
        self.ensure()
        write_model(self.plan_path(plan.plan_id), plan)
        stamp = plan.created_at.strftime("%Y%m%dT%H%M%S%f")
        entry = self.queue / f"{stamp}-{plan.plan_id}.json"
        write_model(entry, plan)
        return entry

    def retire(self, entry: Path) -> None:
        """Move a queue entry to ``plans/done``: its plan ran (or was interrupted and sealed)."""
        done = private_dir(self.plans / "done")
        entry.replace(done / entry.name)

    def queued(self) -> list[Path]:
        if not self.queue.is_dir():
            return []
        return sorted(p for p in self.queue.glob("*.json") if not p.name.startswith("."))

    # journal --------------------------------------------------------------------------------
    def append_event(self, event: Event) -> None:
        """Append one line and fsync it before the caller performs the side effect it announces.
        A line the disk had no room for is cut off again, so the journal never ends torn."""
        path = self.journal(event.cycle_id)
        line = (event.model_dump_json() + "\n").encode()
        private_dir(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE)
        try:
            start = os.fstat(fd).st_size
            try:
                written = 0
                while written < len(line):
                    written += os.write(fd, line[written:])
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)

    def read_journal(self, cycle_id: str) -> tuple[list[Event], list[str]]:
        """Events of a cycle, and a list of problems (a torn last line is reported, not fatal)."""
        return read_journal_file(self.journal(cycle_id))

    def append_audit(self, record: AuditRecord) -> None:
        with open_append(self.audit_log) as handle:
            handle.write((record.model_dump_json() + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())

    # lock -----------------------------------------------------------------------------------
    @contextmanager
    def supervisor_lock(self) -> Iterator[IO[str]]:
        """Hold the supervisor lock (an flock that dies with the process, so no stale locks)."""
        self.ensure()
        path = self.lock_file
        handle = path.open("a+")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            handle.close()
            raise LockHeld(f"another supervisor holds {path}") from exc
        try:
            yield handle
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            handle.close()

    def lock_is_held(self) -> bool:
        return flock_held(self.lock_file)


def flock_held(path: Path) -> bool:
    """Does some process hold an flock on ``path`` now? (A look, never a wait.)"""
    if not path.exists():
        return False
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        return False


def read_journal_file(path: Path) -> tuple[list[Event], list[str]]:
    events: list[Event] = []
    problems: list[str] = []
    if not path.exists():
        return events, problems
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            events.append(Event.model_validate_json(line))
        except ValidationError:
            problems.append(f"{path.name} line {number} is not a valid event (torn write?)")
    return events, problems
