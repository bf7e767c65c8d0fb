"""A non-editable install of this checkout in a fresh venv, built once per test session.

The wheel is built from the repository (pip, with build isolation: it fetches setuptools once
into pip's cache) and installed with ``--no-deps`` into a fresh venv. Dependencies are not
downloaded again: a ``.pth`` line puts the test interpreter's site-packages after the venv's
own, so the venv's ``mcp_infra`` is the wheel's (an editable install's finder there is a .pth
of its own, which Python does not process from a path added this way).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.helpers.paths import REPO


def build_wheel(out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        timeout=600,
        cwd=out,
    )
    wheels = sorted(out.glob("mcp_infra-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def install_venv(wheel: Path, venv: Path) -> Path:
    """A fresh venv with the wheel installed (not editable); returns its bin folder."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "zz-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    return venv / "bin"


def clean_env(**extra: str) -> dict[str, str]:
    """No PYTHONPATH, offline, nothing pointing back at the checkout."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, "HF_HUB_OFFLINE": "1", **extra}
