"""The README and docs/ stay readable and true to the tree: the README short, with its two
set-up commands verbatim; every repository path they name exists; docs/layout.md lists every
module of the package and no other.

Fast: it reads files only.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers.paths import REPO

ROOT = REPO
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LAYOUT = DOCS / "layout.md"
MAX_README_LINES = 300

SETUP_COMMANDS = (
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/mcp-infra demo",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/python -m pytest",
)

# A repository path: one of the top-level folders, not the tail of a longer path (so
# `<home>/evidence/` or `~/.cache/...` is not one), up to a character no path here contains.
TOP = r"(?:mcp_infra|benchmarks|policy|registry|tests|docs|evidence)"
REPO_PATH = re.compile(rf"(?<![\w./~<>$-]){TOP}/[^\s`'\"()\[\],;:|]*")
PLACEHOLDER = re.compile(r"[<>{}*…]|\.\.\.")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MODULE = re.compile(r"mcp_infra/[\w/]+\.py")


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def named_paths(text: str) -> set[str]:
    """Repository paths in code spans and fenced blocks, placeholders left out."""
    spans = [m.group(0) for m in FENCE.finditer(text)]
    spans += CODE_SPAN.findall(FENCE.sub("", text))
    found: set[str] = set()
    for span in spans:
        for match in REPO_PATH.finditer(span):
            path = match.group(0).split("::")[0].rstrip(".")
            if not PLACEHOLDER.search(path):
                found.add(path)
    return found


def link_targets(page: Path, text: str) -> set[Path]:
    """Relative link targets (web links and in-page anchors left out), resolved from the page."""
    out: set[Path] = set()
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.add((page.parent / target.split("#")[0]).resolve())
    return out


def test_the_readme_is_short_and_keeps_its_two_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_README_LINES
    for command in SETUP_COMMANDS:
        assert command in text, command


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for page in pages():
        text = page.read_text()
        missing += [
            f"{page.relative_to(ROOT)}: {path}"
            for path in sorted(named_paths(text))
            if not (ROOT / path).exists()
        ]
        missing += [
            f"{page.relative_to(ROOT)}: link {target}"
            for target in sorted(link_targets(page, text))
            if not target.exists()
        ]
    assert not missing, "\n".join(missing)


def test_the_layout_lists_every_module_and_no_other() -> None:
    listed = set(MODULE.findall(LAYOUT.read_text()))
    actual = {p.relative_to(ROOT).as_posix() for p in (ROOT / "mcp_infra").rglob("*.py")}
    assert not actual - listed, f"modules docs/layout.md omits: {sorted(actual - listed)}"
    assert not listed - actual, (
        f"modules docs/layout.md names that do not exist: {sorted(listed - actual)}"
    )


def test_the_checks_see_what_they_check() -> None:
    """The extraction finds paths where the docs write them and skips what is no path."""
    text = (
        "See `mcp_infra/core/stats.py::pooled_variance` and `tests/conftest.py`.\n"
        "```bash\n.venv/bin/python benchmarks/faults.py --smoke\n```\n"
        "Not these: `<home>/evidence/<id>/`, `evidence/<cycle id>/`, `runs/heldout--*.json`,"
        " `~/.cache/docs/x`, mcp_infra/outside_backticks.py.\n"
    )
    assert named_paths(text) == {
        "mcp_infra/core/stats.py",
        "tests/conftest.py",
        "benchmarks/faults.py",
    }
    page = DOCS / "x.md"
    assert link_targets(page, "[a](cli.md#errors) [b](https://x.org/y) [c](#top)") == {
        (DOCS / "cli.md").resolve()
    }
