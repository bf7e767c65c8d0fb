"""Where the tests find the repository: its root, the tests' data files, the benchmarks, and
the evidence bundles shipped in evidence/ (each verified by the public key shipped beside it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
BENCHMARKS = REPO / "benchmarks"
SHIPPED = sorted(p.parent for p in (REPO / "evidence").glob("*/MANIFEST.json"))


def shipped_key(bundle: Path) -> Path:
    """The public key shipped beside a bundle of evidence/ (`evidence/<id>.pub`)."""
    return bundle.parent / f"{bundle.name}.pub"


def load_benchmark(name: str) -> ModuleType:
    """A benchmark script (benchmarks/<name>.py) as a module, loaded from its file.

    A script imports its sibling ``_common`` as a top-level module (its folder is on the path
    when it runs as a script): that one is loaded from its file first, under that name."""
    for module in ("_common", name):
        if module not in sys.modules:
            spec = importlib.util.spec_from_file_location(module, BENCHMARKS / f"{module}.py")
            assert spec is not None and spec.loader is not None, module
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[module] = loaded
            spec.loader.exec_module(loaded)
    return sys.modules[name]
