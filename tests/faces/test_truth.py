"""One verified source of truth (issue 20 item 2): `status`, the cycle list and the summary
show figures only from bundles that verify, flag those that do not, name the `evidence verify`
command with the key's fingerprint, and every summary carries the held-out confirmation and
the online check. Over real MCP sessions (in-memory) and the CLI's own functions.

Fast: the demo models are built (no server starts) and the cycle is sealed synthetically by
the product's own sealing (tests/helpers/synthetic_bundle.py), so its bundle is signed by the
home's key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_infra.demo.homes import make_home
from mcp_infra.demo.models import build_demo_models
from mcp_infra.faces import cli
from mcp_infra.faces.mcp_server import build_server
from mcp_infra.state.signing import home_fingerprint
from mcp_infra.state.store import Home
from tests.helpers.paths import SHIPPED
from tests.helpers.synthetic_bundle import freeze, seal_one

pytestmark = pytest.mark.anyio


@pytest.fixture
def sealed(tmp_path: Path) -> tuple[Home, str]:
    home = make_home(tmp_path / "home", build_demo_models(tmp_path / "models"))
    return home, seal_one(home, freeze(home, ["demo-tiny:draft-k2"])).cycle_id


def forge(home: Home, cycle_id: str, *, rehash: bool) -> None:
    """Edit summary.json as a forger would: +150%, promoted; optionally re-hash the manifest."""
    bundle = home.evidence / cycle_id
    summary = json.loads((bundle / "summary.json").read_text())
    summary.update(outcome="promoted", selected="demo-tiny:draft-k2", speedup_pct=150.0)
    (bundle / "summary.json").write_text(json.dumps(summary, indent=2))
    if rehash:
        manifest = json.loads((bundle / "MANIFEST.json").read_text())
        digest = hashlib.sha256((bundle / "summary.json").read_bytes()).hexdigest()
        manifest["files"]["summary.json"] = digest
        (bundle / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))


def text(result: Any) -> str:
    return result.content[0].text


@pytest.mark.parametrize("rehash", [False, True], ids=["edited", "edited-and-rehashed"])
async def test_a_forged_summary_is_flagged_everywhere(
    sealed: tuple[Home, str], anyio_backend: str, rehash: bool
) -> None:
    home, cycle_id = sealed
    fingerprint = home_fingerprint(home)
    assert fingerprint
    async with Client(build_server(home, "read-only", start_supervisor=False)) as client:
        before = await client.call_tool("status", {})
        s = before.structured_content
        assert s["last_cycle_verified"] is True and s["last_cycle"]["outcome"] == "kept_baseline"
        assert f"evidence verify {cycle_id} (key fingerprint {fingerprint})" in text(before)
        forge(home, cycle_id, rehash=rehash)
        status = await client.call_tool("status", {})
        s = status.structured_content
        assert s["last_cycle_verified"] is False and s["last_cycle_problem"]
        assert s["last_cycle"]["speedup_pct"] is None and s["last_cycle"]["selected"] is None
        assert "DOES NOT VERIFY" in text(status) and "+150.0%" not in text(status)
        assert "promoted" not in text(status), "the forged outcome is not shown either"
        assert f"(key fingerprint {fingerprint})" in text(status)
        listing = await client.call_tool("evidence", {})
        flagged = listing.structured_content["not_verified"]
        assert list(flagged) == [cycle_id]
        assert listing.structured_content["cycles"][0]["speedup_pct"] is None
        assert "DOES NOT VERIFY" in text(listing) and "+150" not in text(listing)
        assert "promoted" not in text(listing)
        assert "0 of 1 verified" in text(listing)
        shown = await client.call_tool("evidence", {"cycle_id": "latest"})
        assert shown.structured_content["verified"] is False
        assert "DOES NOT VERIFY" in text(shown) and "+150" not in text(shown)
    # the CLI shows the same
    assert cli.main(["--home", str(home.root), "status"]) == 0


async def test_every_summary_has_the_confirmations_and_the_command(
    sealed: tuple[Home, str], anyio_backend: str
) -> None:
    home, cycle_id = sealed
    async with Client(build_server(home, "read-only", start_supervisor=False)) as client:
        shown = await client.call_tool("evidence", {"cycle_id": cycle_id})
        view = shown.structured_content
        assert view["verified"] is True, view["failed_checks"]
        assert view["heldout"].startswith("not run: no candidate was selected")
        assert view["online_check"] == "not run: nothing was promoted"
        body = text(shown)
        assert "Held-out confirmation: not run" in body
        assert "Online check before the switch: not run" in body
        assert f"evidence verify {cycle_id} (key fingerprint " in body
        # cached: a second read renders no report again
        again = await client.call_tool("evidence", {"cycle_id": cycle_id})
        assert again.structured_content["verified"] is True
        report = Path(again.structured_content["report_path"])
        made = report.stat().st_mtime_ns
        await client.call_tool("evidence", {"cycle_id": cycle_id})
        assert report.stat().st_mtime_ns == made, "the report is not rewritten"


def test_held_out_and_online_from_a_promoting_journal() -> None:
    """The shipped bundle promoted: both lines come from its journal as recorded."""
    from mcp_infra.flows.views import confirmations

    bundle = SHIPPED[0]
    heldout, online = confirmations(bundle)
    assert heldout.startswith("passed: held-out prompts: Qualified: speedup ")
    assert online == "passed: the winner reproduces the measured greedy outputs"


async def test_large_resources_come_in_pages(bare_home: Home, anyio_backend: str) -> None:
    """The summary resource is compact; the whole view and the HTML report come in pages
    whose concatenation is the whole document."""
    import shutil

    bundle = SHIPPED[0]
    from mcp_infra.contracts import ChainHead
    from mcp_infra.state import sealing, signing
    from mcp_infra.state.store import write_model

    # the shipped bundle adopted by this home: its key and chain head, so that it verifies
    shutil.copytree(bundle, bare_home.evidence / bundle.name)
    signing.keys_dir(bare_home).mkdir(parents=True, exist_ok=True)
    shutil.copy(f"{bundle}.pub", signing.public_key_path(bare_home))
    digest = sealing.bundle_digest(bundle)
    assert digest
    write_model(
        signing.keys_dir(bare_home) / "chain.json",
        ChainHead(cycle_id=bundle.name, digest=digest, count=1),
    )
    base = f"mcp-infra://evidence/{bundle.name}"
    async with Client(build_server(bare_home, "read-only", start_supervisor=False)) as client:

        async def read(uri: str) -> str:
            return (await client.read_resource(uri)).contents[0].text

        compact = json.loads(await read(f"{base}/summary"))
        assert compact["verified"] is True, compact.get("failed_checks")
        assert compact["cycle_id"] == bundle.name and compact["pages"] >= 2
        assert len(json.dumps(compact)) < 12_000 and compact["candidates"]
        assert {"heldout", "online_check", "verify_command"} <= set(compact)
        pages = [await read(f"{base}/summary/{n}") for n in range(1, compact["pages"] + 1)]
        assert all(len(p) <= 20_000 for p in pages)
        whole = json.loads("".join(pages))
        assert whole["cycle_id"] == bundle.name and whole["verdict"]["candidates"]
        with pytest.raises(Exception, match=f"pages are 1 to {compact['pages']}"):
            await read(f"{base}/summary/{compact['pages'] + 1}")
        report = await read(f"{base}/report")
        chunks = []
        for n in range(1, len(report) // 50_000 + 2):
            chunks.append(await read(f"{base}/report/{n}"))
        assert "".join(chunks) == report and all(len(c) <= 50_000 for c in chunks)
