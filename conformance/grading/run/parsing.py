"""One ``ast.parse`` at a time in the checker while a class is graded in threads.

The checker grades submissions in threads (``--jobs``), and Python source is parsed in each:
hypothesis parses a lambda's or a repr's source while a check searches, the grader parses a
submission's files. CPython 3.11 converts a parse to Python objects with a recursion depth kept
in state every thread shares (python/cpython#106905), so two parses at once can end in
``SystemError: AST constructor recursion depth mismatch``. Seen twice on this project's two-core
machines (a grader error on a correct student's ``scale``, a failed CI run): the suite's own
error, never a verdict. While a class is graded, ``ast.parse`` takes a lock; a parse is
milliseconds, a check seconds.
"""

from __future__ import annotations

import ast
import contextlib
import threading
from collections.abc import Iterator

_LOCK = threading.RLock()


@contextlib.contextmanager
def one_parse_at_a_time() -> Iterator[None]:
    """While open, ``ast.parse`` runs in one thread at a time (re-entrant: a parse that parses
    again in its own thread goes on)."""
    original = ast.parse

    def parse(*args, **kwargs):
        with _LOCK:
            return original(*args, **kwargs)

    ast.parse = parse
    try:
        yield
    finally:
        ast.parse = original
