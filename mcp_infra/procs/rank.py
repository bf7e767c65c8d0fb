"""``python -m mcp_infra.procs.rank``: what mlx.launch runs on every rank of a split server.

``--log-dir DIR -- ARGV...``: send this rank's output to ``DIR/rank-<MLX_RANK>.log`` and become
ARGV (an exec: the same process, so the launcher and its process group see the server itself).
mlx.launch merges every rank's output into one stream; a log per rank is what lets a failed
candidate say which rank died and show that rank's own tail. Where the folder does not exist
(a remote host) the output stays with the launcher, which forwards it to its own log.

``--probe PATH...``: print this host's facts for preflight (packages, model fingerprints,
memory) as one JSON line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _redirect(log_dir: str) -> None:
    """Only into a folder that exists: the control plane makes it before the launch, so a
    rank on another host (without that folder) keeps its output with the launcher."""
    rank = os.environ.get("MLX_RANK", "0")
    if not Path(log_dir).is_dir():
        return
    try:
        fd = os.open(
            str(Path(log_dir) / f"rank-{int(rank)}.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
    except (OSError, ValueError):
        return
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--probe"]:
        from mcp_infra.procs.distributed import probe_here

        print(probe_here(args[1:]).model_dump_json())
        return 0
    if args[:1] == ["--log-dir"] and len(args) >= 2:
        _redirect(args[1])
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m mcp_infra.procs.rank [--log-dir DIR] -- ARGV...", file=sys.stderr)
        return 2
    os.execv(args[0], args)  # argv list, never a shell


if __name__ == "__main__":
    sys.exit(main())
