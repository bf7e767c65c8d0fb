"""`evidence verify` and `evidence show`: the shipped bundle(s) re-verified with the public key
shipped beside them (`evidence/<id>.pub`), and each kind of tampering caught and named (a changed
verdict whose hashes were made to match, a missing file, an extra file). The forgeries of issue 12's
table, signatures and chains are in test_evidence_proof.py.

Fast tier: the bundles are the real ones shipped in evidence/ (sealed by a real demo cycle), copied
to a temporary folder before any change; the CLI runs in-process (`cli.main`), with a home that
holds nothing, because `evidence verify PATH` must not need the home that sealed the bundle. The
same commands as real `mcp-infra` subprocesses are in test_cli_commands.py (slow tier).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mcp_infra.contracts import EvidenceManifest, Verdict
from mcp_infra.faces import cli
from mcp_infra.state import evidence
from mcp_infra.state.store import read_model, sha256_file, write_model

REPO_ROOT = Path(__file__).resolve().parent.parent

SHIPPED = sorted(p.parent for p in (REPO_ROOT / "evidence").glob("*/MANIFEST.json"))


def test_there_is_a_shipped_bundle() -> None:
    assert SHIPPED, "evidence/ holds at least one sealed bundle"


def key_of(bundle: Path) -> Path:
    """The public key shipped beside a bundle in evidence/."""
    return SHIPPED[0].parent / f"{bundle.name}.pub"


@pytest.mark.parametrize("bundle", SHIPPED, ids=[p.name for p in SHIPPED])
def test_the_shipped_bundle_verifies_without_its_home(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = evidence.verify(bundle, key=key_of(bundle))
    assert result.ok, result.problems
    assert result.hashes_ok and result.verdict_ok and result.problems == []
    empty_home = tmp_path / "no-home"
    key = ["--key", str(key_of(bundle))]
    assert cli.main(["--home", str(empty_home), "evidence", "verify", str(bundle), *key]) == 0
    out = capsys.readouterr().out
    assert f"{bundle}: VERIFIED" in out
    assert (
        cli.main(["--home", str(empty_home), "evidence", "verify", str(bundle), *key, "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["problems"] == []


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A copy of the first shipped bundle, to tamper with."""
    copy = tmp_path / SHIPPED[0].name
    shutil.copytree(SHIPPED[0], copy)
    return copy


def rehash(bundle: Path, *names: str) -> None:
    """What a careful forger does: make the manifest's hashes match the changed files."""
    manifest = read_model(bundle / "MANIFEST.json", EvidenceManifest)
    files = dict(manifest.files)
    for name in names:
        files[name] = sha256_file(bundle / name)
    write_model(bundle / "MANIFEST.json", manifest.model_copy(update={"files": files}))


def verify_cli(bundle: Path, home: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(
        ["--home", str(home), "evidence", "verify", str(bundle), "--key", str(key_of(bundle))]
    )
    return code, capsys.readouterr().out


def test_a_changed_verdict_with_matching_hashes_is_caught_by_recomputing_it(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verdict = read_model(bundle / "verdict.json", Verdict)
    first = verdict.candidates[0]
    forged_first = first.model_copy(update={"speedup_estimate": (first.speedup_estimate or 1) * 2})
    forged = verdict.model_copy(update={"candidates": [forged_first, *verdict.candidates[1:]]})
    write_model(bundle / "verdict.json", forged)
    rehash(bundle, "verdict.json")
    result = evidence.verify(bundle, key=key_of(bundle))
    assert "file_hashes" not in result.failed, "the forger fixed the hashes..."
    assert not result.ok and "verdict_recomputed" in result.failed, (
        "...but the verdict is recomputed from samples"
    )
    assert "statement_files" in result.failed, "...and the signed Statement names the old hashes"
    code, out = verify_cli(bundle, tmp_path / "no-home", capsys)
    assert code == 1 and "FAIL verdict_recomputed" in out


def test_a_changed_raw_sample_with_matching_hashes_changes_the_recomputed_verdict(
    bundle: Path,
) -> None:
    """The other direction: the samples are changed (and rehashed), the verdict is left alone."""
    path = bundle / "runs" / "baseline.json"
    data = json.loads(path.read_text())
    for sample in data["samples"]:
        if sample.get("decode_tps"):
            sample["decode_tps"] *= 10  # a baseline ten times faster than it was
            sample["decode_s"] = sample["decode_s"] / 10 if sample.get("decode_s") else None
    path.write_text(json.dumps(data))
    rehash(bundle, "runs/baseline.json")
    result = evidence.verify(bundle, key=key_of(bundle))
    assert "file_hashes" not in result.failed and not result.ok
    assert "verdict_recomputed" in result.failed


def test_a_missing_file_is_named(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = sorted((bundle / "runs").glob("demo-tiny*.json"))[0]
    run.unlink()
    name = f"runs/{run.name}"
    result = evidence.verify(bundle, key=key_of(bundle))
    assert not result.hashes_ok and any(f"{name}: missing" in p for p in result.problems)
    code, out = verify_cli(bundle, tmp_path / "no-home", capsys)
    assert code == 1 and "FAIL file_hashes" in out and f"{name}: missing" in out


def test_an_extra_file_is_named(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (bundle / "runs" / "extra.json").write_text("{}")
    (bundle / "notes.txt").write_text("added after sealing")
    result = evidence.verify(bundle, key=key_of(bundle))
    assert not result.hashes_ok
    hashes = next(p for p in result.problems if p.startswith("file_hashes:"))
    assert "notes.txt: not listed in the manifest" in hashes
    assert "runs/extra.json: not listed in the manifest" in hashes
    code, out = verify_cli(bundle, tmp_path / "no-home", capsys)
    assert code == 1 and "notes.txt: not listed in the manifest" in out


def test_an_unreadable_manifest_is_reported(bundle: Path) -> None:
    (bundle / "MANIFEST.json").write_text("{ not json")
    result = evidence.verify(bundle, key=key_of(bundle))
    assert not result.ok and "file_hashes" in result.failed
    assert "MANIFEST.json is not a valid EvidenceManifest" in result.problems[0]


def test_verify_and_show_of_something_that_is_not_a_bundle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(tmp_path / "no-home")
    assert cli.main(["--home", home, "evidence", "verify", str(tmp_path / "nothing")]) == 2
    assert "no evidence bundle at" in capsys.readouterr().err
    assert cli.main(["--home", home, "evidence", "verify", "c-20000101-000000-abcdef"]) == 2
    assert "no sealed evidence for cycle c-20000101-000000-abcdef" in capsys.readouterr().err
    assert cli.main(["--home", home, "evidence", "show", "c-20000101-000000-abcdef"]) == 2
    assert cli.main(["--home", home, "evidence", "verify"]) == 2
    assert "needs a cycle id (or latest) or a bundle path" in capsys.readouterr().err


@pytest.mark.parametrize("bundle_dir", SHIPPED, ids=[p.name for p in SHIPPED])
def test_show_prints_the_table_of_a_bundle(
    bundle_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = str(tmp_path / "no-home")
    summary = json.loads((bundle_dir / "summary.json").read_text())
    assert cli.main(["--home", home, "evidence", "show", str(bundle_dir)]) == 0
    out = capsys.readouterr().out
    assert summary["cycle_id"] in out and summary["outcome"] in out
    verdict = read_model(bundle_dir / "verdict.json", Verdict)
    for candidate in verdict.candidates:
        assert candidate.candidate in out and candidate.decision.value in out
    assert "per prompt (decode tok/s, baseline → candidate):" in out
    assert (
        cli.main(
            ["--home", home, "evidence", "show", str(bundle_dir), "--section", "journal", "--json"]
        )
        == 0
    )
    journal = json.loads(capsys.readouterr().out)
    states = [row["state"] for row in journal["journal"]]
    # a long journal (every start of every round) is paged: the last event is on the last page
    assert states[0] == "QUEUED"
    assert states[-1] == "SEALED" or journal["page"] < journal["pages"]


def test_gate_command_judges_a_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gate", "list", "--json"]) == 0
    tasks = {t["id"] for t in json.loads(capsys.readouterr().out)}
    assert {"arithmetic", "json_object", "one_word"} <= tasks
    assert cli.main(["gate", "check", "--task", "arithmetic", "--text", "391"]) == 0
    assert capsys.readouterr().out.startswith("arithmetic: PASS")
    assert cli.main(["gate", "check", "--task", "arithmetic", "--text", "392", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["passed"] is False
