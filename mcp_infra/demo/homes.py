"""Served homes on the demo models, for the benchmarks and the tests.

`mcp-infra demo` prepares one home on fixed ports under the demo policy (`demo.run.prepare`).
The benchmarks and the test suite need many at once, each on free ports, and cycles short enough
for a 2-core machine: the `test` policy written here is the demo policy with fewer repeats,
tokens and prompts (the `test-speed` suite: two of demo-speed's short prompts, one held-out).
It is real configuration that the code loads like any user's own policy. This lives in the
package (not in tests/) so a benchmark runs from a plain `pip install`.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import yaml

from mcp_infra.contracts import LOCAL_HOST, ClusterHost, DistributedConfig, Recipe, ServiceConfig
from mcp_infra.demo.models import build_split_target
from mcp_infra.procs.runtime import free_port
from mcp_infra.procs.service import stop_service, stop_stray_candidates
from mcp_infra.state.catalog import policy_dir
from mcp_infra.state.store import CorruptFile, Home, read_model, write_model

TEST_POLICY = "test"

# Lean on purpose (a 2-core machine): two starts per configuration, one request at a time, two
# short prompts and one held-out (each start's requests are most of a test cycle's time);
# whoever measures the workload cells, more starts or demo-speed's prompts sets their own.
LEAN_PROTOCOL: dict[str, object] = {
    "suite": "test-speed",
    "repeats": 2,
    "warmup": 1,
    "max_tokens": 24,
    "bootstrap_resamples": 500,
    "ready_timeout_s": 120,
    "request_timeout_s": 60,
    "min_starts": 2,
    "max_starts": 2,
    "workload": [{"request_class": "short", "concurrency": 1, "role": "decisive"}],
}

# Thresholds that let a measured gain promote whatever its size (a promotion by policy, not
# by this machine's speed): any estimate above 1.000x with an interval above 0.5x, and no
# per-prompt floor. Identical measurements still never qualify (judging.judge: "No gain").
PROMOTE_ANY_GAIN: dict[str, object] = {
    "min_speedup_pct": {"default": -50.0, "low": -50.0, "high": 200.0},
    "worst_prompt_tolerance_pct": 100.0,
}


def exclusive_fraction() -> float:
    """A ``service.memory_budget_fraction`` of this machine's memory (0.5 GiB) that one demo
    server fits (preflight: about 0.3 GiB) and no two do (a demo manifest's peak is 1 GB):
    candidates then run alone while the front holds requests."""
    return round(0.5 * 2**30 / psutil.virtual_memory().total, 8)


# The least a whole cycle measures: one fresh start per configuration and one timed request per
# prompt, selection and held-out alike, of 12-token answers, for tests of what happens around the
# measuring (progress, status, sealing), not of what it decides.
ONE_START: dict[str, object] = {
    "min_starts": 1,
    "max_starts": 1,
    "repeats": 1,
    "heldout_repeats": 1,
    "max_tokens": 12,
}
# Who needs a winner gets it by policy, not by this machine's speed: any gain qualifies, judged
# over one fresh start a side at 60% confidence (the assumed 5% start-to-start spread in the
# interval and the noise floor), one timed request per prompt. The held-out check confirms it
# in one more start a side. One start can swing below the baseline's on a loaded machine: who
# needs the promotion runs the cycle again when it kept the baseline.
PROMOTING_PROTOCOL: dict[str, object] = {
    "min_starts": 1,
    "max_starts": 1,
    "confidence": 0.6,
    "repeats": 1,
    "heldout_repeats": 1,
}


def write_test_policy(
    home: Home,
    thresholds: dict[str, object] | None = None,
    budgets: dict[str, object] | None = None,
    *,
    base: str = "demo",
    lean: bool = True,
    **protocol: object,
) -> None:
    """The shipped ``base`` policy (with `LEAN_PROTOCOL` unless ``lean`` is false, then
    ``protocol`` on top) saved as the home's own `test` policy."""
    data = yaml.safe_load((policy_dir() / f"{base}.yaml").read_text())
    data["name"] = TEST_POLICY
    # Nor does a test home learn its spread from its own earlier cycles, or stop futile
    # candidates early, unless its test asks: a test that runs two cycles in one home asserts
    # what each cycle does, not what the first taught the second. Its recipe memory is on, as
    # in every policy but the demo's.
    for learned in ("learn_spread", "futility_confidence"):
        data["protocol"].pop(learned, None)
    data.pop("recipe_memory", None)
    data["protocol"].update(
        {
            **(LEAN_PROTOCOL if lean else {}),
            **protocol,
            **(PROMOTING_PROTOCOL if thresholds == PROMOTE_ANY_GAIN else {}),
        }
    )
    data["thresholds"].update(thresholds or {})
    data["budgets"].update(budgets or {})
    # The demo waits for a quiet machine before each start (policy/demo.yaml); a test home does
    # not, unless its test asks (tests/e2e/test_machine_cycle.py): on a loaded CI machine every
    # start would otherwise wait its full bound, and what a test asserts is not the machine's.
    data.get("service", {}).pop("quiet_cpu_fraction", None)
    home.user_policy.mkdir(parents=True, exist_ok=True)
    (home.user_policy / f"{TEST_POLICY}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def two_free_ports() -> tuple[int, int]:
    """The stable port and the scratch port: free now, and not the same one."""
    port = free_port()
    scratch = free_port()
    while scratch == port:
        scratch = free_port()
    return port, scratch


def make_home(
    root: Path,
    models: dict[str, Path],
    thresholds: dict[str, object] | None = None,
    budgets: dict[str, object] | None = None,
    *,
    base: str = "demo",
    lean: bool = True,
    **protocol: object,
) -> Home:
    """A home at ``root`` whose models are ``models`` (built by `build_demo_models`, shared by
    a symlink), serving the plain target on free ports under the `test` policy. Nothing is
    started: `procs.service.ensure_serving` does that."""
    home = Home(root).ensure()
    home.models.rmdir()
    home.models.symlink_to(models["target"].parent, target_is_directory=True)
    write_test_policy(home, thresholds, budgets, base=base, lean=lean, **protocol)
    port, scratch = two_free_ports()
    write_model(
        home.config,
        ServiceConfig(
            port=port,
            scratch_port=scratch,
            policy=TEST_POLICY,
            baseline=Recipe(
                candidate_id="demo-tiny:target",
                template="mlx_lm_server",
                model_path=str(home.models / "target"),
            ),
        ),
    )
    return home


SPLIT_BASELINE = "demo-split:single"


def make_split_home(root: Path, models: dict[str, Path], **protocol: object) -> Home:
    """A home like ``make_home`` whose live recipe is the splittable demo target in one
    process (built beside the demo models on first use), so ``demo-split:tp2-ring`` (the same
    folder over 2 ranks on this machine) is measured against it. Its config names this machine
    as the only distributed host, with 2 slots."""
    home = make_home(root, models, **protocol)  # type: ignore[arg-type]  # protocol fields only
    folder = build_split_target(models["target"].parent)
    config = read_model(home.config, ServiceConfig)
    baseline = Recipe(
        candidate_id=SPLIT_BASELINE,
        template="mlx_lm_server",
        model_path=str(home.models / folder.name),  # through the home's link, like make_home
    )
    write_model(
        home.config,
        config.model_copy(
            update={
                "baseline": baseline,
                "distributed": DistributedConfig(
                    hosts=[ClusterHost(name="local", ssh=LOCAL_HOST, slots=2)]
                ),
            }
        ),
    )
    return home


def stop_home(home: Home) -> None:
    """Stop what this home's records name: its scratch servers, then the front and the live
    backend. A record corrupted on purpose is passed over (whoever corrupted it sweeps)."""
    for stop in (stop_stray_candidates, stop_service):
        try:
            stop(home, grace=3)
        except CorruptFile:
            continue


def use_test_policy(home: Home, config: ServiceConfig, **protocol: object) -> ServiceConfig:
    """Switch a prepared demo home (`demo.run.prepare`) to the `test` policy: the same demo,
    in a cycle a few times shorter."""
    write_test_policy(home, None, None, base="demo", lean=True, **protocol)
    config = config.model_copy(update={"policy": TEST_POLICY})
    write_model(home.config, config)
    return config
