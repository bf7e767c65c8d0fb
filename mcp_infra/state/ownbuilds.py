"""Quantized builds as candidates: made before a cycle measures them, and checked again from a
sealed bundle (a recipe finds its build with ``modelfolder.recorded_build``).

A variant with a ``build`` (``Variant.build``) is served from ``<home>/builds/<key>-<digest>/``,
made by ``state.builds.make_build`` from the manifest's source (the configured target, or an
unquantized copy of it) by ``mcp-infra prepare`` or the cycle's PREPARE step. The cycle keeps
each build's record (the exact command, the source's and the output's digests, every file's
sha256) in ``builds/`` of its bundle; ``evidence verify`` recomputes the record's digest, finds
the command's options and source in it, and checks that the recipe measured is the recorded
folder with that digest (and, where the folder is still here, that its files are unchanged).
"""

from __future__ import annotations

from pathlib import Path

from mcp_infra.contracts import (
    BuildRecord,
    Manifest,
    Policy,
    Recipe,
    Variant,
)
from mcp_infra.state.builds import BuildError, make_build, verify_build
from mcp_infra.state.modelfolder import FILES_PREFIX, record_inventory
from mcp_infra.state.store import Home, inventory_digest, read_model, write_model

RECORDS = "builds"
"""The folder of a cycle (and its bundle) that keeps the records of the builds it measured."""


def build_variant(
    home: Home, manifest: Manifest, variant: Variant, policy: Policy, source: str
) -> BuildRecord:
    """Make (or reuse) a variant's build from ``source`` into ``home.builds`` within the
    policy's disk budget; its file list is recorded like any model folder's, so a start names
    what changed in it. Raises ``state.builds.BuildError`` with the converter's words."""
    assert variant.build is not None
    record = make_build(Path(source), variant.build, home.builds, policy.budgets)
    record_inventory(home, Path(record.folder))
    return record


def keep_record(cycle_dir: Path, record: BuildRecord) -> None:
    """The build's record into the cycle's files (sealed with them)."""
    write_model(cycle_dir / RECORDS / f"{Path(record.folder).name}.json", record)


def build_problems(
    bundle: Path, recipes: list[Recipe], builds: set[str]
) -> tuple[list[str], list[str]]:
    """(problems, what was checked) of the build records a bundle carries, against the
    recipes its journal resolved; ``builds``: the candidates whose variant serves a build
    (each must have been served from a recorded build)."""
    folder = bundle / RECORDS
    records = (
        [read_model(p, BuildRecord) for p in sorted(folder.glob("*.json"))]
        if folder.is_dir()
        else []
    )
    served = {r.model_path: r for r in recipes}
    problems: list[str] = []
    shown: list[str] = []
    for record in records:
        where = f"build {record.key}"
        if inventory_digest(record.files) != record.digest:
            problems.append(f"{where}: its file list does not give its digest")
        options = record.spec.convert_args()
        argv = record.argv
        if "--hf-path" not in argv or argv[argv.index("--hf-path") + 1] != record.source:
            problems.append(f"{where}: its command does not name its source")
        if any(option not in argv for option in options):
            problems.append(f"{where}: its command lacks {' '.join(options)}")
        recipe = served.get(record.folder)
        if recipe is None:
            problems.append(f"{where}: no recipe of the cycle served {record.folder}")
        elif recipe.artifact_hashes.get("target") != FILES_PREFIX + record.digest:
            problems.append(f"{where}: {recipe.candidate_id} was served with other files")
        if Path(record.folder).is_dir():
            try:
                verify_build(record)
            except BuildError as exc:
                problems.append(str(exc))
        shown.append(f"{record.key} ({record.digest[:12]}…, `mlx_lm convert {' '.join(options)}`)")
    recorded = {r.folder for r in records}
    problems += [
        f"{r.candidate_id}: measured without a bundled build record"
        for r in recipes
        if r.candidate_id in builds and Path(r.model_path).exists() and r.model_path not in recorded
    ]
    return problems, shown
