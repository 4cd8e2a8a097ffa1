"""Kiln's version (one place; packages record it as their ``generator``)."""

__version__ = "0.1.0"
