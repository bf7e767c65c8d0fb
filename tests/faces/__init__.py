"""Tests of the faces: the MCP server, the CLI, rendering and the report (mcp_infra/faces/)."""
