"""Which call of an implementation is under way, kept where a process stopped from outside
leaves it: the sandboxed worker records each forward it starts, in one line, in a small file of
its scratch; the checker reads it after stopping a call that never returned, so a timeout says
which call hung ("the forward with no mask, batch 2, 6 tokens"), not only which request.

Nothing is recorded in a process that was not asked to (the checker's own, a user's pytest).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from conformance.subject.boundary import Inputs

FILE_NAME = ".attention-conformance-in-flight"
"""The file's name in the worker's writable folder."""
LONGEST = 300
"""Bytes of a description kept (one line)."""

_fd: int | None = None


def record_to(path: Path) -> None:
    """Record this process's forward calls in ``path`` from now on (the worker, at its start,
    before any submission runs)."""
    global _fd
    try:
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        _fd = None  # nothing recorded: a timeout says only which request it was


def started(words: str) -> None:
    """``words`` is the call under way (empty: none)."""
    if _fd is None:
        return
    data = words.encode("utf-8", "replace")[:LONGEST]
    try:
        os.pwrite(_fd, data, 0)
        os.ftruncate(_fd, len(data))
    except OSError:
        pass


@contextlib.contextmanager
def under_way(words: str) -> Iterator[None]:
    """While open, ``words`` is the call under way; none once it returns or raises."""
    started(words)
    try:
        yield
    finally:
        started("")


def describe(inputs: Inputs, training: bool) -> str:
    """One call in words: its mask, batch, lengths, causality and mode."""
    batch, q_len = inputs.query.shape[:2]
    kv_len = inputs.key.shape[1]
    mask = "no mask" if inputs.keep is None else "a mask"
    tokens = f"{q_len} tokens" if q_len == kv_len else f"{q_len} queries over {kv_len} keys"
    extra = "".join(part for part, on in ((", causal", inputs.causal),
                                          (", through its KV cache", inputs.cache),
                                          (", in train mode", training)) if on)
    return f"the forward with {mask}, batch {batch}, {tokens}{extra}"


def read(path: Path) -> str:
    """What a stopped process recorded as under way ("" where nothing was)."""
    try:
        return path.read_bytes()[:LONGEST].decode("utf-8", "replace").strip()
    except OSError:
        return ""
