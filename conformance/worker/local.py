"""A user's own implementation checked in a worker process: containment for ``check --isolate``.

The grader isolates untrusted submissions; here the code is the user's, and what matters is that
nothing it does stops the run: a forward that never returns (a Python loop or one inside a C++
op alike: the worker is killed, not signalled), a segfault, an ``os._exit``, runaway memory.
The worker runs in place on the user's folder (no copy of their project), with the time limit of
each call scaled to the size of the case.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

from conformance.model.declarations import Declarations
from conformance.model.spec import Config
from conformance.model.target_spec import TargetSpec
from conformance.worker import gpu
from conformance.worker.limits import WorkerLimits
from conformance.worker.subject import IsolatedSubject

CALL_SECONDS = 10.0
"""Default limit of one call (build, forward, backward) at the largest generated sizes: the
suite's cases run in milliseconds, so this is a thousand times what a working call needs."""

REFERENCE_WORK = 4 * 33 * 33 * 128 + 4 * 33 * 128 * 128
"""The work of a forward at the largest generated case (batch 4, length 33, width 128):
attention core plus projections, in multiply-adds. Larger cases get proportionally longer."""

LOAD_CALLS = 6
"""Loading (importing, and inferring the interface: building the module and calling it a few
dozen times) may take this many call limits."""

RESTARTS = 1000
"""A user's own code may hang at one shape in every check: each check gets a fresh worker (a
second each), never "not started again"."""

AFTER_A_HANG = 50
"""Once a call has hung, later calls may take this many times the median call (no less than
AFTER_A_HANG_FLOOR): a hang at one shape should not cost the full limit again in every check."""

AFTER_A_HANG_FLOOR = 5.0
"""Seconds a call may always take after a hang: a busy machine's slow call is not a hang."""

COMPILE_MARGIN = 3.0
"""After a hang, a request on a CUDA device may take this many times the longest call seen (a
first call's compile among them) instead of the whole compile allowance
(``WorkerLimits.compile_seconds``, 300 s): otherwise every request that hangs on CUDA costs the
full allowance, in every check. Where no call has ended yet, the allowance stays whole."""


class CallLimits:
    """Seconds allowed for one request: the configured limit, scaled up for cases larger than
    the generated ones (``REFERENCE_WORK``), 3x for a backward pass; after a timeout, tightened
    to ``AFTER_A_HANG`` times the median call seen (the implementation has shown it can hang),
    except for the first call of a fresh worker (its first calls warm torch up); on CUDA, no less
    than :meth:`compile_allowance`."""

    def __init__(self, seconds: float = CALL_SECONDS) -> None:
        self.seconds = seconds
        self.hung = False
        self.fresh = True
        self._durations: list[float] = []
        self._longest = 0.0
        self._lock = threading.Lock()

    def __call__(self, operation: str, config: Config | None) -> float:
        limit = self.seconds
        if config is not None:
            work = (config.batch * config.q_len * config.kv_len * config.d_model
                    + config.batch * config.q_len * config.d_model ** 2)
            limit *= max(1.0, work / REFERENCE_WORK)
        if operation == "gradients":
            limit *= 3
        with self._lock:
            if self.hung and self._durations and not self.fresh:
                limit = min(limit, max(AFTER_A_HANG_FLOOR,
                                       AFTER_A_HANG * statistics.median(self._durations)))
        return limit

    def record(self, seconds: float, timed_out: bool) -> None:
        with self._lock:
            self.fresh = False
            if timed_out:
                self.hung = True
            else:
                self._durations.append(seconds)
                del self._durations[:-256]
                self._longest = max(self._longest, seconds)

    def compile_allowance(self, allowance: float) -> float:
        """The least a request on CUDA is allowed (it may compile): ``allowance`` until a call
        has hung; then ``COMPILE_MARGIN`` times the longest call that ended (no more than
        ``allowance``), where one did."""
        with self._lock:
            if not self.hung or self._longest <= 0:
                return allowance
            return min(allowance, COMPILE_MARGIN * self._longest)


class TimedSubject(IsolatedSubject):
    """An IsolatedSubject whose requests feed :class:`CallLimits` their durations."""

    _last_worker: object = None

    def twin(self, name: str | None = None) -> TimedSubject | None:
        twin = super().twin(name)
        if twin is not None and isinstance(self._timeout, CallLimits):
            twin._timeout = CallLimits(self._timeout.seconds)  # its worker's calls, not ours
        return twin

    def timeout(self, op: str, config: Config | None) -> float:
        if not isinstance(self._timeout, CallLimits):
            return super().timeout(op, config)
        return gpu.request_seconds(self._timeout(op, config), self.limits, config,
                                   self._timeout.compile_allowance(self.limits.compile_seconds))

    def submit(self, worker, op, request, tensors, config, what):
        if worker is not self._last_worker and isinstance(self._timeout, CallLimits):
            self._last_worker = worker
            self._timeout.fresh = True
        return super().submit(worker, op, request, tensors, config, what)

    def collect(self, worker, pending, op):
        try:
            reply = super().collect(worker, pending, op)
        except Exception as error:
            status = str(getattr(getattr(error, "status", ""), "value", ""))
            if isinstance(self._timeout, CallLimits):
                seconds = (pending.seconds if pending.seconds is not None
                           else time.monotonic() - pending.sent)
                self._timeout.record(seconds, timed_out=status == "timeout")
            raise
        if isinstance(self._timeout, CallLimits):
            self._timeout.record(pending.seconds, timed_out=False)
        return reply


def isolated(spec: str, declared: Declarations | None = None, *, name: str | None = None,
             call_seconds: float = CALL_SECONDS,
             expected_failures: dict[str, str] | None = None, twins: int = 0,
             accelerators: bool = False) -> IsolatedSubject:
    """The implementation an IMPL string names (``path/file.py::Attr`` or ``pkg.module:Attr``),
    in a worker running in place: a file from its own folder, a module from the current one.
    ``twins``: how many more workers load it at once (see :meth:`IsolatedSubject.twin`);
    ``accelerators``: it may use the machine's GPU (``WorkerLimits.accelerators``).
    Raises the worker's LoadError when it can't be loaded."""
    target = TargetSpec.parse(spec)
    if target.file is not None:
        path = target.file.resolve()
        directory, worker_spec = path.parent, f"{path.name}::{target.attribute}"
    else:
        directory, worker_spec = Path.cwd(), spec
    limits = WorkerLimits(request_seconds=call_seconds, load_seconds=LOAD_CALLS * call_seconds,
                          lifetime_seconds=24 * 3600.0, cpu_seconds=24 * 3600,
                          max_restarts=RESTARTS, accelerators=accelerators)
    return TimedSubject(directory, worker_spec, name=name, declared=declared, limits=limits,
                        expected_failures=expected_failures, timeout=CallLimits(call_seconds),
                        in_place=True, twins=twins)


def open_all(spec: str, declared: Declarations | None = None, *,
             call_seconds: float = CALL_SECONDS, twins: int = 0,
             accelerators: bool = False) -> list[IsolatedSubject]:
    """Every implementation ``spec`` names (a list of declared ones, or each kind of attention
    layer in a model), each in a worker of its own (and ``twins`` more for the first). The first
    worker loads the first (a model's first kind alone: it names the others); each other one is
    loaded alone in its own worker, sent at once and read where first needed (so they load while
    the first is checked: a failed one raises LoadError then, see
    :meth:`~conformance.worker.submission_load.Loads.loaded`); ``accelerators``: the workers may
    use the machine's GPU. Raises the worker's LoadError when the module can't be loaded."""
    first = isolated(spec, declared, name=IsolatedSubject.FIRST, call_seconds=call_seconds,
                     twins=twins, accelerators=accelerators)
    subjects = [first]
    for name in [d.name for d in first.declarations[1:]] + list(first.others):
        # Where no twin starts, a load of its own says why.
        subjects.append(first.twin(name) or isolated(
            spec, declared, name=name, call_seconds=call_seconds, accelerators=accelerators))
    return subjects
