"""Tests of processes, launch templates and the front (mcp_infra/procs/)."""
