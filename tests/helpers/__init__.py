"""Helpers the tests share (not tests, not fixtures: fixtures live in tests/conftest.py)."""
