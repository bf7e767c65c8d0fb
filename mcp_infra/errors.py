"""Every error the project raises on purpose, and the exit codes the command line returns.

One base class, so a face can tell "mcp-infra refused or failed, and says why" from a bug. Errors
keep their standard-library parent too (``ValueError`` for bad input, ``RuntimeError`` for a state
of the world), so callers that catch those keep working.
"""

from __future__ import annotations

from enum import IntEnum


class McpInfraError(Exception):
    """Base of every error mcp-infra raises on purpose; its message is written for a person."""


class ServerUnavailable(McpInfraError, RuntimeError):
    """A server could not be brought up or kept serving: it did not start, its port is held by a
    stranger, or the live service could not reach the wanted recipe. Flows catch this one class
    and decide (refuse the candidate, roll back, or ask for an operator)."""


class UsageError(McpInfraError, ValueError):
    """The command line names nothing to act on: a missing file, an unknown cycle, candidate or
    task, a missing argument. The message says what would be valid."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM reached a long-running command. A ``BaseException`` on purpose: it
    unwinds through every ``except Exception`` (whose handlers would carry on measuring) to the
    command, which then restores the service the way recovery after a crash does."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


class ExitCode(IntEnum):
    """What `mcp-infra` returns; documented in docs/cli.md (a test runs each)."""

    OK = 0
    NO = 1  # the command ran and its answer is no: a plan refused, a bundle that does not verify,
    #         a gate failed, an approval that did not end promoted
    USAGE = 2  # nothing to act on: bad arguments, an unknown cycle or candidate, a refusal
    CORRUPT_STATE = 3  # a file in the home does not parse as its contract
    LOCKED = 4  # another supervisor owns the service
    SEAL_FAILED = 5  # evidence could not be written; the service was restored
    UNAVAILABLE = 6  # a port is taken or a server could not be brought up
    SYSTEM = 7  # the operating system refused: disk full, permission denied, not a folder
    INTERRUPTED = 130  # stopped by SIGINT (128 + 2; SIGTERM gives 143): the service restored
