"""The suite's searches draw their examples from the strategies alone, never from source code.

Hypothesis (6.13x and later) mixes in integers, floats and strings it finds as literals in the
"local" modules loaded in the process (those outside site-packages and the standard library).
For a conformance suite that makes the examples, and so the verdicts, depend on where the suite
is installed (an editable checkout is local, a wheel is not) and on the user's own code loaded
beside it. :func:`strategies_only` turns that off for the duration of a search; it is a counted,
locked swap, so searches running in several threads (grading) share it safely.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

try:  # the private hook this relies on; without it there is nothing to turn off
    from hypothesis.internal.conjecture import providers as _providers
    from hypothesis.internal.constants_ast import Constants as _Constants
except ImportError:  # pragma: no cover
    _providers = None

_lock = threading.Lock()
_depth = 0
_saved = None


def _no_constants():
    return _EMPTY


_EMPTY = _Constants() if _providers is not None else None


@contextlib.contextmanager
def strategies_only() -> Iterator[None]:
    """Within this block, hypothesis draws no constants from the loaded modules' source."""
    global _depth, _saved
    if _providers is None or not hasattr(_providers, "_get_local_constants"):
        yield
        return
    with _lock:
        if _depth == 0:
            _saved = _providers._get_local_constants
            _providers._get_local_constants = _no_constants
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _providers._get_local_constants = _saved
                _saved = None
