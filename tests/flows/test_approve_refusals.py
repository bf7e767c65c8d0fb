"""Every refusal of `mcp-infra approve`, each before the service is touched.

The cycles approved here are SYNTHETIC bundles (tests/helpers/synthetic_bundle.py: invented timings
and token ids, so that a candidate qualifies or not by construction); everything approve checks
(the bundle's hashes and recomputed verdict, the live recipe, the registry, preflight, recipe
memory, the policy) is real. No server runs: a refusal must come before anything is started, and
each test asserts that no process record was written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import CandidateRun, CycleSummary, EvidenceManifest
from mcp_infra.faces import cli
from mcp_infra.flows.approve import ApprovalRefused, approve
from mcp_infra.state.context import load_config, mark_needs_operator
from mcp_infra.state.store import Home, read_model, sha256_file, write_model
from tests.helpers.synthetic_bundle import (
    baseline_run,
    freeze,
    greedy_ids,
    prompts,
    seal,
    timing,
    write_manifest,
)

KV8, MY_KV8, DRAFT = "demo-tiny:kv8", "mytiny:kv8", "demo-tiny:draft-k2"


def synthetic_cycle(home: Home, rates: dict[str, float]) -> CycleSummary:
    """A sealed cycle: each candidate at its SYNTHETIC decode rate (baseline: 10 tok/s), every
    greedy output identical to the baseline's."""
    plan = freeze(home, list(rates))
    ids = {pid: list(range(1, 17)) for pid in prompts(plan)}
    runs = [
        CandidateRun(
            candidate=c,
            samples=timing(c, plan, tps),
            greedy=greedy_ids(c, plan, ids),
            peak_memory_gb=0.2,
        )
        for c, tps in rates.items()
    ]
    return seal(home, plan, baseline_run(plan, greedy_ids("baseline", plan, ids)), runs)


@pytest.fixture
def awaiting(home: Home) -> CycleSummary:
    """kv8 qualified, awaiting approval (its class may not auto-promote); draft-k2 rejected."""
    summary = synthetic_cycle(home, {KV8: 13.0, DRAFT: 8.0})
    assert "qualified, awaiting approval: demo-tiny:kv8" in summary.reason
    return summary


def refused(home: Home, cycle_id: str, candidate: str | None, match: str) -> None:
    with pytest.raises(ApprovalRefused, match=match):
        approve(home, cycle_id, candidate)
    untouched(home)


def untouched(home: Home) -> None:
    assert not (home.state / "service.json").exists(), "no server was started"
    assert not list((home.state / "candidates").glob("*.json"))
    assert not (home.state / "active.json").exists(), "the live recipe is unchanged"


def test_no_sealed_evidence(home: Home) -> None:
    refused(home, "c-20000101-000000-000000", None, "no sealed evidence for cycle")


def test_needs_an_operator_first(home: Home, awaiting: CycleSummary) -> None:
    mark_needs_operator(home, "c-earlier", "the live recipe could not be restored")
    refused(home, awaiting.cycle_id, None, r"needs an operator first: run `mcp-infra recover`")


def test_evidence_that_does_not_verify(home: Home, awaiting: CycleSummary) -> None:
    bundle = home.evidence / awaiting.cycle_id
    run = bundle / "runs" / "demo-tiny__kv8.json"
    data = json.loads(run.read_text())
    data["samples"][0]["decode_tps"] *= 2  # one measured figure changed after sealing
    run.write_text(json.dumps(data))
    refused(home, awaiting.cycle_id, None, f"the evidence of {awaiting.cycle_id} does not verify")


def test_an_incomplete_bundle(home: Home, awaiting: CycleSummary) -> None:
    """summary.json corrupted, with its hash in MANIFEST.json made to match: complete
    verification (the signed Statement, the summary against the verdict) refuses it before the
    bundle is even read."""
    bundle = home.evidence / awaiting.cycle_id
    (bundle / "summary.json").write_text("{ not json")
    manifest = read_model(bundle / "MANIFEST.json", EvidenceManifest)
    files = {**manifest.files, "summary.json": sha256_file(bundle / "summary.json")}
    write_model(bundle / "MANIFEST.json", manifest.model_copy(update={"files": files}))
    refused(
        home,
        awaiting.cycle_id,
        None,
        f"the evidence of {awaiting.cycle_id} does not verify: statement_files: .*summary_agrees",
    )


def test_no_candidate_awaiting(home: Home) -> None:
    summary = synthetic_cycle(home, {DRAFT: 8.0})
    refused(home, summary.cycle_id, None, "has no candidate awaiting approval")


def test_several_awaiting_and_none_named(home: Home) -> None:
    write_manifest(home)
    summary = synthetic_cycle(home, {KV8: 13.0, MY_KV8: 13.0})
    refused(
        home,
        summary.cycle_id,
        None,
        r"several candidates awaiting approval \(demo-tiny:kv8, mytiny:kv8\): name one",
    )


def test_a_candidate_not_measured(home: Home, awaiting: CycleSummary) -> None:
    refused(home, awaiting.cycle_id, "demo-tiny:draft-k6", "was not measured in cycle")


def test_a_candidate_that_did_not_qualify(home: Home, awaiting: CycleSummary) -> None:
    refused(home, awaiting.cycle_id, DRAFT, "is not awaiting approval .*: it did not qualify")


def test_the_live_recipe_changed(home: Home, awaiting: CycleSummary) -> None:
    other = read_model(home.config, type(load_config(home))).baseline.model_copy(
        update={"candidate_id": "demo-tiny:draft-k4"}
    )
    write_model(home.state / "active.json", other)
    with pytest.raises(
        ApprovalRefused, match="the live recipe is demo-tiny:draft-k4, not demo-tiny:target"
    ):
        approve(home, awaiting.cycle_id)
    assert not (home.state / "service.json").exists()


def test_no_longer_in_the_registry(home: Home) -> None:
    write_manifest(home)
    summary = synthetic_cycle(home, {MY_KV8: 13.0})
    (home.user_registry / "mytiny.yaml").unlink()
    refused(home, summary.cycle_id, None, "mytiny:kv8 is no longer in the registry")


def test_the_manifest_changed(home: Home) -> None:
    write_manifest(home)
    summary = synthetic_cycle(home, {MY_KV8: 13.0})
    write_manifest(home, description="the same candidates, described anew")
    refused(home, summary.cycle_id, None, "the manifest of mytiny:kv8 changed since cycle")


def test_fails_preflight_now(home: Home, awaiting: CycleSummary) -> None:
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    data["allowed_classes"] = [c for c in data["allowed_classes"] if c != "kv_cache"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    refused(home, awaiting.cycle_id, None, "demo-tiny:kv8 fails preflight now: .*kv_cache")


def test_the_policy_changed(home: Home, awaiting: CycleSummary) -> None:
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    data["thresholds"]["max_error_rate"] = 0.01  # any change to the policy's content
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    refused(home, awaiting.cycle_id, None, "the policy changed since cycle")


def test_the_model_files_changed(home: Home, demo_models: dict[str, Path]) -> None:
    """A real change on disk: the target's weights in this home are not the measured ones."""
    home.models.unlink()
    home.models.mkdir()
    shutil.copytree(demo_models["target"], home.models / "target")
    shutil.copytree(demo_models["draft"], home.models / "draft")
    summary = synthetic_cycle(home, {KV8: 13.0})
    weights = home.models / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of one weight
    weights.write_bytes(bytes(data))
    refused(
        home,
        summary.cycle_id,
        None,
        r"(the environment \(runtime packages, model files or machine\) changed|now "
        "resolves to another recipe)",
    )


def test_the_cli_prints_the_refusal_and_exits_2(
    home: Home, awaiting: CycleSummary, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--home", str(home.root), "approve", awaiting.cycle_id, DRAFT])
    assert code == 2
    err = capsys.readouterr().err
    assert "is not awaiting approval" in err and "it did not qualify" in err
    untouched(home)
    journal = [
        json.loads(line)["state"]
        for line in (home.evidence / awaiting.cycle_id / "journal.ndjson").open()
    ]
    assert journal[-1] == "SEALED", "the approved cycle's evidence is left as it was"
