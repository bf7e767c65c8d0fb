"""A real short cycle beside a co-tenant that takes one core: every server start records the rest
of the machine's load, and a policy that waits for a quiet machine waits (bounded), journals it
for ``status``, and measures anyway when the machine stays busy.

The co-tenant is a real CPU-bound child of this test process, which is also the supervisor here
(``supervise`` runs the cycle in-process): a child not yet reaped counts as other load, as any
other program would. The candidate is the baseline recipe under another id (an A/A cycle), so
no held-out check or promotion runs: the test stays short.
"""

from __future__ import annotations

import sys

import psutil
import yaml

from mcp_infra.contracts import CandidateRun, CycleState, JournalStep, ProcessUsage
from mcp_infra.core.machine import load_sentence
from mcp_infra.flows import api as app
from mcp_infra.flows.supervisor import supervise
from mcp_infra.procs.service import ensure_serving
from mcp_infra.state import evidence
from mcp_infra.state.context import load_config
from mcp_infra.state.store import Home, read_model
from tests.helpers.paths import DATA
from tests.helpers.run import Spawn

AA_MANIFEST = (DATA / "demo-aa.yaml").read_text()
WAIT_S = 3.0
SPIN = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end:\n    pass\n"


def test_each_start_records_the_machine_and_a_busy_machine_is_waited_for(
    home: Home, spawn: Spawn
) -> None:
    path = home.user_policy / "test.yaml"
    data = yaml.safe_load(path.read_text())
    data["protocol"].update(
        {"repeats": 1, "warmup": 0, "max_tokens": 8, "min_starts": 1, "max_starts": 1}
    )
    data.setdefault("service", {}).update({"quiet_cpu_fraction": 0.2, "quiet_wait_s": WAIT_S})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    home.user_registry.mkdir(parents=True, exist_ok=True)
    (home.user_registry / "demo-aa.yaml").write_text(AA_MANIFEST)
    config = load_config(home)
    ensure_serving(home, config.baseline, config)
    cotenant = spawn.popen([sys.executable, "-c", SPIN])  # one core, until the test ends
    view = app.propose(
        home,
        {"hypothesis": "A/A beside a co-tenant", "candidates": ["demo-aa:same"]},
        start_supervisor=False,
    )
    assert view.accepted, view
    (summary,) = supervise(home)
    assert cotenant.poll() is None, "the co-tenant ran through the whole cycle"
    bundle = evidence.bundle_path(home, summary.cycle_id)
    assert evidence.verify(bundle).ok, evidence.verify(bundle).problems
    runs = [read_model(p, CandidateRun) for p in sorted((bundle / "runs").glob("*.json"))]
    rounds = [r for run in runs if run.purpose == "selection" for r in run.rounds]
    assert len(rounds) == 2  # one start each of the baseline and the candidate
    for record in rounds:
        load = record.machine
        assert load is not None, record
        assert load.cpus == psutil.cpu_count() and load.window_s > 0
        assert 0.0 <= load.other_cpu_fraction <= 1.0
        assert load.load_avg_1m is not None and load.available_memory_fraction is not None
        # a spinning co-tenant never leaves the machine below 20% busy: each start waited its
        # bound (three looks of the machine) and was measured anyway
        assert load.quiet is False, record
        assert load.waited_s is not None and WAIT_S <= load.waited_s <= WAIT_S + 1.5
    # the measured server is left out of "other": stopped and reaped, its CPU time is the
    # supervisor's own (its usage file holds its CPU seconds read just before it was stopped)
    servers = [
        read_model(p, ProcessUsage)
        for p in (home.cycle_dir(summary.cycle_id) / "usage").glob("candidate-*.json")
    ]
    for record in rounds:
        (server,) = [u for u in servers if record.started_at <= u.first_at <= record.ended_at]
        assert record.machine is not None and record.machine.own_cpu_s is not None
        assert record.machine.own_cpu_s >= server.last_cpu_s, (record, server)
    events, _ = home.read_journal(summary.cycle_id)
    # the selection starts' waits (an A/A candidate that one start each qualifies by chance on
    # a loaded machine gets a held-out check, whose starts wait too)
    waits = [
        e
        for e in events
        if e.state == CycleState.EXPERIMENT
        and e.step == JournalStep.QUIET
        and e.fields.get("phase") == "measure"
    ]
    starting = [e for e in waits if e.fields["waiting"]]
    assert (
        len(starting) == len(rounds) == len(waits) - len(starting)
    )  # a line as each begins and ends
    assert all("waiting for a quiet machine" in e.message for e in starting)
    assert all(e.fields.get("candidate") for e in starting)  # status names the start
    assert all("still busy after 3 s" in e.message for e in waits if not e.fields["waiting"])
    assert load_sentence(rounds, 0.2).startswith("the machine was busy while it measured")
