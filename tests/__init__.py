"""The test suite, laid out like the package (docs/layout.md): one folder per layer."""
