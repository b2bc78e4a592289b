"""One implementation's checks shared out over this process and forks of it.

After the gates (run here first: every check needs its device's, and a failed one blocks the
rest), the checks are queued in a pipe, by index, longest first (:data:`SLOWEST_FIRST`); this
process and each fork take them from it one at a time, so a long check never leaves the others
waiting behind it. A fork checks through a twin of the subject
(:meth:`~conformance.subject.boundary.Subject.twin`: an isolated implementation's is a worker of
its own, loaded while the gates ran; an in-process one is the fork's copy) and sends each verdict
back as it is reached; the verdicts come out in the order asked for. A check a fork took and
did not answer (it died) is run here again.

The verdicts don't depend on the number of processes: each check's search is its own (seeded by
itself), and what checks share is settled before the fork (the gates) or is the same whichever
check finds it (the configurations found refused, :mod:`conformance.checks.invariants.limits`).

A fork is made only where that is safe: this process runs one Python thread (a fork copies only
the calling thread, and a lock another one held would never be released; torch's idle intra-op
threads hold none), CUDA has not started here (a fork can't use it), and the platform forks.
Otherwise, or where no twin starts, the checks run here one after another.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import select
import signal
import struct
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn, Protocol

import torch

from conformance.checks.catalogue import GATE
from conformance.model.results import CheckResult
from conformance.subject.boundary import Subject

Pair = tuple[str, str]
"""``(device, check)``."""

INDEX = struct.Struct("<H")
"""A queued check, as its index: two bytes, read whole from a pipe by one reader at a time."""

LENGTH = struct.Struct("<I")
"""The length of a verdict a fork sends (a pickle of ``(index, CheckResult)``)."""

PIPE_BYTES = 1 << 20
"""A fork's verdicts pipe is made this large (where Linux allows), so that a fork seldom waits
for this process to finish a check before it can send one."""

NOT_READY = 3
"""A fork's exit code when its twin is not ready: it took no check."""

SLOWEST_FIRST: tuple[str, ...] = (
    "low_precision", "fully_masked", "sliding_window", "chunked", "dropout", "causal", "stability",
    "padding", "reference", "batch_independence", "head_split", "kv_cache", "autograd",
    "contract", "kv_groups", "determinism", "scale", "row_stochastic", "alibi", "packed",
    "path_agreement", "permutation", "position_shift", "configuration", "mask_formats",
    "kernel",
)
"""The order the checks past the gate are queued in: their mean time where they ran, longest
first (the 40 collected classes, ``benchmarks/check_end_to_end.py --served`` on a 2-core machine,
2026-11-27; ``chunked``, which none of them has, beside ``sliding_window``, its like). The
process that takes the last check is the one the other waits for, so the short ones go last; a
check not listed goes after these. The order changes no verdict (each check's
search is its own)."""

_QUEUE_RANK = {name: rank for rank, name in enumerate(SLOWEST_FIRST)}


class Checker(Protocol):
    """What shares the checks out: the :class:`~conformance.run.runner.Runner`."""

    progress: object | None

    def run_check(self, subject: Subject, name: str, device: str) -> CheckResult: ...

    def runs_checks(self, subject: Subject, device: str) -> bool: ...


def forkable() -> bool:
    """Whether this process may fork to check (see the module's docstring)."""
    return (hasattr(os, "fork") and threading.active_count() == 1
            and not torch.cuda.is_initialized())


def wanted(processes: int, names: Sequence[str]) -> int:
    """How many twins checks ``names`` over ``processes`` processes can use: none for fewer
    than two checks past the gate (nothing to share), or where no fork is safe."""
    past_gate = sum(name != GATE.name for name in names)
    return processes - 1 if processes > 1 and past_gate > 1 and forkable() else 0


def twins(subject: Subject, count: int) -> list[Subject]:
    """Up to ``count`` twins of ``subject`` (see :func:`wanted`), their load under way (fewer
    where one does not start)."""
    found: list[Subject] = []
    for _ in range(count):
        twin = subject.twin()
        if twin is None:
            break
        found.append(twin)
    return found


def run(checker: Checker, subject: Subject, pairs: Sequence[Pair],
        twins: Sequence[Subject]) -> list[CheckResult]:
    """The verdicts of ``pairs`` on ``subject``, in their order, shared out with a fork per twin
    (the caller closes the twins)."""
    results: dict[int, CheckResult] = {}
    for index, (device, name) in enumerate(pairs):
        if name == GATE.name:
            results[index] = checker.run_check(subject, name, device)
    queued = sorted((i for i in range(len(pairs)) if i not in results),
                    key=lambda i: _QUEUE_RANK.get(pairs[i][1], len(_QUEUE_RANK)))
    searching = [i for i in queued if checker.runs_checks(subject, pairs[i][0])]
    if len(searching) < 2 or not twins or not forkable():
        for index in queued:
            results[index] = checker.run_check(subject, pairs[index][1], pairs[index][0])
        return [results[i] for i in range(len(pairs))]
    queue = _queue(queued)
    forks: dict[int, int] = {}  # verdicts pipe -> pid
    try:
        for twin in twins[:len(searching) - 1]:
            read_end, write_end = os.pipe()
            with contextlib.suppress(OSError):
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            for stream in (sys.stdout, sys.stderr):  # else a fork would print it again
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            pid = os.fork()
            if pid == 0:
                os.close(read_end)
                _fork(checker, twin, pairs, queue, write_end)
            os.close(write_end)
            forks[read_end] = pid
            twin.let_go()
        buffers = {fd: bytearray() for fd in forks}
        tell = getattr(checker.progress, "checked", None)

        def collect(wait: bool) -> None:
            while buffers and (ready := select.select(list(buffers), [], [],
                                                      None if wait else 0)[0]):
                for fd in ready:
                    chunk = os.read(fd, 1 << 16)
                    if not chunk:
                        del buffers[fd]
                        continue
                    buffers[fd] += chunk
                    for index, result in _verdicts(buffers[fd]):
                        results[index] = result
                        if tell is not None:
                            tell(result)
                if not wait:
                    return

        while (index := _take(queue)) is not None:
            results[index] = checker.run_check(subject, pairs[index][1], pairs[index][0])
            collect(wait=False)
        collect(wait=True)
    finally:
        os.close(queue)
        _end(forks)
    for index in queued:  # taken by a fork that did not answer: here, then
        if index not in results:
            results[index] = checker.run_check(subject, pairs[index][1], pairs[index][0])
    return [results[i] for i in range(len(pairs))]


def _queue(indices: Sequence[int]) -> int:
    """A pipe's read end holding ``indices``, its write end closed (at most 8 KiB: a pipe
    holds that without a reader)."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"".join(INDEX.pack(i) for i in indices))
    finally:
        os.close(write_end)
    return read_end


def _take(queue: int) -> int | None:
    """The next queued index, None when the queue is empty."""
    data = os.read(queue, INDEX.size)
    return INDEX.unpack(data)[0] if len(data) == INDEX.size else None


def _verdicts(buffer: bytearray) -> list[tuple[int, CheckResult]]:
    """The whole verdicts in ``buffer``, removed from it."""
    found = []
    while len(buffer) >= LENGTH.size:
        (size,) = LENGTH.unpack_from(buffer)
        if len(buffer) < LENGTH.size + size:
            break
        found.append(pickle.loads(bytes(buffer[LENGTH.size:LENGTH.size + size])))
        del buffer[:LENGTH.size + size]
    return found


def _fork(checker: Checker, twin: Subject, pairs: Sequence[Pair], queue: int,
          out: int) -> NoReturn:
    """A fork's life: checks taken from ``queue`` through ``twin``, their verdicts written to
    ``out``; it ends by ``os._exit`` (nothing of this process's exit is its to run)."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is this process's to act on
        checker.progress = None  # this process draws the progress
        torch.set_num_threads(1)
        if not twin.ready():
            code = NOT_READY
        else:
            while (index := _take(queue)) is not None:
                device, name = pairs[index]
                data = pickle.dumps((index, checker.run_check(twin, name, device)))
                _write_all(out, LENGTH.pack(len(data)) + data)
            code = 0
    finally:
        os._exit(code)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _end(forks: dict[int, int]) -> None:
    """Every fork ended and reaped (killed where it is still at work: Ctrl-C, an error here)."""
    for fd, pid in forks.items():
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(ProcessLookupError):
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)

