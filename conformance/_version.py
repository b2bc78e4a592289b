"""The suite's version, importable without importing anything else (``--version``, reports)."""

__version__ = "0.1.0"

VERSION_LINE = f"attention-conformance {__version__}"
"""What ``attention-conformance --version`` prints (the entry answers it before importing the CLI,
and the CLI's parser for ``python -m conformance.frontends.cli``)."""
