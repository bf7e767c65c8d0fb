"""Issue 13: mcp-infra works installed from its wheel, not only as an editable install.

Slow: builds the wheel and installs it into a fresh venv (about half a minute).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_infra.faces.cli import build_parser
from mcp_infra.state.datafiles import shipped_dir
from tests.helpers.installed import REPO, build_wheel, clean_env, install_venv, wheel_names

SHIPPED = sorted(
    str(p.relative_to(REPO))
    for folder in ("registry", "policy")
    for p in (REPO / folder).rglob("*.yaml")
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    out = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(out)
    yield wheel, install_venv(wheel, tmp_path_factory.mktemp("venv") / "venv")


@pytest.mark.slow
def test_wheel_carries_the_shipped_yaml(installed: tuple[Path, Path]) -> None:
    names = set(wheel_names(installed[0]))
    assert SHIPPED, "the repository has shipped YAML files"
    for path in SHIPPED:  # registry/x.yaml -> mcp_infra/shipped/registry/x.yaml
        assert f"mcp_infra/shipped/{path}" in names, path
    assert not any(n.startswith(("registry/", "policy/", "tests/")) for n in names)
    for init in (REPO / "mcp_infra").rglob("__init__.py"):  # every subpackage is packaged
        assert str(init.relative_to(REPO)) in names, f"add {init.parent.name} to pyproject"


@pytest.mark.slow
def test_installed_cli_and_mcp_handshake(
    installed: tuple[Path, Path], tmp_path: Path, anyio_backend: str
) -> None:
    import anyio

    bin_dir = installed[1]
    env = clean_env()
    where = subprocess.run(
        [
            str(bin_dir / "python"),
            "-c",
            "import mcp_infra, mcp_infra.state.datafiles"
            " as d; print(mcp_infra.__file__); print(d.shipped_dir('policy'))",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    module, policy = where.stdout.split()
    assert module.startswith(str(bin_dir.parent)), "the wheel's copy, not the checkout"
    assert policy.startswith(str(bin_dir.parent)) and policy.endswith("mcp_infra/shipped/policy")

    home = tmp_path / "home"
    registry = subprocess.run(
        [str(bin_dir / "mcp-infra"), "registry", "--json", "--home", str(home)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert registry.returncode == 0, registry.stderr[-2000:]
    ids = {c["id"] for c in json.loads(registry.stdout)["candidates"]}
    assert "demo-tiny:draft-k2" in ids
    gates = subprocess.run(
        [str(bin_dir / "mcp-infra"), "--home", str(home), "gate", "list"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert gates.returncode == 0 and gates.stdout.strip(), gates.stderr[-2000:]

    async def handshake() -> set[str]:
        params = StdioServerParameters(
            command=str(bin_dir / "mcp-infra"),
            args=["serve", "--home", str(home)],
            env=env,
            cwd=str(tmp_path),
        )
        async with Client(params, mode="legacy") as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert anyio.run(handshake) >= {"status", "registry", "evidence", "propose_plan"}


def test_editable_install_reads_the_repository_folders() -> None:
    """One copy: this checkout's own folders, so an edit there is seen at once."""
    assert shipped_dir("registry") == REPO / "registry"
    assert shipped_dir("policy") == REPO / "policy"
    assert shipped_dir("suites") == REPO / "policy" / "suites"


def test_global_options_before_or_after_the_subcommand() -> None:
    parse = build_parser().parse_args
    assert parse(["demo", "--home", "/x"]).home == "/x"
    assert parse(["--home", "/y", "demo"]).home == "/y"
    assert parse(["gate", "list", "--home", "/z"]).home == "/z"
    assert parse(["--home", "/a", "status"]).home == "/a"
    assert parse(["status"]).home is None


@pytest.mark.slow
def test_sdist_and_wheel_say_what_they_are(tmp_path: Path) -> None:
    """`python -m build` (isolated, as a release would) and `twine check`: the licence text in
    both, an SPDX expression, classifiers, bounded MLX runtimes behind platform markers, and an
    sdist that carries what the test suite reads (its YAML, the shipped folders, the docs)."""
    import sys
    import tarfile
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "build", "-o", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    [sdist] = tmp_path.glob("mcp_infra-*.tar.gz")
    [wheel] = tmp_path.glob("mcp_infra-*.whl")
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(meta).decode()
        [licence] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licence) == (REPO / "LICENSE").read_bytes()
    assert "License-Expression: Apache-2.0" in metadata
    assert "Classifier: Operating System :: POSIX :: Linux" in metadata
    assert "License ::" not in metadata, "an SPDX expression, not a licence classifier"
    mlx_lm = next(
        line for line in metadata.splitlines() if line.startswith("Requires-Dist: mlx-lm")
    )
    assert "==" in mlx_lm or "<" in mlx_lm, "bounded above"
    assert 'platform_machine == "arm64"' in mlx_lm, "left out where MLX has no build"
    with tarfile.open(sdist) as archive:
        root = archive.getnames()[0].split("/")[0]
        inside = {n.removeprefix(root + "/") for n in archive.getnames()}
    wanted = {
        str(path.relative_to(REPO))
        for folder in ("tests", "registry", "policy", "evidence", "docs", "benchmarks")
        for path in (REPO / folder).rglob("*")
        if path.is_file()
        and not {"__pycache__", ".hypothesis"} & set(path.parts)
        and path.suffix != ".pyc"
    }
    missing = sorted(wanted - inside)
    assert not missing, f"the sdist lacks {missing[:10]}"
    assert {"LICENSE", "README.md", "pyproject.toml"} <= inside
    assert not any("__pycache__" in n for n in inside)
