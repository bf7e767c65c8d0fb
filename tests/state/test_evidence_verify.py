"""`evidence verify` and `evidence show`: the shipped bundle(s) re-verified with the public key
shipped beside them (`evidence/<id>.pub`), and each kind of tampering caught and named (a changed
verdict whose hashes were made to match, a missing file, an extra file). The forgeries of issue 12's
table, signatures and chains are in tests/state/test_evidence_proof.py.

Fast tier: the bundles are the real ones shipped in evidence/ (sealed by a real demo cycle), copied
to a temporary folder before any change; where a forgery is caught by recomputing the verdict, the
bundle is one this code sealed (`sealed_copy`: tests/helpers/synthetic_bundle.py, fixed timings),
since a verdict of another decision method is not recomputed; the CLI runs in-process (`cli.main`),
with a home that holds nothing, because `evidence verify PATH` must not need the home that sealed
the bundle. The same commands as real `mcp-infra` subprocesses are in
tests/faces/test_cli_commands.py (slow tier).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mcp_infra.contracts import EvidenceManifest, Verdict
from mcp_infra.faces import cli
from mcp_infra.state import evidence, signing
from mcp_infra.state.store import Home, read_model, sha256_file, write_model
from tests.helpers.paths import SHIPPED
from tests.helpers.synthetic_bundle import cheap_seal, freeze


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


@pytest.fixture
def sealed_copy(home: Home, tmp_path: Path) -> tuple[Path, Path]:
    """A bundle this code sealed (so its verdict is recomputed), copied out of its home, and its
    home's public key."""
    summary = cheap_seal(home, freeze(home, ["demo-tiny:kv8"]))
    copy = tmp_path / "copied" / summary.cycle_id
    shutil.copytree(home.evidence / summary.cycle_id, copy)
    return copy, signing.public_key_path(home)


def rehash(bundle: Path, *names: str) -> None:
    """What a careful forger does: make the manifest's hashes match the changed files."""
    manifest = read_model(bundle / "MANIFEST.json", EvidenceManifest)
    files = dict(manifest.files)
    for name in names:
        files[name] = sha256_file(bundle / name)
    write_model(bundle / "MANIFEST.json", manifest.model_copy(update={"files": files}))


def verify_cli(
    bundle: Path, home: Path, capsys: pytest.CaptureFixture[str], key: Path | None = None
) -> tuple[int, str]:
    key = key or key_of(bundle)
    code = cli.main(["--home", str(home), "evidence", "verify", str(bundle), "--key", str(key)])
    return code, capsys.readouterr().out


def test_a_changed_verdict_with_matching_hashes_is_caught_by_recomputing_it(
    sealed_copy: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle, key = sealed_copy
    assert evidence.verify(bundle, key=key).ok, "the untouched copy verifies"
    verdict = read_model(bundle / "verdict.json", Verdict)
    first = verdict.candidates[0]
    forged_first = first.model_copy(update={"speedup_estimate": (first.speedup_estimate or 1) * 2})
    forged = verdict.model_copy(update={"candidates": [forged_first, *verdict.candidates[1:]]})
    write_model(bundle / "verdict.json", forged)
    rehash(bundle, "verdict.json")
    result = evidence.verify(bundle, key=key)
    assert "file_hashes" not in result.failed, "the forger fixed the hashes..."
    assert not result.ok and "verdict_recomputed" in result.failed, (
        "...but the verdict is recomputed from samples"
    )
    assert "statement_files" in result.failed, "...and the signed Statement names the old hashes"
    code, out = verify_cli(bundle, tmp_path / "no-home", capsys, key)
    assert code == 1 and "FAIL verdict_recomputed" in out


def test_a_changed_raw_sample_with_matching_hashes_changes_the_recomputed_verdict(
    sealed_copy: tuple[Path, Path],
) -> None:
    """The other direction: the samples are changed (and rehashed), the verdict is left alone."""
    bundle, key = sealed_copy
    path = bundle / "runs" / "baseline.json"
    data = json.loads(path.read_text())
    for sample in data["samples"]:
        if sample.get("decode_tps"):
            sample["decode_tps"] *= 10  # a baseline ten times faster than it was
            sample["decode_s"] = sample["decode_s"] / 10 if sample.get("decode_s") else None
    path.write_text(json.dumps(data))
    rehash(bundle, "runs/baseline.json")
    result = evidence.verify(bundle, key=key)
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


# -- trust you can anchor: which key verified, and is it the one you meant -------------------


def fingerprint_of(key: Path) -> str:
    from mcp_infra.state import signing

    return signing.fingerprint(signing.load_public(key))


def forge_and_resign(bundle: Path, tmp_path: Path) -> Path:
    """The forgery of issue 21: environment and summary edited, re-hashed, re-signed with a new
    key, and the public key beside the copy replaced by the forger's. Internally consistent."""
    from mcp_infra.state import sealing, signing
    from mcp_infra.state.store import Home

    for name, change in (
        ("environment.json", lambda d: d | {"cpu": "Apple M4 Max (forged)"}),
        ("summary.json", lambda d: d | {"reason": d["reason"] + " (and it is wonderful)"}),
    ):
        path = bundle / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
    rehash(bundle, "environment.json", "summary.json")
    forger = Home(tmp_path / "forger")
    sealing.sign_bundle(forger, bundle, bundle.name)
    beside = bundle.parent / f"{bundle.name}.pub"
    shutil.copy2(signing.public_key_path(forger), beside)
    return beside


def test_a_bundle_resigned_with_another_key_fails_the_pinned_fingerprint(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = fingerprint_of(key_of(SHIPPED[0]))
    forged_key = forge_and_resign(bundle, tmp_path)
    home = ["--home", str(tmp_path / "no-home")]
    verify = [*home, "evidence", "verify", str(bundle)]
    # with the forger's key beside it, the copy verifies, and the output says whose key it is not
    assert cli.main([*verify, "--key", str(forged_key)]) == 0
    out = capsys.readouterr().out
    assert "VERIFIED" in out and "NOT this home's key and NOT pinned" in out
    assert fingerprint_of(forged_key) in out
    assert cli.main([*verify, "--key", str(forged_key), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["key_trust"] == "unpinned" and data["key_fingerprint"] == fingerprint_of(forged_key)
    # pinned to the real fingerprint: refused, by name, with the key given or the one beside it
    for extra in (["--key", str(forged_key)], []):
        assert cli.main([*verify, *extra, "--fingerprint", real]) == 1
        out = capsys.readouterr().out
        assert "FAIL signature" in out and f"not the pinned {real}" in out, out
        assert f"is NOT the pinned key {real}" in out
    # the real key does not verify the forger's signature either
    assert cli.main([*verify, "--key", str(key_of(SHIPPED[0]))]) == 1
    assert "no signature by key" in capsys.readouterr().out


@pytest.mark.parametrize("bundle_dir", SHIPPED, ids=[p.name for p in SHIPPED])
def test_the_shipped_bundle_verifies_pinned_to_its_fingerprint(
    bundle_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`mcp-infra evidence verify evidence/<id> --fingerprint HEX`: the key beside the bundle is
    used because it has the pinned fingerprint (never without a pin)."""
    real = fingerprint_of(key_of(bundle_dir))
    home = ["--home", str(tmp_path / "no-home")]
    pasted = "SHA256:" + ":".join(real[i : i + 4] for i in range(0, 64, 4)).upper()
    assert cli.main([*home, "evidence", "verify", str(bundle_dir), "--fingerprint", pasted]) == 0
    out = capsys.readouterr().out
    assert f"{bundle_dir}: VERIFIED" in out and "the pinned fingerprint" in out
    assert cli.main([*home, "evidence", "verify", str(bundle_dir)]) == 1  # no key, no pin
    assert "no public key to check with" in capsys.readouterr().out
    assert cli.main([*home, "evidence", "verify", str(bundle_dir), "--fingerprint", "3a47"]) == 2
    assert "all 64 hex digits" in capsys.readouterr().err


def test_a_bundle_of_the_home_is_verified_with_its_own_key_and_exported_with_its_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle in a home's evidence folder, signed by that home (the shipped bundle's files,
    re-signed: a fast stand-in for a sealed cycle, whose signing is `sealing.sign_bundle` too)."""
    from mcp_infra.state import sealing, signing
    from mcp_infra.state.store import Home

    home = Home(tmp_path / "home")
    bundle = home.evidence / SHIPPED[0].name
    shutil.copytree(SHIPPED[0], bundle)
    sealing.advance_chain(home, bundle.name, sealing.sign_bundle(home, bundle, bundle.name))
    own = signing.home_fingerprint(home)
    assert own is not None
    args = ["--home", str(home.root), "evidence"]
    assert cli.main([*args, "verify", bundle.name]) == 0
    out = capsys.readouterr().out
    assert "VERIFIED" in out and f"checked with key {own}" in out and "this home's own key" in out
    assert cli.main([*args, "verify", bundle.name, "--fingerprint", own]) == 0
    assert "the pinned fingerprint" in capsys.readouterr().out
    # export: the fingerprint, shortened and in full, and the command that pins it
    assert cli.main([*args, "export", bundle.name, str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert signing.short_fingerprint(own) in out and own in out
    copy, key = tmp_path / "out" / bundle.name, tmp_path / "out" / f"{bundle.name}.pub"
    assert signing.verify_command(str(copy), own, key) in out
    assert cli.main([*args, "export", bundle.name, str(tmp_path / "out"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fingerprint"] == own and data["ok"] is True
    assert cli.main(signing.verify_command(str(copy), own, key).split()[1:]) == 0
    assert "the pinned fingerprint" in capsys.readouterr().out


# -- the key pair: created once, whole, and consistent after a crash at any step -------------


def test_the_key_pair_is_created_once_with_private_modes(tmp_path: Path) -> None:
    import stat

    from mcp_infra.state import signing
    from mcp_infra.state.store import Home

    home = Home(tmp_path / "home")
    created = signing.create_key_if_missing(home)
    assert created is not None and created == signing.home_fingerprint(home)
    assert signing.create_key_if_missing(home) is None  # the second seal creates nothing
    assert stat.S_IMODE(signing.private_key_path(home).stat().st_mode) == 0o600
    assert stat.S_IMODE(signing.keys_dir(home).stat().st_mode) == 0o700
    key = signing.ensure_keypair(home)
    assert signing.public_key_path(home).read_bytes() == signing.public_pem(key.public_key())
    assert sorted(p.name for p in signing.keys_dir(home).iterdir()) == [
        signing.PRIVATE_NAME,
        signing.PUBLIC_NAME,
    ]  # no temporary file left


def test_a_crash_between_the_two_key_files_leaves_one_consistent_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash is an exception raised where the process would die (killing a real process
    between two writes a few microseconds apart cannot be timed); the files checked afterwards
    are the ones a dead process leaves in place (a killed one may also leave its 0600
    temporary file, which nothing reads)."""
    from mcp_infra.state import signing
    from mcp_infra.state.store import Home

    home = Home(tmp_path / "home")

    class Died(BaseException):
        """Not an Exception: nothing on the way up may handle it, as nothing runs after a kill."""

    def crash(*_: object, **__: object) -> None:
        raise Died("the process died here")

    # died after the private key was linked into place, before the public key was written
    monkeypatch.setattr(signing, "write_bytes_atomic", crash)
    with pytest.raises(Died, match="died here"):
        signing.ensure_keypair(home)
    monkeypatch.undo()
    assert signing.private_key_path(home).is_file()
    assert not signing.public_key_path(home).exists()
    private = signing.load_private(signing.private_key_path(home))
    expected = signing.fingerprint(private.public_key())
    assert signing.home_fingerprint(home) == expected  # status can still tell the fingerprint
    assert signing.create_key_if_missing(home) is None  # the same key, not a new one
    assert signing.fingerprint(signing.load_public(signing.public_key_path(home))) == expected
    # a public key that is not the private key's (an older crash, or an edit) is replaced
    signing.public_key_path(home).write_bytes(
        signing.public_pem(signing.Ed25519PrivateKey.generate().public_key())
    )
    signing.ensure_keypair(home)
    assert signing.home_fingerprint(home) == expected

    # died while writing the private key: nothing in place, and the next seal starts afresh
    other = Home(tmp_path / "other")
    monkeypatch.setattr(signing.os, "link", crash)
    with pytest.raises(Died, match="died here"):
        signing.ensure_keypair(other)
    monkeypatch.undo()
    assert not signing.private_key_path(other).exists()  # never a half-written key in place
    assert not signing.public_key_path(other).exists()
    assert signing.create_key_if_missing(other) is not None


def test_first_seals_at_once_end_with_one_key(tmp_path: Path) -> None:
    import threading

    from mcp_infra.state import signing
    from mcp_infra.state.store import Home

    home = Home(tmp_path / "home")
    start = threading.Barrier(6)
    created: list[str | None] = []
    keys: list[str] = []

    def first_seal() -> None:
        start.wait()
        created.append(signing.create_key_if_missing(home))
        keys.append(signing.fingerprint(signing.ensure_keypair(home).public_key()))

    threads = [threading.Thread(target=first_seal) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([c for c in created if c is not None]) == 1
    assert set(keys) == {signing.home_fingerprint(home)}


def test_a_plan_with_its_homes_learned_spread_follows_from_its_policy(tmp_path: Path) -> None:
    """Found running the demo twice in one home: a plan frozen with the spread the home learned
    from its earlier cycles (the policy's ``learn_spread``) failed `plan_inputs` ("the plan's
    protocol is not the policy's"), so every later bundle of such a home did not verify."""
    from mcp_infra.state.bundle import Bundle, Failed
    from mcp_infra.state.recomputed import check_plan_inputs

    copy = tmp_path / SHIPPED[0].name
    shutil.copytree(SHIPPED[0], copy)
    plan = json.loads((copy / "plan.json").read_text())
    assert plan["protocol"]["learn_spread"] is True and plan["protocol"]["learned_spread"] is None
    plan["protocol"]["learned_spread"] = {
        "sd": 0.1344,
        "df": 6,
        "source": "quiet baseline starts of 2 sealed cycle(s): c-1, c-2",
    }
    (copy / "plan.json").write_text(json.dumps(plan))
    assert "re-derived from the bundled texts" in check_plan_inputs(Bundle(copy))
    # A spread its policy does not ask to learn is not the policy's; nor is another protocol.
    policy = copy / "inputs" / "policy.yaml"
    policy.write_text(policy.read_text().replace("learn_spread: true", "learn_spread: false"))
    with pytest.raises(Failed, match="a learned spread its policy does not ask for"):
        check_plan_inputs(Bundle(copy))
    plan["protocol"]["repeats"] += 1
    (copy / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(Failed, match="the plan's protocol is not the policy's"):
        check_plan_inputs(Bundle(copy))
