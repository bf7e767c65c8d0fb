"""Who can fix a refused plan: the caller, or a person (and then what the person runs).

A refusal is the caller's to fix (a field, an id, a limit: the text names it) unless nothing the
caller could send would be accepted: no managed service is configured in the home, or no
candidate of the registry can run on this machine now. Then the refusal says that a person must
act, and what they run, so an agent stops retrying and tells them.
"""

from __future__ import annotations

from collections.abc import Callable

from mcp_infra.faces import render
from mcp_infra.flows import api as app
from mcp_infra.state.store import Home


def proposable(view: app.RegistryView) -> list[str]:
    """The candidates a plan may name now: they pass preflight and recipe memory runs them."""
    return [c.id for c in view.candidates if c.preflight_passed and not c.skip]


def person_fix(
    home: Home, view: app.ProposalView, registry: Callable[[], app.RegistryView]
) -> str | None:
    """What a person runs where the caller cannot fix the refusal; None where it can."""
    if view.accepted:
        return None
    if not home.config.exists():
        return render.CONFIGURE
    if view.refused and not proposable(registry()):
        return render.PREPARE
    return None
