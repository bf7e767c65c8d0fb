"""``python -m mcp_infra.procs.heal --home DIR``: restart the live backend after it died.

Started by the front (``Front.run_healer``) when the live backend's recorded process is gone; it
does one attempt (``service.heal_live_backend``) under the service lock and prints its answer as
one JSON line, ``{"outcome": ..., "message": ...}``, which the front's rules turn into the next
step (``core.frontrules.after_attempt``). Its own process: a slow start never blocks the front,
and the lock dies with it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from mcp_infra.procs.service import HealResult, heal_live_backend
from mcp_infra.state.store import Home

EXIT = {"restarted": 0, "nothing": 0, "busy": 4, "failed": 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mcp_infra.procs.heal")
    parser.add_argument("--home", required=True)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        result = heal_live_backend(Home(args.home), timeout=args.timeout)
    except Exception as exc:  # the answer is the front's to judge; a traceback tells it nothing
        result = HealResult("failed", f"{type(exc).__name__}: {str(exc)[:300]}")
    print(json.dumps({"outcome": result.outcome, "message": result.message}), flush=True)
    return EXIT[result.outcome]


if __name__ == "__main__":
    sys.exit(main())
