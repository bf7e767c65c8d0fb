"""The package's architecture, enforced: imports point down the layers, never up, and never round.

Layers, bottom to top: ``contracts``/``errors`` (and the package root, which only holds the
version) → ``core`` (pure decisions) → ``state`` (home,
evidence, artifacts) → ``procs`` (processes and measurement) → ``flows`` (cycle, approval, watch,
the faces' API) → ``faces`` and ``demo``. A module may import its own layer or any layer below
it; the pure core imports nothing of ours but contracts and errors. Every import counts, also a
lazy one inside a function. No module imports another module's private (``_``) name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

PACKAGE = REPO / "mcp_infra"
RANK = {
    "contracts": 0,
    "errors": 0,
    "core": 1,
    "state": 2,
    "procs": 3,
    "flows": 4,
    "faces": 5,
    "demo": 5,
    "__main__": 6,
    "__init__": 0,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import of our package."""
    found: list[tuple[str, list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mcp_infra"):
            names = [a.name for a in node.names]
            submodules = [
                f"{node.module}.{n}"
                for n in names
                if (PACKAGE.parent / f"{node.module}.{n}".replace(".", "/"))
                .with_suffix(".py")
                .exists()
            ]
            if submodules:  # `from mcp_infra.state import evidence` imports a module
                found += [(m, [], node.lineno) for m in submodules]
            else:
                found.append((node.module, names, node.lineno))
        elif isinstance(node, ast.Import):
            found += [
                (a.name, [], node.lineno) for a in node.names if a.name.startswith("mcp_infra")
            ]
    return found


def graph() -> dict[str, list[tuple[str, list[str], int]]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def direction_problems(edges: dict[str, list[tuple[str, list[str], int]]]) -> list[str]:
    problems = []
    for module, imports in edges.items():
        here = layer_of(module)
        for target, names, line in imports:
            there = layer_of(target)
            if there not in RANK or here not in RANK:
                problems.append(f"{module}:{line} imports {target}: unknown layer")
            elif RANK[there] > RANK[here]:
                problems.append(f"{module}:{line} ({here}) imports {target} ({there}): upward")
            elif here == "core" and there not in {"contracts", "errors", "core"}:
                problems.append(f"{module}:{line}: the pure core imports {target}")
            private = [n for n in names if n.startswith("_") and n != "__version__"]
            if private and target != module:
                problems.append(f"{module}:{line} imports private {private} from {target}")
    return problems


def cycles(edges: dict[str, list[tuple[str, list[str], int]]]) -> list[list[str]]:
    """Every import cycle among the package's modules (depth-first search)."""
    adjacency = {
        m: sorted({t for t, _, _ in imports if t in edges and t != m})
        for m, imports in edges.items()
    }
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in adjacency[node]:
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in adjacency:
        if node not in state:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    unknown = sorted(m for m in graph() if layer_of(m) not in RANK)
    assert unknown == []


def test_imports_point_down_the_layers() -> None:
    assert direction_problems(graph()) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(
    ("module", "target", "names", "expected"),
    [
        ("mcp_infra.core.stats", "mcp_infra.faces.render", [], "upward"),
        ("mcp_infra.core.stats", "mcp_infra.state.store", ["Home"], "upward"),
        ("mcp_infra.state.store", "mcp_infra.flows.cycle", [], "upward"),
        ("mcp_infra.flows.cycle", "mcp_infra.procs.runtime", ["_reap"], "private"),
    ],
)
def test_the_checks_catch_a_violation(
    module: str, target: str, names: list[str], expected: str
) -> None:
    """The checks can fail: a made-up upward or private import is reported."""
    problems = direction_problems({module: [(target, names, 1)]})
    assert problems and expected in problems[0]


def test_the_cycle_check_catches_a_cycle() -> None:
    edges = {
        "mcp_infra.flows.a": [("mcp_infra.flows.b", [], 1)],
        "mcp_infra.flows.b": [("mcp_infra.flows.a", [], 1)],
    }
    assert cycles(edges) == [["mcp_infra.flows.a", "mcp_infra.flows.b", "mcp_infra.flows.a"]]
