"""Evidence that can be proven: forged bundles fail `evidence verify`, naming the failed check.

One real cycle (real mlx_lm servers on the demo models; promotion by policy: any measured gain
qualifies, so it does not depend on this machine's speed) is sealed once per module; each test
forges a copy of its bundle. A forger *without* the key can re-hash MANIFEST.json (and even
rewrite the signed Statement); a careless forger *with* the key re-signs too. Both are caught.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcp_infra.contracts import (
    CandidateRun,
    CycleSummary,
    DsseEnvelope,
    EvidenceManifest,
    FrozenPlan,
    InTotoStatement,
    Outcome,
    Verdict,
)
from mcp_infra.core.digest import sha256_bytes
from mcp_infra.core.sanitize import plan_content_hash
from mcp_infra.core.selector import DECISION_METHOD
from mcp_infra.demo.homes import PROMOTE_ANY_GAIN, make_home, stop_home
from mcp_infra.faces import cli
from mcp_infra.flows.supervisor import supervise
from mcp_infra.state import evidence, sealing, signing
from mcp_infra.state.store import Home, read_model, sha256_file, write_model
from tests.helpers import chromium
from tests.helpers.paths import REPO
from tests.helpers.synthetic_bundle import cheap_seal, freeze

# A drafter that wins and a lossy candidate beside it: two configurations besides the baseline
# (a second drafter added a third of the fixture's time and nothing these tests read).
CANDIDATES = ["demo-tiny:draft-k4", "demo-tiny:kv8"]


@pytest.fixture(scope="module")
def sealed_home(
    tmp_path_factory: pytest.TempPathFactory, demo_models: dict[str, Path]
) -> Iterator[tuple[Home, str]]:
    # A promotion by policy, not by this machine's speed: any measured gain qualifies
    # (demo.homes.PROMOTE_ANY_GAIN: an estimate above 1.000x, an interval above 0.5x, judged on
    # one start per side). A real bar with the drift check on makes a 2-core machine's speed
    # swings decide whether these tests get their bundle (docs/benchmarks.md). The drift check's
    # rule (its tolerance below the minimum speedup) cannot hold under a bar below zero: the
    # drift re-measure on real servers is tested by the A/A cycle in
    # tests/e2e/test_measure_cycle.py, the rule itself in tests/core/test_decisions.py.
    # The lossy candidate is judged by the agreement measure alone (no quality suite): the demo
    # models' gibberish passes no quality task, and the suite's 35 answers a side were two thirds
    # of this fixture's time. Sealed quality gates are recomputed on the synthetic bundles below
    # (`cheap_seal` of a kv8 plan, whose policy names the suite).
    home = make_home(
        tmp_path_factory.mktemp("proof") / "home",
        demo_models,
        thresholds=PROMOTE_ANY_GAIN,
        quality_suite=None,
    )
    try:
        # One more cycle if a try keeps the baseline all the same (the drafter's estimate at or
        # under 1.000x in a slow spell of this machine); a third refusal fails the fixture.
        for _ in range(3):
            home.enqueue(freeze(home, CANDIDATES))
            (summary,) = supervise(home, ignore_window=True)
            if summary.outcome == Outcome.PROMOTED:
                break
            print(f"sealed_home: try kept the baseline: {summary.reason}")  # shown if it fails
        yield home, summary.cycle_id
    finally:
        stop_home(home)


@pytest.fixture
def copy(sealed_home: tuple[Home, str], tmp_path: Path) -> tuple[Home, Path]:
    """A copy of the real bundle in a folder of its own (a lone copy: no previous bundle)."""
    home, cycle_id = sealed_home
    target = tmp_path / "elsewhere" / cycle_id
    shutil.copytree(home.evidence / cycle_id, target)
    return home, target


def rehash(bundle: Path) -> None:
    """What anyone who can edit the files can do: make MANIFEST.json consistent again."""
    manifest = read_model(bundle / "MANIFEST.json", EvidenceManifest)
    files = {
        str(p.relative_to(bundle)): sha256_file(p)
        for p in sorted(bundle.rglob("*"))
        if p.is_file() and p.name not in ("MANIFEST.json", evidence.SIGNATURE)
    }
    write_model(bundle / "MANIFEST.json", manifest.model_copy(update={"files": files}))


def resign(home: Home, bundle: Path) -> None:
    """A forger holding the home's private key signs the forged files again."""
    sealing.sign_bundle(home, bundle, bundle.name)


def failed(bundle: Path, key: Path) -> dict[str, str]:
    result = evidence.verify(bundle, key=key)
    return {c.name: c.detail for c in result.checks if c.status == "failed"}


def runs(bundle: Path) -> dict[str, tuple[Path, CandidateRun]]:
    return {
        run.candidate: (p, run)
        for p in sorted((bundle / "runs").glob("*.json"))
        if (run := read_model(p, CandidateRun))
    }


def edit_run(bundle: Path, candidate: str, change: Callable[[CandidateRun], CandidateRun]) -> None:
    path, run = runs(bundle)[candidate]
    write_model(path, change(run))


def regenerate_verdict(bundle: Path) -> None:
    again = evidence.recompute(bundle)
    assert again is not None
    write_model(bundle / "verdict.json", again)


# -- the forgeries of issue 12's table -------------------------------------------------------


def decode_one_percent(home: Home, bundle: Path) -> None:
    def change(run: CandidateRun) -> CandidateRun:
        samples = list(run.samples)
        i = next(i for i, s in enumerate(samples) if s.phase == "measure" and s.decode_tps)
        samples[i] = samples[i].model_copy(update={"decode_tps": samples[i].decode_tps * 1.01})
        return run.model_copy(update={"samples": samples})

    edit_run(bundle, "baseline", change)


def ttft_e2e_and_warmup(home: Home, bundle: Path) -> None:
    def change(run: CandidateRun) -> CandidateRun:
        samples = [
            s.model_copy(update={"ttft_s": (s.ttft_s or 0) * 10, "e2e_s": (s.e2e_s or 0) * 10})
            if s.phase == "measure"
            else s.model_copy(update={"decode_tps": (s.decode_tps or 1) * 3})
            if s.phase == "warmup"
            else s
            for s in run.samples
        ]
        return run.model_copy(update={"samples": samples})

    edit_run(bundle, "baseline", change)


def losing_run_deleted(home: Home, bundle: Path) -> None:
    verdict = read_model(bundle / "verdict.json", Verdict)
    loser = next(c for c in verdict.candidates if c.candidate != verdict.selected)
    runs(bundle)[loser.candidate][0].unlink()
    write_model(
        bundle / "verdict.json",
        verdict.model_copy(
            update={"candidates": [c for c in verdict.candidates if c.candidate != loser.candidate]}
        ),
    )


def verdict_deleted(home: Home, bundle: Path) -> None:
    (bundle / "verdict.json").unlink()


def another_winner(home: Home, bundle: Path) -> None:
    summary = read_model(bundle / "summary.json", CycleSummary)
    verdict = read_model(bundle / "verdict.json", Verdict)
    other = next(c.candidate for c in verdict.candidates if c.candidate != verdict.selected)
    write_model(
        bundle / "summary.json",
        summary.model_copy(
            update={"outcome": Outcome.PROMOTED, "selected": other, "speedup_pct": 150.0}
        ),
    )
    lines = (bundle / "journal.ndjson").read_text().splitlines()
    out = []
    for line in lines:
        row = json.loads(line)
        if row["state"] == "SEALED" and row["fields"].get("step") == "enter":
            row["fields"].update({"outcome": "promoted", "selected": other, "speedup_pct": 150.0})
        out.append(json.dumps(row))
    (bundle / "journal.ndjson").write_text("\n".join(out) + "\n")


def inflated_and_regenerated(home: Home, bundle: Path) -> None:
    verdict = read_model(bundle / "verdict.json", Verdict)
    target = next(c.candidate for c in verdict.candidates if c.candidate != verdict.selected)

    def change(run: CandidateRun) -> CandidateRun:
        return run.model_copy(
            update={
                "samples": [
                    s.model_copy(
                        update={
                            "decode_tps": s.decode_tps * 1.2 if s.decode_tps else None,
                            "decode_s": s.decode_s / 1.2 if s.decode_s else None,
                        }
                    )
                    for s in run.samples
                ]
            }
        )

    edit_run(bundle, target, change)
    regenerate_verdict(bundle)


def thresholds_loosened(home: Home, bundle: Path) -> None:
    plan = read_model(bundle / "plan.json", FrozenPlan)
    loose = plan.model_copy(
        update={
            "thresholds": plan.thresholds.model_copy(
                update={
                    "max_peak_memory_gb": 1000.0,
                    "worst_prompt_tolerance_pct": 100.0,
                    "max_error_rate": 0.5,
                }
            )
        }
    )
    write_model(
        bundle / "plan.json", loose.model_copy(update={"content_hash": plan_content_hash(loose)})
    )
    regenerate_verdict(bundle)


FORGERIES: list[tuple[Callable[[Home, Path], None], set[str]]] = [
    (decode_one_percent, {"samples_covered", "sample_arithmetic"}),
    (ttft_e2e_and_warmup, {"samples_covered", "sample_arithmetic"}),
    (losing_run_deleted, {"candidates_accounted", "samples_covered"}),
    (verdict_deleted, {"verdict_present"}),
    (another_winner, {"summary_agrees", "journal_agrees"}),
    (inflated_and_regenerated, {"samples_covered", "verdict_present"}),
    (thresholds_loosened, {"plan_hash", "plan_inputs", "verdict_present"}),
]


@pytest.mark.slow
def test_the_real_cycle_promoted_and_its_bundle_verifies(sealed_home: tuple[Home, str]) -> None:
    home, cycle_id = sealed_home
    bundle = home.evidence / cycle_id
    summary = read_model(bundle / "summary.json", CycleSummary)
    assert summary.outcome == Outcome.PROMOTED, summary.reason
    result = evidence.verify(bundle)  # the home's own key, found from the bundle's place
    assert result.ok, result.problems
    assert {c.name for c in result.checks if c.status == "ok"} >= {
        "signature",
        "statement_files",
        "chain",
        "chain_head",
        "plan_hash",
        "plan_inputs",
        "candidates_accounted",
        "verdict_present",
        "verdict_recomputed",
        "gates_recomputed",
        "summary_agrees",
        "journal_agrees",
        "samples_covered",
        "sample_arithmetic",
    }
    names = {str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file()}
    suite = read_model(bundle / "plan.json", FrozenPlan).protocol.suite
    assert {
        "inputs/policy.yaml",
        f"inputs/suites/{suite}.yaml",
        "online.json",
        "cost.json",
        "SIGNATURE.dsse.json",
    } <= names
    assert any(n.startswith("inputs/registry/") for n in names)
    # greedy (they warm a first start up), held-out and online samples are all sealed, and
    # covered by the signed digest
    counts = InTotoStatement.model_validate_json(
        signing.payload_of(read_model(bundle / evidence.SIGNATURE, DsseEnvelope))
    ).predicate.sample_counts
    assert counts.get("greedy") and counts.get("heldout") and counts.get("verify")
    # the key: private 0600, outside evidence/
    private = signing.private_key_path(home)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert home.evidence not in private.parents


@pytest.mark.slow
def test_a_copy_verifies_elsewhere_with_key(
    copy: tuple[Home, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    home, bundle = copy
    key = signing.public_key_path(home)
    assert (
        cli.main(
            [
                "--home",
                str(home.root),
                "evidence",
                "verify",
                str(bundle),
                "--key",
                str(key),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and not out["failed"]
    # the first bundle of its home names no previous one; a later one would be a lone copy here
    assert {c["name"]: c["status"] for c in out["checks"]}["chain"] in ("ok", "skipped")
    assert {c["name"]: c["status"] for c in out["checks"]}["chain_head"] == "skipped"
    # without a key, or with another key, the signature check fails by name
    other = Home(bundle.parent.parent / "other-home")
    signing.ensure_keypair(other)
    assert "signature" in failed(bundle, signing.public_key_path(other))
    assert "signature" in {c.name for c in evidence.verify(bundle).checks if c.status == "failed"}


@pytest.mark.slow
@pytest.mark.parametrize(("forge", "expected"), FORGERIES, ids=[f.__name__ for f, _ in FORGERIES])
def test_forger_without_the_key_is_caught(
    copy: tuple[Home, Path], forge: Callable, expected: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    home, bundle = copy
    forge(home, bundle)
    rehash(bundle)
    key = signing.public_key_path(home)
    names = failed(bundle, key)
    assert "file_hashes" not in names  # the manifest was made consistent again
    assert "statement_files" in names  # the signed Statement still lists the sealed files
    assert expected <= set(names), names
    assert cli.main(["evidence", "verify", str(bundle), "--key", str(key)]) == 1
    text = capsys.readouterr().out
    assert "FAILED:" in text and all(f"FAIL {n}" in text for n in expected)


@pytest.mark.slow
def test_forger_rewriting_the_statement_without_the_key(copy: tuple[Home, Path]) -> None:
    home, bundle = copy
    inflated_and_regenerated(home, bundle)
    rehash(bundle)
    envelope = read_model(bundle / evidence.SIGNATURE, DsseEnvelope)
    statement = InTotoStatement.model_validate_json(signing.payload_of(envelope))
    digest, counts = sealing.samples_digest(bundle)
    statement = statement.model_copy(
        update={
            "subject": sealing.subjects(bundle),
            "predicate": statement.predicate.model_copy(
                update={
                    "samples_sha256": digest,
                    "sample_counts": counts,
                    "manifest_sha256": sha256_file(bundle / "MANIFEST.json"),
                    "verdict_sha256": sha256_file(bundle / "verdict.json"),
                }
            ),
        }
    )
    import base64

    write_model(
        bundle / evidence.SIGNATURE,
        envelope.model_copy(
            update={"payload": base64.b64encode(signing.statement_bytes(statement)).decode()}
        ),
    )
    names = failed(bundle, signing.public_key_path(home))
    assert "signature" in names and "samples_covered" not in names, names


KEYED = [
    (decode_one_percent, "sample_arithmetic"),
    (ttft_e2e_and_warmup, "sample_arithmetic"),
    (losing_run_deleted, "candidates_accounted"),
    (verdict_deleted, "verdict_present"),
    (another_winner, "summary_agrees"),
    (thresholds_loosened, "plan_inputs"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("forge", "expected"), KEYED, ids=[f.__name__ for f, _ in KEYED])
def test_careless_forger_with_the_key_is_caught(
    copy: tuple[Home, Path], forge: Callable, expected: str
) -> None:
    """Even a forger who re-signs is caught where the bundle contradicts itself."""
    home, bundle = copy
    forge(home, bundle)
    rehash(bundle)
    resign(home, bundle)
    names = failed(bundle, signing.public_key_path(home))
    assert "signature" not in names and "statement_files" not in names
    assert expected in names, names


@pytest.mark.slow
def test_cost_section(sealed_home: tuple[Home, str], capsys: pytest.CaptureFixture[str]) -> None:
    home, cycle_id = sealed_home
    cost = json.loads((home.evidence / cycle_id / "cost.json").read_text())
    assert cost["wall_s"] > 0 and cost["phases_s"]["EXPERIMENT"] > 0
    assert cost["downtime_s"] is not None and cost["downtime_source"].startswith("journal")
    # every fresh start is a server of its own (the baseline recipe's starts too)
    candidates = [s for s in cost["servers"] if s["role"] == "candidate"]
    assert {s["label"] for s in candidates} >= set(CANDIDATES)
    assert all(s["cpu_s"] > 0 and s["peak_rss_gb"] for s in candidates)
    assert cost["supervisor_cpu_s"] > 0
    gain = cost["speedup_pct"]  # a promotion by policy: the speedup may be below zero here
    assert (cost["measurement_s_per_speedup_pct"] is not None) == (gain is not None and gain > 0)
    assert cost["energy_note"]
    assert cli.main(["--home", str(home.root), "evidence", "show", cycle_id]) == 0
    out = capsys.readouterr().out  # one downtime figure: what the front counted, when it did
    assert ("time the stable port did not serve" in out) != ("downtime of the stable port" in out)


@pytest.mark.slow
def test_report_renders_in_chromium_without_errors_or_fetches(
    sealed_home: tuple[Home, str], tmp_path: Path
) -> None:
    if chromium.chromium() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    home, cycle_id = sealed_home
    out = tmp_path / "report.html"
    assert cli.main(["--home", str(home.root), "evidence", "report", cycle_id, "-o", str(out)]) == 0
    page = out.read_text()
    assert "<script" not in page and "http://" not in page.replace(
        "http://www.w3.org/", ""
    ).replace("http://purl.org/dc/", "").replace("http://creativecommons.org/", "")
    seen = chromium.render(out)
    shot = tmp_path / "report.png"
    shot.write_bytes(seen.screenshot)
    print(f"report screenshot: {shot}")
    assert seen.requests == [out.resolve().as_uri()], seen.requests  # nothing else was fetched
    assert not seen.console_errors and not seen.exceptions and not seen.log_errors
    assert seen.title == f"mcp-infra cycle {cycle_id}"
    assert "Promoted" in seen.text and "Evidence verified" in seen.text
    assert seen.screenshot.startswith(b"\x89PNG") and len(seen.screenshot) > 20_000


@pytest.mark.slow
@pytest.mark.anyio
async def test_mcp_evidence_tool_names_checks_and_the_report(
    sealed_home: tuple[Home, str], anyio_backend: str
) -> None:
    from mcp import Client

    from mcp_infra.faces.mcp_server import build_server

    home, cycle_id = sealed_home
    async with Client(build_server(home, start_supervisor=False)) as client:
        ev = (await client.call_tool("evidence", {"cycle_id": cycle_id})).structured_content
        assert ev["verified"] is True and ev["failed_checks"] == []
        assert ev["report_uri"] == f"mcp-infra://evidence/{cycle_id}/report"
        assert Path(ev["report_path"]).is_file() and ev["cost"]["wall_s"] > 0
        page = (await client.read_resource(ev["report_uri"])).contents[0].text
        assert page.startswith("<!DOCTYPE html>") and cycle_id in page
        status = (await client.call_tool("status", {})).structured_content
        assert status["evidence_key"] == signing.home_fingerprint(home)


def test_the_committed_bundle_verifies_with_its_key() -> None:
    keys = sorted((REPO / "evidence").glob("c-*.pub"))
    assert keys, "evidence/ holds a bundle and the public key that verifies it"
    for key in keys:
        bundle = key.with_suffix("")
        result = evidence.verify(bundle, key=key)
        assert result.ok, result.problems
        assert {c.name for c in result.checks if c.status == "ok"} >= {
            "signature",
            "statement_files",
            "samples_covered",
        }
        # recomputed where this mcp-infra decides by the bundle's method, else skipped and said
        method = read_model(bundle / "verdict.json", Verdict).method
        recomputed = next(c for c in result.checks if c.name == "verdict_recomputed")
        if method == DECISION_METHOD:
            assert recomputed.status == "ok"
        else:
            assert recomputed.status == "skipped"
            assert f"decision method {method}" in recomputed.detail


def test_chain_shows_deleted_and_rewritten_history(home: Home) -> None:
    """Three cheap seals (fixed timings: `cheap_seal`, tests/helpers/synthetic_bundle.py): each
    names the one before."""
    plan = freeze(home, ["demo-tiny:kv8"])
    cycles = [cheap_seal(home, plan).cycle_id for _ in range(3)]
    for cycle_id in cycles:
        assert evidence.verify(home.evidence / cycle_id).ok
    second = home.evidence / cycles[1]
    previous = InTotoStatement.model_validate_json(
        signing.payload_of(read_model(second / evidence.SIGNATURE, DsseEnvelope))
    ).predicate.previous
    assert previous is not None and previous.cycle_id == cycles[0]
    assert previous.digest == sha256_bytes(
        signing.payload_of(read_model(home.evidence / cycles[0] / evidence.SIGNATURE, DsseEnvelope))
    )
    # rewriting the first bundle (even re-signed with the key) breaks the second's link
    resign(home, home.evidence / cycles[0])
    assert "chain" in {c.name for c in evidence.verify(second).checks if c.status == "failed"}
    # deleting a bundle in the middle shows
    shutil.rmtree(home.evidence / cycles[0])
    assert "chain" in {c.name for c in evidence.verify(second).checks if c.status == "failed"}
    # deleting the newest shows too, on the remaining bundles of the home
    shutil.rmtree(home.evidence / cycles[2])
    assert "chain_head" in {c.name for c in evidence.verify(second).checks if c.status == "failed"}
    assert os.stat(signing.private_key_path(home)).st_mode & 0o077 == 0


def test_a_verdict_of_another_decision_method_is_not_recomputed_and_says_so(home: Home) -> None:
    """A bundle sealed by an mcp-infra that decided by another method: its samples, hashes and
    signature still verify; the verdict is not recomputed (another method may reach another
    verdict on the same samples), and the check says which methods and where to read what
    changed. Changing
    the number is a change to a signed file like any other."""
    summary = cheap_seal(home, freeze(home, ["demo-tiny:kv8"]))
    bundle = home.evidence / summary.cycle_id
    verdict = read_model(bundle / "verdict.json", Verdict)
    assert verdict.method == DECISION_METHOD
    checks = {c.name: c for c in evidence.verify(bundle).checks}
    assert checks["verdict_recomputed"].status == "ok"

    write_model(bundle / "verdict.json", verdict.model_copy(update={"method": 1}))
    rehash(bundle)
    checks = {c.name: c for c in evidence.verify(bundle).checks}
    assert checks["statement_files"].status == "failed"  # not what was signed
    skipped = checks["verdict_recomputed"]
    assert skipped.status == "skipped"
    assert "decision method 1" in skipped.detail and f"method {DECISION_METHOD}" in skipped.detail
    assert "docs/statistics.md says what changed" in skipped.detail  # where to read it
    assert checks["gates_recomputed"].status == "ok" and checks["samples_covered"].status == "ok"


def test_the_next_cycle_takes_the_winners_answers_and_its_bundle_proves_them(
    sealed_home: tuple[Home, str], tmp_path: Path
) -> None:
    """A later cycle on the promoted configuration (``core.reference``), on real servers: its
    baseline asks no greedy pass, the winner's first pass from the sealed cycle stands in for
    it, candidates are gated against it as against fresh outputs, and verification checks the
    kept answers are that cycle's own. (This adds the home's second bundle: it runs last.)"""
    home, first = sealed_home
    home.enqueue(freeze(home, ["demo-tiny:draft-k2", "demo-tiny:draft-k4-cache"]))
    (second,) = supervise(home, ignore_window=True)
    bundle = home.evidence / second.cycle_id
    first_runs, second_runs = by_file(home.evidence / first), by_file(bundle)
    winner, baseline = first_runs["demo-tiny__draft-k4"], second_runs["baseline"]
    assert first_runs["baseline"].reference is None
    assert baseline.reference is not None and baseline.reference.cycles == [first]
    assert baseline.reference.greedy == len(baseline.greedy) > 0
    # No greedy pass in its first start: a warm-up request stands in for one.
    assert any(s.phase == "warmup" and s.start == 0 for s in baseline.samples)
    assert not any(s.phase == "warmup" and s.start == 0 for s in first_runs["baseline"].samples)
    first_pass = {s.prompt_id: s.token_ids for s in winner.greedy if s.repeat == 0}
    assert {s.prompt_id: s.token_ids for s in baseline.greedy} == first_pass
    # A lossless drafter gives the same tokens; the drafter whose prompt cache changes its
    # outputs is still caught.
    verdict = read_model(bundle / "verdict.json", Verdict)
    lossless = {
        v.candidate: next(g for g in v.gates if g.gate == "lossless") for v in verdict.candidates
    }
    assert lossless["demo-tiny:draft-k2"].passed, lossless["demo-tiny:draft-k2"].detail
    assert not lossless["demo-tiny:draft-k4-cache"].passed
    checked = {c.name: c for c in evidence.verify(bundle).checks}
    assert checked["references"].status == "ok", checked["references"].detail
    assert all(c.status != "failed" for c in checked.values())
    # Alone, a bundle cannot show its kept answers are another cycle's: skipped, saying why.
    pair = tmp_path / "pair"
    for cycle_id in (first, second.cycle_id):
        shutil.copytree(home.evidence / cycle_id, pair / cycle_id)
    alone = tmp_path / "alone" / second.cycle_id
    shutil.copytree(bundle, alone)
    check = {c.name: c for c in evidence.verify(alone).checks}["references"]
    assert check.status == "skipped" and first in check.detail
    # One prompt's answer changed everywhere in the first bundle (the winner's and the baseline's,
    # equal as a lossless winner's are): the kept copy is no answer of that cycle.
    changed = baseline.greedy[0].prompt_id
    for path in (pair / first / "runs").glob("*.json"):
        data = json.loads(path.read_text())
        for sample in data["greedy"]:
            if sample["prompt_id"] == changed:
                sample["token_ids"][0] += 1
        path.write_text(json.dumps(data))
    check = {c.name: c for c in evidence.verify(pair / second.cycle_id).checks}["references"]
    assert check.status == "failed" and f"is no answer of ['{first}']" in check.detail


def by_file(bundle: Path) -> dict[str, CandidateRun]:
    """A bundle's runs by file name (the baseline's selection, held-out and live runs apart)."""
    return {p.stem: read_model(p, CandidateRun) for p in (bundle / "runs").glob("*.json")}
