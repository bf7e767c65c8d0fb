"""The report's screenshots, made the way docs/evidence.md makes them: `mcp-infra evidence report
... -o X.html`, then `chromium --headless --screenshot=X.png --window-size=1280,2000 file://X.html`,
one page per outcome (promoted, baseline kept, rolled back). Each PNG must be the window's size
and hold a page: many colours, a good share of the pixels not white, and the outcome box's own
colour near the top.

Promoted is the bundle shipped in evidence/ (a real demo cycle). Baseline kept and rolled back
are sealed by the product's own code from SYNTHETIC timings (tests/helpers/synthetic_bundle.py):
a real cycle for each would take minutes on this machine; what is tested here is the page in a
browser, not the cycle. The screenshots in docs/report/ come from real cycles.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mcp_infra.contracts import CandidateRun, Outcome
from mcp_infra.faces import cli
from mcp_infra.state.store import Home
from tests.helpers import chromium
from tests.helpers.paths import SHIPPED, shipped_key
from tests.helpers.synthetic_bundle import (
    baseline_run,
    cheap_seal,
    freeze,
    greedy_ids,
    prompts,
    seal,
    timing,
)

WIDTH, HEIGHT = 1280, 2000
BOX = {  # the decision box's border colour (faces/report.html), by outcome
    "promoted": (28, 124, 60),
    "kept_baseline": (91, 100, 114),
    "rolled_back": (179, 38, 30),
}


def bundles(home: Home) -> dict[str, tuple[Path, list[str]]]:
    """One bundle per outcome, with the report's key arguments."""
    kept = cheap_seal(home, freeze(home, ["demo-tiny:kv8"]))
    plan = freeze(home, ["demo-tiny:draft-k2"])
    ids = {p: [1, 2, 3] for p in prompts(plan)}
    winner = CandidateRun(
        candidate="demo-tiny:draft-k2",
        samples=timing("demo-tiny:draft-k2", plan, 20.0),
        greedy=greedy_ids("demo-tiny:draft-k2", plan, ids),
        peak_memory_gb=0.3,
    )
    base = baseline_run(plan, greedy_ids("baseline", plan, ids))
    rolled = seal(home, plan, base, [winner], outcome=Outcome.ROLLED_BACK)
    return {
        "promoted": (SHIPPED[0], ["--key", str(shipped_key(SHIPPED[0]))]),
        "kept_baseline": (home.evidence / kept.cycle_id, []),
        "rolled_back": (home.evidence / rolled.cycle_id, []),
    }


def screenshot(page: Path, shot: Path, profile: Path) -> None:
    exe = chromium.chromium()
    assert exe
    argv = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--screenshot={shot}",
        f"--window-size={WIDTH},{HEIGHT}",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]


@pytest.mark.slow
def test_the_three_outcomes_screenshot_as_pages(home: Home, tmp_path: Path) -> None:
    from PIL import Image  # Pillow comes with mlx-vlm (the dev extra)

    if chromium.chromium() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium)")
    for outcome, (bundle, key) in bundles(home).items():
        page, shot = tmp_path / f"{outcome}.html", tmp_path / f"{outcome}.png"
        argv = ["--home", str(home.root), "evidence", "report", str(bundle), *key, "-o", str(page)]
        assert cli.main(argv) == 0, outcome
        screenshot(page, shot, tmp_path / f"profile-{outcome}")
        print(f"{outcome} screenshot: {shot} ({shot.stat().st_size} bytes)")
        assert 50_000 < shot.stat().st_size < 2_000_000, f"{outcome}: {shot.stat().st_size} B"
        with Image.open(shot) as image:
            assert image.size == (WIDTH, HEIGHT), (outcome, image.size)
            rgb = image.convert("RGB")
            counts = {c: n for n, c in rgb.getcolors(maxcolors=WIDTH * HEIGHT) or []}
            top = rgb.crop((0, 0, WIDTH, 300))
            top_colours = {c for _, c in top.getcolors(maxcolors=WIDTH * 300) or []}
        white = counts.get((255, 255, 255), 0)
        assert len(counts) > 200, f"{outcome}: {len(counts)} colours: a blank page"
        assert white < 0.97 * WIDTH * HEIGHT, f"{outcome}: {white} pixels white of the page"
        assert BOX[outcome] in top_colours, f"{outcome}: no decision box in its colour on top"
