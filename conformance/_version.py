"""The suite's version, importable without importing anything else (``--version``, reports)."""

__version__ = "0.1.0"
