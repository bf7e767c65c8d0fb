"""mcp-infra: a model proposes; deterministic code decides."""

__version__ = "0.1.0"
