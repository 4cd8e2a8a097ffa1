"""Developer tools run with ``python -m tools.NAME`` from the repository root."""
