"""Tests of the pure core (mcp_infra/core/)."""
