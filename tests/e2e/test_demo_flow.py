"""`mcp-infra demo` guards: it never resets a home that manages a real service."""

from __future__ import annotations

import subprocess
import sys

import yaml

from mcp_infra.state.store import Home


def test_demo_refuses_a_home_that_manages_a_real_service(home: Home) -> None:
    data = yaml.safe_load(home.config.read_text())
    assert data["policy"] != "demo"
    (home.evidence / "keep-me").mkdir(parents=True)
    result = subprocess.run(
        [sys.executable, "-m", "mcp_infra", "--home", str(home.root), "demo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "manages a real service" in result.stderr
    assert (home.evidence / "keep-me").is_dir()
