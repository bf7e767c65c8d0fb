"""Whole cycles, the demo, the install and conformance: tests that span the layers."""
