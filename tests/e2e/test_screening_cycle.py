"""A plan of four candidates on real servers is screened: a drafter that loses clearly is
dropped after one short start without taking its gates, and the survivors are decided in full,
each taking its gates in an untimed start once its speed qualifies it; the drafter whose prompt
cache breaks losslessness is rejected there, its gate start ending at its first divergence. The
bundle verifies, screening recomputed from its samples."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from mcp_infra.contracts import BASELINE_ID, CandidateRun, Decision, JournalStep, Verdict
from mcp_infra.demo.homes import PROMOTE_ANY_GAIN, write_test_policy
from mcp_infra.flows import api as app
from mcp_infra.flows.supervisor import supervise
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state import evidence
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home, read_journal_file, read_model, write_model

pytestmark = pytest.mark.slow

CACHE = "demo-tiny:draft-k4-cache"
STARTS = 3  # timed starts per configuration (min = max)
CONTRARY = "demo-contrary:k16"


def contrary_drafter(draft: Path, to: Path) -> Path:
    """The demo drafter with its output head negated: it drafts its least likely token, so the
    target rejects every draft and each answered token costs 16 draft passes and a verification
    of 17 tokens (a clear loser, lossless all the same). A fixture: no product candidate."""
    import mlx.core as mx

    shutil.copytree(draft, to)
    weights = mx.load(str(to / "model.safetensors"))
    assert isinstance(weights, dict)
    weights["lm_head.weight"] = -weights["lm_head.weight"]
    mx.save_safetensors(str(to / "model.safetensors"), weights, metadata={"format": "mlx"})
    return to


def contrary_manifest(folder: Path) -> dict:
    return {
        "schema_version": 1,
        "id": "demo-contrary",
        "title": "The demo target drafted by a drafter that proposes its least likely token",
        "class": "acceleration_plugin",
        "semantics": "lossless",
        "license_reviewed": True,
        "runtime": {
            "template": "mlx_lm_server",
            "min_versions": {"mlx-lm": "0.32.2"},
            "platforms": ["linux-x86_64", "linux-aarch64", "darwin-arm64"],
        },
        "target": {"role": "target", "demo": "target"},
        "artifacts": [{"role": "draft", "path": str(folder)}],
        "resources": {"memory_gb": 1, "disk_gb": 0.1},
        "variants": [
            {
                "id": "k16",
                "title": "16 draft tokens, every one rejected, prompt cache off",
                "knobs": {"draft": True, "num_draft_tokens": 16, "prompt_cache_size": 0},
            }
        ],
    }


def test_a_plan_of_four_is_screened_then_decided(
    home: Home, demo_models: dict[str, Path], tmp_path: Path
) -> None:
    # The lean test protocol (24-token answers) with three starts and the promoting one's 60%
    # confidence (PROMOTE_ANY_GAIN): a drafter (1.2x-2x here) qualifies on speed and takes its
    # gates even where a loaded machine narrows its gain (two starts at 96% left every drafter
    # open in one full suite run). One server CPU, as the demo, so one start's speed is not the
    # 2-core machine's spells (docs/cycle.md). No start counts as busy and none waits: on a
    # shared CI machine every start ran with 70-85% of the CPUs taken, and screening would
    # hold every candidate for the full decision (as it should), while what this test asserts
    # is what screening does with what it measured.
    write_test_policy(home, PROMOTE_ANY_GAIN, heldout_repeats=1)
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    data["service"] = {**data.get("service", {}), "quiet_cpu_fraction": 1.0, "quiet_wait_s": 0}
    # Screen, then decide, on demo-speed's four short prompts: the rule drops a clear loser on
    # what one start measured, and the test homes' two prompts can leave it short of that.
    data["protocol"].update({"suite": "demo-speed", "min_starts": STARTS, "max_starts": STARTS})
    # Any gain qualifies (1.0x), not any speed above half the baseline's: the contrary drafter
    # serves 0.2x-0.5x, and once measured 0.47x in its screening start against the baseline's
    # slow first one, an interval that reached the 0.5x of PROMOTE_ANY_GAIN.
    data["thresholds"]["min_speedup_pct"]["default"] = 0.0
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    config = load_config(home)
    write_model(home.config, config.model_copy(update={"server_cpus": 1}))
    folder = contrary_drafter(demo_models["draft"], tmp_path / "contrary")
    home.user_registry.mkdir(parents=True, exist_ok=True)
    (home.user_registry / "demo-contrary.yaml").write_text(
        yaml.safe_dump(contrary_manifest(folder), sort_keys=False)
    )
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    plan = ["demo-tiny:draft-k4", "demo-tiny:draft-k2", CACHE, CONTRARY]
    view = app.propose(
        home,
        {"hypothesis": "screen four, decide the rest", "candidates": plan},
        start_supervisor=False,
    )
    assert view.accepted, view
    (summary,) = supervise(home)
    bundle = evidence.bundle_path(home, summary.cycle_id)
    result = evidence.verify(bundle)
    assert result.ok, result.problems
    checks = {c.name: c for c in result.checks}
    assert checks["screening_recomputed"].status == "ok", checks["screening_recomputed"].detail

    verdict = read_model(bundle / "verdict.json", Verdict)
    runs = {
        r.candidate: r
        for r in (read_model(p, CandidateRun) for p in (bundle / "runs").glob("*.json"))
        if r.purpose == "selection"
    }
    assert verdict.screening is not None and not verdict.screening.held
    dropped = verdict.screening.dropped
    assert dropped[CONTRARY].startswith("too slow"), dropped
    assert runs[CONTRARY].starts == 1 and not runs[CONTRARY].greedy  # no gate taken
    by = {v.candidate: v for v in verdict.candidates}
    assert by[CONTRARY].decision == Decision.REJECTED
    assert by[CONTRARY].reasons[0].startswith("Dropped by screening after one start")
    # A survivor whose speed qualified it took its gates in one more start that timed nothing;
    # one whose speed did not never took them, and its verdict says so.
    events, _ = read_journal_file(bundle / "journal.ndjson")
    due = {n for e in events if e.step == JournalStep.JUDGED for n in e.fields.get("gates_due", [])}
    survivors = [n for n in ("demo-tiny:draft-k4", "demo-tiny:draft-k2", CACHE) if n not in dropped]
    gated = [n for n in survivors if runs[n].greedy]
    assert gated and set(gated) == due, (gated, due, {n: by[n].reasons for n in survivors})
    for name in survivors:
        run = runs[name]
        if name in gated:
            [start] = {s.start for s in run.greedy}
            assert start == run.starts - 1 == STARTS
            assert not [s for s in run.samples if s.start == start], "a gate start timed"
        else:
            assert run.starts == STARTS and any(
                "gates were not taken" in r for r in by[name].reasons
            )
    if CACHE in gated:  # its gate start ended at its first diverging answer
        assert by[CACHE].decision == Decision.REJECTED
        assert by[CACHE].reasons[0].startswith("The lossless gate failed"), by[CACHE].reasons
    assert runs[BASELINE_ID].starts == STARTS  # a round of gate starts alone starts no baseline
    [line] = [e for e in events if e.step == JournalStep.SCREENED]
    assert line.fields["dropped"] == dropped
    assert line.fields["survivors"] == [n for n in plan if n not in dropped]
    assert f"screening dropped {len(dropped)} of 4 candidate(s)" in line.message
