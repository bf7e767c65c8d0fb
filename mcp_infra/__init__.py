"""mcp-infra: a model proposes; deterministic code decides."""

import platform
import sys

__version__ = "0.1.0"

SUPPORTED = "Linux, or macOS on Apple silicon"


def unsupported_platform(system: str = sys.platform, machine: str | None = None) -> str | None:
    """Why this platform cannot run mcp-infra, or None. MLX, which serves and measures every
    model here, has no build for Windows or Intel macOS (the package's markers leave MLX out
    there, so the install succeeds and this says why nothing would run)."""
    machine = machine or platform.machine()
    if system.startswith("linux"):
        return None
    if system == "darwin" and machine == "arm64":
        return None
    where = "Intel macOS" if system == "darwin" else system
    return f"mcp-infra runs on {SUPPORTED} (MLX has no build for {where} / {machine})"


if (_why := unsupported_platform()) is not None:
    raise ImportError(_why)
