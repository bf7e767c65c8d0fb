"""Errors that teach, and hostile input closed (issues 20 item 6 and 21 item 6), over real MCP
sessions (in-memory, both protocol eras) on a home with no built models (nothing is served).

Every invalid plan has one shape: a tool error (isError) whose structured content is the
proposal view with accepted=false and problems naming the field, the limit and the nearest ids.
"""

from __future__ import annotations

import json
import shutil
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_infra.contracts import (
    AuditRecord,
    CycleState,
    Event,
    FrozenPlan,
    Recipe,
    text_problem,
)
from mcp_infra.core.sanitize import PlanRefused, nesting_depth, parse_plan
from mcp_infra.faces.mcp_server import build_server
from mcp_infra.state.store import Home, utcnow, write_model
from tests.helpers.mcp_clients import PLAN, audit
from tests.helpers.paths import SHIPPED

pytestmark = pytest.mark.anyio
ERAS = ["legacy", "auto"]


def text(result: Any) -> str:
    return result.content[0].text if result.content else ""


def assert_refused(result: Any, *needles: str) -> dict[str, Any]:
    """The one shape of an invalid plan; each needle is in the problems and in one-line text."""
    assert result.is_error, text(result)
    view = result.structured_content
    assert view is not None and view["accepted"] is False and view["plan_id"] is None
    body = text(result)
    assert "\n" not in body and body.startswith(("REFUSED", "DRY RUN — REFUSED")), body
    for needle in needles:
        assert needle in body, (needle, body)
        assert any(needle in p for p in view["problems"]) or needle in view["message"]
    return view


@pytest.mark.parametrize("era", ERAS)
async def test_invalid_plans_name_field_limit_and_nearest_ids(
    bare_home: Home, anyio_backend: str, era: str
) -> None:
    async with Client(build_server(bare_home, start_supervisor=False), mode=era) as client:
        forced = await client.call_tool("propose_plan", {"plan": {**PLAN, "force": True}})
        assert_refused(forced, "force: unknown field (allowed: hypothesis, candidates")
        nested = await client.call_tool(
            "propose_plan", {"plan": {**PLAN, "acceptance": {"min_speed": 1}}}
        )
        assert_refused(nested, "acceptance.min_speed: unknown field (allowed: min_speedup_pct")
        ten = await client.call_tool(
            "propose_plan", {"plan": {"hypothesis": "h", "candidates": ["demo-tiny:x"] * 20}}
        )
        assert_refused(ten, "candidates: at most 16 items, got 20")
        long = await client.call_tool("propose_plan", {"plan": {**PLAN, "hypothesis": "h" * 301}})
        assert_refused(long, "hypothesis: text is too long (at most 300 characters)")
        typo = await client.call_tool(
            "propose_plan", {"plan": {"hypothesis": "h", "candidates": ["demo-tiny:draft-k5"]}}
        )
        view = assert_refused(typo, "demo-tiny:draft-k5: not a candidate of the registry")
        assert "(nearest: demo-tiny:draft-k" in text(typo)
        assert text(typo).count("not a candidate of the registry") == 1, "stated once"
        assert view["refused"][0]["id"] == "demo-tiny:draft-k5"
        # wrong arguments have the same shape as wrong plan content
        typed = await client.call_tool("propose_plan", {"plan": PLAN, "dry_run": "yes"})
        assert_refused(typed, "dry_run: must be true or false")
        extra = await client.call_tool("propose_plan", {"plan": PLAN, "force": 1})
        assert_refused(extra, "unknown argument(s): force; allowed: dry_run, follow_s, plan")
        not_json = await client.call_tool("propose_plan", {"plan": '{"hypothesis": '})
        assert_refused(not_json, "not valid JSON (line 1 column 16")
        dry = await client.call_tool(
            "propose_plan", {"plan": {**PLAN, "force": True}, "dry_run": True}
        )
        assert text(dry).startswith("DRY RUN — REFUSED") and dry.is_error
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert "isError: true" in (tools["propose_plan"].description or "")
        # other tools: one line, the limit, the nearest ids
        page = await client.call_tool("evidence", {"page": 0})
        assert page.is_error and "page: at least 1" in text(page)
        section = await client.call_tool("evidence", {"cycle_id": "latest", "section": "x"})
        assert section.is_error and "section: must be one of 'summary'" in text(section)
        unknown = await client.call_tool("registry", {"candidate_id": "demo-tiny:draft-k5"})
        assert unknown.is_error and "\n" not in text(unknown)
        assert "demo-tiny:draft-k5 is not a candidate of the registry (nearest: " in text(unknown)
    assert bare_home.queued() == [] and not list(bare_home.plans.glob("*.json"))
    refused = audit(bare_home)
    assert len(refused) == 9 and not any(r.accepted for r in refused), "every attempt audited"


async def test_latest_is_accepted_wherever_a_cycle_id_is(
    bare_home: Home, anyio_backend: str
) -> None:
    async with Client(build_server(bare_home, "read-only", start_supervisor=False)) as client:
        none_yet = await client.call_tool("evidence", {"cycle_id": "latest"})
        assert none_yet.is_error and "no sealed cycle yet" in text(none_yet)
        shutil.copytree(SHIPPED[0], bare_home.evidence / SHIPPED[0].name)
        latest = await client.call_tool("evidence", {"cycle_id": "latest", "section": "verdict"})
        assert not latest.is_error, text(latest)
        assert latest.structured_content["cycle_id"] == SHIPPED[0].name
        summary = await client.read_resource("mcp-infra://evidence/latest/summary")
        assert json.loads(summary.contents[0].text)["cycle_id"] == SHIPPED[0].name
        near = await client.call_tool("evidence", {"cycle_id": SHIPPED[0].name[:-1] + "x"})
        assert near.is_error and f"(nearest: {SHIPPED[0].name})" in text(near)


# ---------------------------------------------------------------------------------------------
# Hostile input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("era", ERAS)
async def test_deep_nesting_is_refused_before_parsing_and_audited(
    bare_home: Home, anyio_backend: str, era: str
) -> None:
    deep: Any = {}
    for _ in range(200):
        deep = {"a": deep}
    async with Client(build_server(bare_home, start_supervisor=False), mode=era) as client:
        brackets = await client.call_tool("propose_plan", {"plan": "[" * 8000})
        assert_refused(brackets, "nested too deeply (at most 8 levels")
        nested = await client.call_tool("propose_plan", {"plan": {**PLAN, "notes": deep}})
        assert_refused(nested, "nested too deeply")
        assert not (await client.call_tool("status", {})).is_error, "the session survives"
    records = audit(bare_home)
    assert [r.accepted for r in records] == [False, False]
    assert all("nested too deeply" in r.detail for r in records)


def test_nesting_is_counted_without_recursion() -> None:
    assert nesting_depth("[" * 100_000) == 9  # stops counting past the limit
    assert nesting_depth('{"a": "[[[[[[[[[[[[", "b": [1, {"c": 2}]}') == 3  # strings skipped
    assert nesting_depth(PLAN) == 2
    with pytest.raises(PlanRefused, match="nested too deeply"):
        parse_plan("[" * 8000)
    with pytest.raises(PlanRefused, match="larger than 16 KiB"):
        parse_plan(" " * 20_000)


HOSTILE = {
    "RLO U+202E": "\u202e",
    "CSI U+009B": "\u009b",
    "DEL": "\x7f",
    "ZWSP U+200B": "\u200b",
    "ZWJ U+200D": "\u200d",
    "BOM U+FEFF": "\ufeff",
    "word joiner U+2060": "\u2060",
    "TAG LATIN A U+E0041": "\U000e0041",
    "cancel tag U+E007F": "\U000e007f",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_characters_are_refused_in_every_text_field(name: str) -> None:
    char = HOSTILE[name]
    for plan in (
        {**PLAN, "hypothesis": f"fast{char}er"},
        {**PLAN, "notes": f"n{char}"},
        {**PLAN, "candidates": [f"demo-tiny:draft-k2{char}"]},
        {**PLAN, "candidates": ["demo-tiny:draft-k2", f"demo{char}-tiny:x"]},
    ):
        with pytest.raises(PlanRefused, match="must be plain text") as refused:
            parse_plan(plan)
        assert char not in str(refused.value)
    assert text_problem(f"a{char}b") is not None


async def test_hostile_ids_reach_no_file(bare_home: Home, anyio_backend: str) -> None:
    """Nothing with a control, bidi or invisible character is written: no plan, no queue entry,
    and the audit line holds our words only."""
    async with Client(build_server(bare_home, start_supervisor=False)) as client:
        for char in HOSTILE.values():
            plan = {"hypothesis": "h", "candidates": ["demo-tiny:draft-k2", f"x{char}:y"]}
            assert_refused(await client.call_tool("propose_plan", {"plan": plan}))
    assert not list(bare_home.plans.rglob("*.json"))
    raw = bare_home.audit_log.read_text(encoding="utf-8")
    assert not any(char in raw for char in HOSTILE.values())
    assert not any(json.dumps(char)[1:-1] in raw for char in HOSTILE.values())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_home_files_and_folders_are_private(tmp_path: Path) -> None:
    """Modes, not access: root reads anything, so the check is on the bits themselves."""
    home = Home(tmp_path / "home").ensure()
    for folder in (home.root, home.plans, home.queue, home.cycles, home.state, home.logs):
        assert _mode(folder) == 0o700, folder
    nested = tmp_path / "home" / "deep" / "er"
    write_model(
        nested / "x.json", Recipe(candidate_id="a:b", template="mlx_lm_server", model_path="/m")
    )
    assert _mode(nested) == 0o700 and _mode(nested.parent) == 0o700
    assert _mode(nested / "x.json") == 0o600
    home.append_event(Event(ts=utcnow(), cycle_id="c-1", state=CycleState.QUEUED, message="m"))
    home.append_audit(AuditRecord(ts=utcnow(), client="t", plan_hash="0" * 64, accepted=False))
    plan = FrozenPlan.model_validate_json((SHIPPED[0] / "plan.json").read_text())
    entry = home.enqueue(plan.model_copy(update={"created_at": datetime.now(UTC)}))
    for path in (home.journal("c-1"), home.audit_log, entry, home.plan_path(plan.plan_id)):
        assert _mode(path) == 0o600, path
    assert _mode(home.cycle_dir("c-1")) == 0o700
    loose = tmp_path / "made-by-hand"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert _mode(Home(loose).ensure().root) == 0o700, "an existing home is made private too"


@pytest.mark.parametrize("era", ERAS)
async def test_ids_complete(bare_home: Home, anyio_backend: str, era: str) -> None:
    """completion/complete offers candidate, manifest and cycle ids (with latest)."""
    from mcp_types import ResourceTemplateReference

    shutil.copytree(SHIPPED[0], bare_home.evidence / SHIPPED[0].name)
    async with Client(build_server(bare_home, start_supervisor=False), mode=era) as client:

        async def complete(uri: str, name: str, value: str) -> list[str]:
            ref = ResourceTemplateReference(uri=uri)
            result = await client.complete(ref, {"name": name, "value": value})
            return result.completion.values

        drafts = await complete("mcp-infra://candidates/{candidate_id}", "candidate_id", "demo-t")
        assert "demo-tiny:draft-k2" in drafts and all(d.startswith("demo-t") for d in drafts)
        cycles = await complete("mcp-infra://evidence/{cycle_id}/summary", "cycle_id", "")
        assert cycles == ["latest", SHIPPED[0].name]
        assert await complete("mcp-infra://manifests/{manifest_id}", "manifest_id", "qwen") == [
            "qwen38-dflash2-v1"
        ]
        one = await client.read_resource("mcp-infra://candidates/demo-tiny:draft-k2")
        assert json.loads(one.contents[0].text)["id"] == "demo-tiny:draft-k2"
        with pytest.raises(Exception, match="nearest: demo-tiny:draft-k"):
            await client.read_resource("mcp-infra://candidates/demo-tiny:draft-k5")


# ---------------------------------------------------------------------------------------------
# Who can fix it: the agent, or a person (and what the person runs)
# ---------------------------------------------------------------------------------------------


async def test_a_fresh_home_says_what_is_missing_and_who_provides_it(
    tmp_path: Path, anyio_backend: str
) -> None:
    """No config.yaml: the prompt says so (not a bare -32602), and a plan is refused as a
    person's to fix, with the command to run, and audited."""
    fresh = Home(tmp_path / "fresh")
    async with Client(build_server(fresh, start_supervisor=False)) as client:
        prompt = await client.get_prompt("propose_acceleration_plan", {})
        body = prompt.messages[0].content.text
        assert "no managed service is configured" in body and "mcp-infra prepare" in body
        assert "A person must configure one" in body
        refused = await client.call_tool("propose_plan", {"plan": PLAN})
        view = assert_refused(refused, "no managed service is configured")
        assert "A person must fix this: `mcp-infra prepare CANDIDATE --init-service`" in (
            text(refused)
        )
        assert "calling again will not help" in view["message"]
        assert "call propose_plan again" not in text(refused)
    assert [r.accepted for r in audit(fresh)] == [False]


async def test_nothing_runnable_here_is_a_persons_to_fix(
    bare_home: Home, anyio_backend: str
) -> None:
    """Every candidate fails preflight (no model built): a plan of valid ids is refused as a
    person's to fix; a mistake in the plan itself stays the caller's."""
    async with Client(build_server(bare_home, start_supervisor=False)) as client:
        refused = await client.call_tool("propose_plan", {"plan": PLAN})
        assert_refused(refused, "preflight failed")
        assert "A person must fix this: make a candidate runnable" in text(refused)
        typo = await client.call_tool("propose_plan", {"plan": {**PLAN, "force": 1}})
        assert "You can fix" not in text(typo) and "A person must" not in text(typo)
        assert "call propose_plan again" in text(typo)
        page = await client.call_tool("evidence", {"page": 0})
        assert "You can fix this: change the call" in text(page)


async def test_no_input_is_echoed_back(bare_home: Home, anyio_backend: str) -> None:
    """A megabyte in every place a caller can put text comes back as our words only."""
    big = "q" * 1_000_000
    async with Client(build_server(bare_home, start_supervisor=False)) as client:
        for plan in (
            {"hypothesis": big, "candidates": ["demo-tiny:draft-k2"]},
            json.dumps({"hypothesis": big, "candidates": ["demo-tiny:draft-k2"]}),
            {"hypothesis": "h", "candidates": ["demo-tiny:draft-k2"], "notes": big},
        ):
            refused = await client.call_tool("propose_plan", {"plan": plan})
            assert refused.is_error and "q" * 40 not in json.dumps(refused.structured_content)
            assert len(text(refused)) < 1000 and "q" * 40 not in text(refused)
        for name, args in (("registry", {"candidate_id": big}), ("evidence", {"cycle_id": big})):
            answer = await client.call_tool(name, args)
            assert answer.is_error and "q" * 40 not in text(answer)
    assert all("q" * 40 not in r.detail for r in audit(bare_home))
