"""Implementations bundled with the suite: the seed variants (as written, bugs included), two
correct references, the modern forms (grouped-query heads, RoPE, ALiBi, sliding windows, KV
caches, packed sequences), and the mutant zoo. ``bundled()`` is the entry point the suite discovers.
"""

from __future__ import annotations

from pathlib import Path

from conformance.model import expectations
from conformance.model.spec import Implementation

EXPECTED_RESULTS = Path(__file__).with_name("expected_results.toml")


def expected_results() -> dict[str, dict[str, str]]:
    """``{implementation: {check: reason}}``: every failure the suite must find, and why."""
    return expectations.load(EXPECTED_RESULTS)


def expected_warnings() -> dict[str, dict[str, str]]:
    """``{implementation: {check: reason}}``: every warning the suite must give, and why."""
    return expectations.load_all(EXPECTED_RESULTS)[1]


def bundled() -> list[Implementation]:
    """Every bundled implementation, with its expected failures from ``expected_results.toml``."""
    import conformance.implementations.modern as modern
    import conformance.implementations.reference_sdpa as reference_sdpa
    import conformance.implementations.reference_torch_mha as reference_torch_mha
    import conformance.implementations.seeds as seeds
    from conformance.implementations.mutants import MUTANT_MODULES, textbook

    declared = [
        *seeds.IMPLEMENTATIONS,
        reference_sdpa.IMPLEMENTATION,
        reference_torch_mha.IMPLEMENTATION,
        *textbook.IMPLEMENTATIONS,
        *modern.IMPLEMENTATIONS,
        *(module.IMPLEMENTATION for module in MUTANT_MODULES),
    ]
    expected, warnings = expectations.load_all(EXPECTED_RESULTS)
    unknown = (set(expected) | set(warnings)) - {impl.name for impl in declared}
    if unknown:
        raise ValueError(f"{EXPECTED_RESULTS.name} names unknown implementations: {sorted(unknown)}")
    return expectations.apply(declared, expected, warnings)
