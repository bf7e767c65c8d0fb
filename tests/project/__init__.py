"""Checks of the project itself: lint, layers, docs, and that every benchmark runs."""
