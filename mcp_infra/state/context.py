"""What a home says now, loaded once: its service configuration, its policy, the registry, this
machine's facts, the live recipe, the stable server's record and the maintenance window.

Every flow starts from one ``HomeContext`` instead of re-reading config → policy → registry → host
facts → live recipe itself. Each part is read the first time it is asked for and kept for the
life of the object (one tool call, one cycle), so a cheap question never pays for an expensive
one (host facts look at disks and caches).
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cached_property

from mcp_infra.contracts import (
    GeneratedCatalog,
    Manifest,
    NeedsOperatorRecord,
    Policy,
    ProcessRecord,
    Recipe,
    ServiceConfig,
    Variant,
)
from mcp_infra.core.preflight import HostFacts, Preflight, find_candidate, preflight, registry_hash
from mcp_infra.core.sanitize import policy_hash
from mcp_infra.core.schedule import WindowState, check
from mcp_infra.state.catalog import load_policy, read_registry
from mcp_infra.state.hostfacts import host_facts
from mcp_infra.state.owncatalog import (
    bind_configured,
    configured_target,
    ensure_catalog,
    model_facts,
)
from mcp_infra.state.runtimes import runtime_facts
from mcp_infra.state.store import Home, read_model, read_optional, utcnow, write_model

DEFAULT_POLICY = "default"


def load_config(home: Home) -> ServiceConfig:
    return read_model(home.config, ServiceConfig)


def active_recipe(home: Home) -> Recipe:
    """What should serve on the stable port: state/active.json, else the configured baseline."""
    active = read_optional(home.active_file, Recipe)
    return active or load_config(home).baseline


def service_record(home: Home) -> ProcessRecord | None:
    return read_optional(home.service_file, ProcessRecord)


def mark_needs_operator(home: Home, cycle_id: str, reason: str) -> None:
    """The service could not be restored (by a cycle, ``recover`` or the front's restarts): no
    cycle runs, and no restart is tried, until a person runs ``mcp-infra recover``."""
    write_model(
        home.needs_operator_file, NeedsOperatorRecord(cycle_id=cycle_id, reason=reason, ts=utcnow())
    )


class HomeContext:
    """One home, loaded once. ``configured`` is False before a config.yaml exists; then the
    policy is the shipped default and asking for ``config`` or ``live`` raises
    FileNotFoundError."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self._catalog_problem: str | None = None

    @property
    def configured(self) -> bool:
        return self.home.config.exists()

    @cached_property
    def config(self) -> ServiceConfig:
        return load_config(self.home)

    @cached_property
    def policy(self) -> Policy:
        name = self.config.policy if self.configured else DEFAULT_POLICY
        return load_policy(name, extra=self.home.user_policy)

    @cached_property
    def policy_hash(self) -> str:
        return policy_hash(self.policy)

    @cached_property
    def catalog(self) -> GeneratedCatalog | None:
        """The catalog generated for the model of `init --model` (None: no such model, or it
        could not be made: ``registry_problems`` says why)."""
        if not self.configured:
            return None
        try:
            return ensure_catalog(self.home, self.config)
        except (OSError, ValueError) as exc:  # a folder gone unreadable, a home without room
            self._catalog_problem = f"the catalog for the configured model: {exc}"[:600]
            return None

    @cached_property
    def _registry(self) -> tuple[dict[str, Manifest], list[str]]:
        manifests, problems = read_registry(extra=self.home.user_registry)
        catalog = self.catalog
        problems += [self._catalog_problem] if self._catalog_problem else []
        for manifest in catalog.manifests if catalog else []:
            if manifest.id in manifests:
                problems.append(f"generated {manifest.id}: a registry file defines it; kept")
            else:
                manifests[manifest.id] = manifest
        if self.configured:
            path, digest = configured_target(self.config)
            manifests = {k: bind_configured(m, path, digest) for k, m in manifests.items()}
        return manifests, problems

    @cached_property
    def manifests(self) -> dict[str, Manifest]:
        """Every manifest that loads: shipped, the home's own and the generated catalog's,
        "the configured target" written in as this home's."""
        return self._registry[0]

    @property
    def registry_problems(self) -> list[str]:
        """One line per manifest file that does not load (reported, never hiding the rest)."""
        return self._registry[1]

    @cached_property
    def registry_hash(self) -> str:
        return registry_hash(self.manifests)

    @cached_property
    def facts(self) -> HostFacts:
        facts = host_facts(self.home.root, self.home.models, self.home.hf_cache)
        models = model_facts(self.home, self.config if self.configured else None, self.manifests)
        return facts.model_copy(update={"runtimes": runtime_facts(self.home.runtimes), **models})

    @cached_property
    def live(self) -> Recipe:
        return active_recipe(self.home)

    def find(self, candidate: str) -> tuple[Manifest, Variant] | None:
        return find_candidate(self.manifests, candidate)

    def preflight(self, manifest: Manifest, variant: Variant) -> Preflight:
        return preflight(manifest, variant, self.policy, self.facts)

    def window(self, now: datetime | None = None) -> WindowState:
        """May a cycle start now under the policy's window, with its cycle budget?"""
        return check(
            self.policy.window, now or datetime.now(UTC), self.policy.budgets.cycle_minutes
        )


def window_state(home: Home, now: datetime | None = None) -> WindowState:
    """The window check for a home's configured policy and cycle budget, at ``now`` (UTC now)."""
    return HomeContext(home).window(now)
