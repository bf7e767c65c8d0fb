"""Tests of the flows: approval, measurement, rounds, planning, projection (mcp_infra/flows/)."""
