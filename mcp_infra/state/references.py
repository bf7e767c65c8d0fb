"""Where a configuration's reference answers live: ``references/<key>.json`` in the home, one
file per configuration (``core.reference`` says what is kept and when it is reused).

The key is the configuration's whole identity: the recipe (template, model and drafter paths,
knobs, its own runtime environment, the artifact hashes it was resolved with), what its model
folders hold now (``memory.environment_key``: each small file's sha256, each large one's size
and modification time) and this machine and runtime (OS, CPU, BLAS, Python, the MLX packages'
versions). Changed model files, another runtime version or another machine is another key, so
a stale answer is never compared with.
"""

from __future__ import annotations

from collections.abc import Sequence

from mcp_infra.contracts import Recipe, ReferenceAnswer, ReferenceAnswers
from mcp_infra.core.digest import canonical_json, sha256_bytes
from mcp_infra.core.reference import merged
from mcp_infra.state.hostfacts import environment
from mcp_infra.state.memory import environment_key
from mcp_infra.state.store import CorruptFile, Home, private_dir, read_optional, write_model

KEEP = 8
"""Configurations whose answers are kept: the live one, the winners that may replace it and a
few before them (a rollback's), so the folder stays bounded on a service that runs for weeks: a
lossy plan's answers carry their most likely tokens, about 0.9 kB a token (0.84 MB for the demo's
39 answers of 24 tokens; some 9 MB for 40 answers of 256 tokens)."""


def reference_key(recipe: Recipe) -> str:
    """The configuration's identity (see the module notes)."""
    return sha256_bytes(
        canonical_json(
            {
                "recipe": recipe.key(),
                "hashes": dict(sorted(recipe.artifact_hashes.items())),
                "environment": environment_key(environment(), recipe),
            }
        )
    )


def load(home: Home, recipe: Recipe) -> ReferenceAnswers | None:
    """The answers kept for ``recipe``'s configuration (None: none, or a file that cannot be
    read, which only means they are asked again)."""
    if recipe.knobs.ranks:  # a split's answers depend on its hosts too, which no key names
        return None
    key = reference_key(recipe)
    try:
        kept = read_optional(home.references / f"{key}.json", ReferenceAnswers)
    except (CorruptFile, OSError):
        return None
    return kept if kept is not None and kept.key == key else None


def keep(home: Home, recipe: Recipe, answers: Sequence[ReferenceAnswer]) -> None:
    """Add ``answers`` to ``recipe``'s configuration's file (written atomically); the files of
    all but the ``KEEP`` configurations written last are removed."""
    if not answers or recipe.knobs.ranks:
        return
    key = reference_key(recipe)
    private_dir(home.references)
    write_model(
        home.references / f"{key}.json", merged(load(home, recipe), key, recipe.key(), answers)
    )
    files = sorted(home.references.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in files[KEEP:]:
        old.unlink(missing_ok=True)
