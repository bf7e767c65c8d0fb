"""What a home says now: its service configuration, the live recipe, the stable server's record,
and the maintenance window under its policy.
"""

from __future__ import annotations

from datetime import UTC, datetime

from mcp_infra.contracts import ProcessRecord, Recipe, ServiceConfig
from mcp_infra.core.schedule import WindowState, check
from mcp_infra.state.store import Home, read_model, read_optional


def load_config(home: Home) -> ServiceConfig:
    return read_model(home.config, ServiceConfig)


def active_recipe(home: Home) -> Recipe:
    """What should serve on the stable port: state/active.json, else the configured baseline."""
    active = read_optional(home.active_file, Recipe)
    return active or load_config(home).baseline




def service_record(home: Home) -> ProcessRecord | None:
    return read_optional(home.service_file, ProcessRecord)


def window_state(home: Home, now: datetime | None = None) -> WindowState:
    """The window check for a home's configured policy and cycle budget, at ``now`` (UTC now)."""
    from mcp_infra.state.catalog import load_policy
    from mcp_infra.state.context import load_config

    name = load_config(home).policy if home.config.exists() else "default"
    policy = load_policy(name, extra=home.user_policy)
    return check(policy.window, now or datetime.now(UTC), policy.budgets.cycle_minutes)
