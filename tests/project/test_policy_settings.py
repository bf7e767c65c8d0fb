"""Every policy setting has a user (the house rule): each `Policy` field is set differently from
the code's default in at least one shipped policy, or docs/cycle.md names it under "Settings a
person is expected to change". A field neither does is a constant."""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from mcp_infra.contracts import Policy
from mcp_infra.state.catalog import load_policy
from tests.helpers.paths import REPO

SHIPPED = ("default", "single-user", "demo")
FILLED_BY_CODE = {"protocol.learned_spread"}  # set when a plan is frozen, never in a policy
SECTION = "## Settings a person is expected to change"


def leaf_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    for name, info in model.model_fields.items():
        if name == "schema_version":
            continue
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from leaf_fields(kind, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", info


def value(obj: object, path: str) -> object:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def person_section() -> str:
    text = (REPO / "docs" / "cycle.md").read_text()
    assert SECTION in text
    return text.split(SECTION, 1)[1].split("\n## ", 1)[0]


def test_every_policy_field_is_set_by_a_shipped_policy_or_named_for_a_person() -> None:
    policies = [load_policy(name) for name in SHIPPED]
    named = person_section()
    unused = []
    for path, info in leaf_fields(Policy):
        if info.is_required() or path in FILLED_BY_CODE:
            continue
        default = info.get_default(call_default_factory=True)
        if any(value(p, path) != default for p in policies):
            continue
        if f"`{path}`" not in named:
            unused.append(path)
    assert not unused, f"constants, or name them in docs/cycle.md ({SECTION[3:]}): {unused}"


def test_the_check_sees_a_field_no_policy_sets_and_no_person_changes() -> None:
    paths = dict(leaf_fields(Policy))
    assert "service.max_unserved_s" in paths and "protocol.learned_spread" in paths
    assert "`service.max_unserved_s`" in person_section()
    assert "`protocol.seed`" not in person_section()  # a constant now (stats.SEED)
