"""Realistic broken implementations, each a bug people ship, kept to prove the checks catch them.

Every mutant module documents its bug, the symptom, and in ``CATCHES`` the check that must fail.
"""

from __future__ import annotations

from types import ModuleType

from implementations.mutants import (
    causal_hides_current_token,
    causal_shows_next_token,
    heads_view_no_transpose,
    mask_after_softmax,
    softmax_query_axis,
)

MUTANT_MODULES: tuple[ModuleType, ...] = (
    softmax_query_axis,
    heads_view_no_transpose,
    mask_after_softmax,
    causal_shows_next_token,
    causal_hides_current_token,
)
