"""The command line as a table: every command listed with its help and an example, every option
with help, "did you mean" for a typo, ``--json`` and ``--home`` anywhere on the line.

In-process (``cli.main``); the same behaviour in real `mcp-infra` subprocesses, with one test
per documented exit code, is in ``test_cli_behaves.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from mcp_infra.errors import ExitCode
from mcp_infra.faces import cli
from mcp_infra.state.store import Home


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_command_is_listed_with_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    for command in cli.COMMANDS:
        assert f"    {command.name} " in listed, command.name
    assert {"status", "registry"} <= {c.name for c in cli.COMMANDS}


def test_every_option_has_help_and_every_command_an_example() -> None:
    parser = cli.build_parser()
    children = subparsers(parser)
    assert set(children) == {c.name for c in cli.COMMANDS}
    for name, child in [("", parser), *children.items()]:
        for action in child._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            assert action.help and len(action.help) > 10, (name, action.dest)
        if name:
            example = next(c.example for c in cli.COMMANDS if c.name == name)
            assert example.startswith(f"mcp-infra {name}")
            assert f"example: {example}" in child.format_help()


def test_each_example_parses() -> None:
    parser = cli.build_parser()
    for command in cli.COMMANDS:
        args = parser.parse_args(command.example.split()[1:])
        assert args.command == command.name


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["statsu"], "did you mean status?"),
        (["registy"], "did you mean registry?"),
        (["status", "--josn"], "did you mean --json?"),
        (["evidence", "--sektion", "gates"], "did you mean --section?"),
        (["evidence", "show", "latest", "--section", "gate"], "did you mean gates?"),
        (["serve", "--transprot", "http"], "did you mean --transport?"),
    ],
)
def test_a_typo_gets_did_you_mean(
    argv: list[str], suggestion: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--home", str(tmp_path), *argv]) == ExitCode.USAGE
    line = capsys.readouterr().err
    assert line.startswith("mcp-infra: error: ") and line.count("\n") == 1
    assert suggestion in line


def test_nothing_near_gets_no_guess(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--home", str(tmp_path), "zzzzzz"]) == ExitCode.USAGE
    assert "did you mean" not in capsys.readouterr().err


@pytest.mark.parametrize("where", ["first", "before the command", "last"])
def test_json_and_home_anywhere(
    where: str, bare_home: Home, capsys: pytest.CaptureFixture[str]
) -> None:
    home = ["--home", str(bare_home.root)]
    argv = {
        "first": ["--json", *home, "status"],
        "before the command": [*home, "--json", "status"],
        "last": ["status", *home, "--json"],
    }[where]
    assert cli.main(argv) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["configured"] is True


def test_a_json_error_wherever_json_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--json", "--home", str(tmp_path), "statsu"]) == ExitCode.USAGE
    out = capsys.readouterr()
    assert out.err == "" and "did you mean status?" in json.loads(out.out)["error"]["message"]
