"""Tests of the home, its files and the evidence (mcp_infra/state/)."""
