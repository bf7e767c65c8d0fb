"""`mcp-infra init --model PATH|REPO[@REVISION]`: a home whose live service serves that model.

No hand-written YAML: the folder (or the hub repo's snapshot in the local cache) is read as
facts and checked, all before anything is written: a folder that is no model folder names what
it lacks, an architecture the runtime cannot load names its ``model_type``, a model that does
not fit this machine's memory under the policy says by how much. Then its files are hashed (the
identity every later start checks), ``config.yaml`` is written (or its model replaced, keeping
ports, policy and the rest) and the catalog is generated for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psutil
from pydantic import Field

from mcp_infra.contracts import (
    BuildRecord,
    CatalogNote,
    JSONValue,
    Manifest,
    ModelSource,
    Policy,
    Recipe,
    ServiceConfig,
    TemplateName,
    Variant,
)
from mcp_infra.core.catalog import candidate_count
from mcp_infra.core.modelfacts import fit_problem
from mcp_infra.flows.views import View
from mcp_infra.state import modelfolder as folders
from mcp_infra.state import ownbuilds
from mcp_infra.state.artifacts import artifact_path, hub_caches, resolve_recipe
from mcp_infra.state.builds import BuildError
from mcp_infra.state.catalog import load_policy
from mcp_infra.state.context import DEFAULT_POLICY, HomeContext, load_config
from mcp_infra.state.filecache import installed_version
from mcp_infra.state.hostfacts import folder_fingerprint
from mcp_infra.state.store import Home, LockHeld, read_optional, write_model

OWN_BASELINE = "own:target"
"""The candidate id of the configured model served as it is (the baseline's recipe)."""
DEFAULT_PORT = 8080
SCRATCH_OFFSET = 10
SERVE_ORDER: tuple[TemplateName, ...] = ("mlx_lm_server", "mlx_vlm_server")


class InitView(View):
    """What `init --model` did: the model, its identity, where it serves, its catalog."""

    home: str
    model: ModelSource
    template: str
    config: str = Field(description="written (a new home) or updated (its model replaced)")
    port: int
    scratch_port: int
    policy: str
    candidates: dict[str, int] = Field(description="generated candidates per class")
    notes: list[CatalogNote] = Field(default_factory=list)
    said: list[str] = Field(default_factory=list, description="what to do next")


class InitOptions(View):
    """What `init` may set besides the model (None: keep the home's, else the default)."""

    port: int | None = Field(None, ge=1024, le=65535)
    policy: str | None = None
    model_dirs: list[str] | None = None


def locate(home: Home, given: str) -> ModelSource:
    """The folder ``given`` names: a local folder, else ``REPO[@REVISION]`` in the local hub
    cache (the home's, then the shared one). Its digest is filled in later."""
    folder = Path(given).expanduser()
    if folder.exists() and not folder.is_dir():
        raise folders.NotAModelFolder(f"{given}: a file, not a model folder")
    if folder.is_dir():
        path = folder.resolve()
        return ModelSource(given=given, path=str(path), digest="0" * 64, files=0, bytes=0)
    if given.startswith(("/", ".", "~")):
        raise folders.NotAModelFolder(f"{given}: no such folder")
    last: folders.ModelFolderError | None = None
    for cache in hub_caches(home.hf_cache):
        if not cache.is_dir():
            continue
        try:
            snapshot, repo, revision = folders.resolve_hub(given, cache)
        except folders.NotCached as exc:
            last = exc
            continue
        return ModelSource(
            given=given,
            path=str(snapshot),
            repo=repo,
            revision=revision,
            digest="0" * 64,
            files=0,
            bytes=0,
        )
    if last is None:  # no cache at all: resolve against the shared one for its message
        folders.resolve_hub(given, hub_caches(None)[0])
    raise last or folders.NotCached(f"{given}: not in any local Hugging Face cache")


def check_model(home: Home, source: ModelSource, policy_name: str) -> TemplateName:
    """Every refusal `init` can make, before anything is written; the template it serves with."""
    facts = folders.folder_facts(Path(source.path))
    if facts.missing:
        raise folders.NotAModelFolder(
            f"{source.path} is not a model folder: it has no " + "; no ".join(facts.missing)
        )
    assert facts.shape is not None
    template = next((t for t in SERVE_ORDER if t in facts.loaders), None)
    if template is None:
        version = installed_version("mlx-lm") or "(not installed)"
        raise folders.UnsupportedArchitecture(
            f"{source.path}: model_type {facts.shape.model_type!r} is not one the runtime can "
            f"load (mlx-lm {version} has no mlx_lm.models module for it, nor mlx-vlm)"
        )
    policy = load_policy(policy_name, extra=home.user_policy)
    fraction = policy.service.memory_budget_fraction
    problem = fit_problem(facts.weights_bytes, psutil.virtual_memory().total / 2**30, fraction)
    if problem:
        raise folders.DoesNotFit(
            f"{source.path} does not fit this machine under policy {policy.name}: {problem}"
        )
    return template


def _config(
    home: Home, source: ModelSource, template: TemplateName, options: InitOptions
) -> tuple[ServiceConfig, str]:
    baseline = Recipe(
        candidate_id=OWN_BASELINE,
        template=template,
        model_path=source.path,
        artifact_hashes={"target": folders.FILES_PREFIX + source.digest},
    )
    kept = read_optional(home.config, ServiceConfig)
    dirs = list(options.model_dirs) if options.model_dirs is not None else None
    if kept is None:
        port = options.port or DEFAULT_PORT
        config = ServiceConfig(
            port=port,
            scratch_port=port + SCRATCH_OFFSET,
            policy=options.policy or DEFAULT_POLICY,
            baseline=baseline,
            model=source,
            model_dirs=dirs or [],
        )
        return config, "written"
    update: dict[str, object] = {"baseline": baseline, "model": source}
    if options.port:
        update |= {"port": options.port, "scratch_port": options.port + SCRATCH_OFFSET}
    if options.policy:
        update["policy"] = options.policy
    if dirs is not None:
        update["model_dirs"] = dirs
    return kept.model_copy(update=update), "updated"


def init_model(home: Home, given: str, options: InitOptions | None = None) -> InitView:
    """Make (or update) ``home`` so that its live service serves the model ``given``."""
    options = options or InitOptions()
    kept = read_optional(home.config, ServiceConfig) if home.config.exists() else None
    policy_name = options.policy or (kept.policy if kept else DEFAULT_POLICY)
    source = locate(home, given)
    template = check_model(home, source, policy_name)
    if home.lock_is_held():
        raise LockHeld("a supervisor runs a cycle in this home: init again when it is done")
    home.ensure()
    record = folders.record_inventory(home, Path(source.path))
    source = source.model_copy(
        update={
            "digest": record.digest,
            "files": len(record.files),
            "bytes": sum(f.size for f in record.files),
        }
    )
    config, written = _config(home, source, template, options)
    changed = kept is None or kept.baseline.model_path != config.baseline.model_path
    write_model(home.config, config)
    if changed:  # a recipe promoted for another model no longer serves this home
        for stale in (home.active_file, home.previous_file):
            stale.unlink(missing_ok=True)
    catalog = HomeContext(home).catalog
    said = [
        "start it: mcp-infra service start"
        if kept is None or changed
        else "restart it to serve this folder as it is now: mcp-infra service stop && "
        "mcp-infra service start",
        "see what may make it faster: mcp-infra registry",
    ]
    return InitView(
        home=str(home.root),
        model=source,
        template=template,
        config=written,
        port=config.port,
        scratch_port=config.scratch_port,
        policy=config.policy,
        candidates=candidate_count(catalog.manifests) if catalog else {},
        notes=catalog.notes if catalog else [],
        said=said,
    )


def configured_model(home: Home) -> ModelSource | None:
    """The model `init` configured in this home, if any."""
    return load_config(home).model if home.config.exists() else None


# ---------------------------------------------------------------------------------------------
# Builds: made before a cycle measures them (its PREPARE step) or by `mcp-infra prepare`
# ---------------------------------------------------------------------------------------------

Say = Callable[[str, dict[str, JSONValue]], None]
"""How progress is said: a journal line in a cycle (message, fields), a print for prepare."""


def make_builds(
    home: Home,
    policy: Policy,
    wanted: list[tuple[str, Manifest, Variant]],
    cycle_dir: Path | None,
    say: Say,
) -> dict[str, BuildRecord | str]:
    """Each candidate's build, made (or found) from its source: candidate → its record, or why
    it could not be made. A cycle keeps every record in its files (``cycle_dir``)."""
    done: dict[str, BuildRecord | str] = {}
    for candidate, manifest, variant in wanted:
        if variant.build is None:
            continue
        source = artifact_path(manifest.build_source(), home.models, home.hf_cache)
        say(
            f"building {candidate}: mlx_lm.convert {' '.join(variant.build.convert_args())} of "
            f"{source}",
            {"candidate": candidate, "spec": variant.build.model_dump(mode="json")},
        )
        try:
            record = ownbuilds.build_variant(home, manifest, variant, policy, source)
        except BuildError as exc:
            done[candidate] = f"build failed: {exc}"
            say(f"{candidate}: build failed: {exc}", {"candidate": candidate})
            continue
        if cycle_dir is not None:
            ownbuilds.keep_record(cycle_dir, record)
        say(
            f"{candidate}: build {record.key} ready in {record.folder} "
            f"({record.size_bytes / 1e6:.1f} MB, sha256 {record.digest[:12]}…)",
            {"candidate": candidate, "build": record.folder, "digest": record.digest},
        )
        done[candidate] = record
    return done


def build_recipes(
    home: Home,
    policy: Policy,
    wanted: list[tuple[str, Manifest, Variant]],
    cycle_dir: Path | None,
    say: Say,
) -> dict[str, Recipe | str]:
    """The recipes of candidates that serve a build, resolved once the build is made (about to
    be used: every folder's hashes named), or why it could not be made."""
    out: dict[str, Recipe | str] = {}
    made = make_builds(home, policy, wanted, cycle_dir, say)
    for candidate, manifest, variant in wanted:
        built = made.get(candidate)
        if isinstance(built, BuildRecord):
            out[candidate] = resolve_recipe(
                manifest,
                variant,
                home.models,
                home.hf_cache,
                fingerprint=folder_fingerprint,
                runtimes=home.runtimes,
                builds=home.builds,
            )
        elif built is not None:
            out[candidate] = built
    return out
