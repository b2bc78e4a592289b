"""Implementations bundled with the suite: the seed variants (as written, bugs included), two
correct references, and the mutant zoo. ``bundled()`` is the entry point the suite discovers.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from conformance.spec import Implementation

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

EXPECTED_RESULTS = Path(__file__).with_name("expected_results.toml")


def expected_results() -> dict[str, dict[str, str]]:
    """``{implementation: {check: reason}}``: every failure the suite must find, and why."""
    with EXPECTED_RESULTS.open("rb") as handle:
        return {name: dict(checks) for name, checks in tomllib.load(handle).items()}


def bundled() -> list[Implementation]:
    """Every bundled implementation, with its expected failures from ``expected_results.toml``."""
    from implementations import reference_sdpa, reference_torch_mha, seeds
    from implementations.mutants import MUTANT_MODULES, textbook

    declared = [
        *seeds.IMPLEMENTATIONS,
        reference_sdpa.IMPLEMENTATION,
        reference_torch_mha.IMPLEMENTATION,
        *textbook.IMPLEMENTATIONS,
        *(module.IMPLEMENTATION for module in MUTANT_MODULES),
    ]
    expected = expected_results()
    unknown = set(expected) - {impl.name for impl in declared}
    if unknown:
        raise ValueError(f"{EXPECTED_RESULTS.name} names unknown implementations: {sorted(unknown)}")
    return [replace(impl, expected_failures=expected.get(impl.name, {})) for impl in declared]
