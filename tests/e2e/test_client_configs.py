"""Issue 13: every client configuration in README.md starts a server that answers an MCP
handshake.

Each snippet follows a `<!-- client-config: NAME -->` marker. The command it names is started
with this test venv's installed `mcp-infra` console script in place of the placeholder path
(`/home/me/.local/bin/mcp-infra`, `"$(command -v mcp-infra)"`), and the home the snippet names
replaced by the test's home. A `uvx --from PATH mcp-infra ...` snippet is checked for its shape
and started the same way (uvx would resolve every dependency from the network; the wheel itself
is tested in tests/e2e/test_installable.py).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from mcp_infra.state.store import Home
from tests.helpers.mcp_clients import child_env
from tests.helpers.paths import REPO

README = REPO / "README.md"
SCRIPT = Path(sys.executable).parent / "mcp-infra"
BLOCK = re.compile(r"<!-- client-config: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.DOTALL)


def snippets() -> dict[str, tuple[str, str]]:
    return {name: (lang, body) for name, lang, body in BLOCK.findall(README.read_text())}


def command_of(lang: str, body: str) -> list[str]:
    """The server's argv as the snippet gives it."""
    if lang == "bash":
        words = shlex.split(body.replace("\\\n", " "))
        assert words[:3] == ["claude", "mcp", "add"] and "--" in words
        return words[words.index("--") + 1 :]
    data = json.loads(body)
    servers = data.get("mcpServers") or data["servers"]
    entry = servers["mcp-infra"]
    if "servers" in data:
        assert entry["type"] == "stdio"
    return [entry["command"], *entry["args"]]


def runnable(argv: list[str], home: Home) -> list[str]:
    if argv[0] == "uvx":
        assert argv[1] == "--from" and argv[3] == "mcp-infra", argv
        argv = [argv[3], *argv[4:]]
    assert argv[0] == "$(command -v mcp-infra)" or Path(argv[0]).name == "mcp-infra", argv
    assert "serve" in argv
    args = list(argv[1:])
    if "--home" in args:
        args[args.index("--home") + 1] = str(home.root)
    return [str(SCRIPT), *args]


def test_readme_has_every_client() -> None:
    assert set(snippets()) == {
        "claude-code-cli",
        "claude-code-cli-uvx",
        "claude-code-mcp-json",
        "cursor-mcp-json",
        "cursor-mcp-json-uvx",
        "vscode-mcp-json",
    }


@pytest.mark.parametrize("name", sorted(snippets()))
def test_snippet_starts_a_server(name: str, home: Home) -> None:
    assert SCRIPT.exists(), "the test venv has the mcp-infra console script"
    lang, body = snippets()[name]
    argv = runnable(command_of(lang, body), home)

    async def handshake() -> set[str]:
        params = StdioServerParameters(
            command=argv[0], args=argv[1:], env=child_env(), cwd=str(home.root)
        )
        async with Client(params, mode="legacy") as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert {"status", "registry", "evidence"} <= anyio.run(handshake)
