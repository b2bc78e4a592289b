"""The length inference's probes are made at: the one a module takes where it takes one.

A module that takes a single input length (Swin's window attention: the Wh * Ww tokens of one
window) can't be probed at the lengths the probes prefer (6 tokens for a mask, 8 for a window,
11 for the weights). While its inference runs, :func:`fixed_probe_length` holds that length, and
every probe's case and inputs are made at it (:func:`probe_length`, :func:`fitted`): each probe
still asks for its own length, the module's contract decides, once, here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.generation.cases import Case

_FIXED: ContextVar[int | None] = ContextVar("fixed_probe_length", default=None)


@contextlib.contextmanager
def fixed_probe_length(length: int | None) -> Iterator[None]:
    """Every probe made inside is made at ``length`` tokens (None: at its own)."""
    token = _FIXED.set(length)
    try:
        yield
    finally:
        _FIXED.reset(token)


def probe_length(preferred: int) -> int:
    """The length of a probe that prefers ``preferred`` tokens."""
    fixed = _FIXED.get()
    return preferred if fixed is None else fixed


def fitted(case: Case) -> Case:
    """``case`` at the probes' length: queries and keys alike, no more keys kept than there
    are (a module that takes one length is a self-attention one)."""
    fixed = _FIXED.get()
    return case if fixed is None else case.at_length(fixed)
