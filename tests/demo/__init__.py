"""Tests of the demo model builder (mcp_infra/demo/)."""
