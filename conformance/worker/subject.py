"""``IsolatedSubject``: the suite's boundary, answered by a worker process.

The catalogue runs unchanged on an :class:`IsolatedSubject` (``Runner(profile).run(subject)``):
every check builds instances, calls them and reads their weights through the abstract
:class:`~conformance.subject.boundary.Subject` / :class:`~conformance.subject.boundary.Instance`
methods, each of which is one request to the worker, and computes its verdict here, with this
process's torch, from the tensors and plain data that come back. A construction is sent without
waiting for its reply: it travels ahead of the instance's first request, and the worker builds
while this process draws the inputs (see :class:`~conformance.worker.instance.IsolatedInstance`).

When the worker dies (or is killed: a timeout, a flood, a malformed reply), the call in flight
raises :class:`WorkerError` with the status and evidence, as does every instance of that worker,
and the next ``instantiate`` starts a fresh worker (at most ``WorkerLimits.max_restarts`` times).
Within one check (``begin_check``, called by the Runner), a fatal failure makes every later call of
that check fail at once with the same evidence, so replaying and shrinking a hang doesn't cost the
time limit again per example (but in the gate, each feature tried gets its own answer).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import conformance.worker.codec as codec
import conformance.worker.gpu as gpu
from conformance.model.declarations import Declarations
from conformance.model.spec import Config
from conformance.model.target_spec import TargetSpec
from conformance.subject.boundary import (
    CHECK_RANDOM_STATE,
    CapabilityError,
    ImplementationError,
    Instance,
    Subject,
)
from conformance.worker.errors import LoadError, WorkerError, WorkerStartError, WorkerStatus
from conformance.worker.instance import IsolatedInstance
from conformance.worker.limits import WorkerLimits
from conformance.worker.process import Pending, WorkerProcess
from conformance.worker.protocol import REQUESTS, BuildRequest, Declaration, WorkerState, check_spec
from conformance.worker.sandbox import SandboxKind
from conformance.worker.sandbox import available as available_sandboxes
from conformance.worker.submission_load import FIRST, Launched, Loads, chosen, failure_of

TimeoutPolicy = Callable[[str, "Config | None"], float]
"""``(operation, config of the instance or None) -> seconds`` for one request."""


class IsolatedSubject(Loads, Subject):
    """An implementation in a submission, checked in a sandboxed worker process.

    Args:
        submission: the submission's directory (or a single ``.py`` file); the worker works on
            a scratch copy of it.
        spec: ``path/file.py::Attr`` or ``package.module:Attr`` relative to the submission; an
            undeclared ``nn.Module`` class is inferred in the worker.
        name: which implementation, when ``spec`` names several (the worker loads it alone);
            ``FIRST``: the first of them (the others: :meth:`twin` with their declaration).
        declared: declarations overriding inference (as ``--width-arg`` etc.).
        limits: resource limits (:class:`WorkerLimits`).
        sandbox: ``"auto"`` (the strongest that works here), ``"filesystem"`` (Landlock where it
            has bubblewrap's namespaces, else bubblewrap, else Landlock alone;
            :class:`SandboxUnavailable` without either), ``"bwrap"``, ``"landlock"``,
            ``"unshare"``, ``"none"``.
        expected_failures: ``{check: reason}``; None takes what the implementation declares
            (pass ``{}`` for untrusted submissions: they must not excuse their own failures).
        timeout: seconds per request, or a policy ``(operation, config) -> seconds``; default
            ``limits.request_seconds``.
        in_place: run on ``submission`` itself, not a scratch copy (a user's own code, checked
            for containment: hangs, crashes, exits); the sandbox is then at most ``unshare``.
        twins: how many more workers load it at once, for :meth:`twin` to take.

    Raises :class:`LoadError` (with the status and the names the module defines) when the
    submission can't be loaded.
    """

    FIRST = FIRST

    def __init__(self, submission: str | Path, spec: str, *, name: str | None = None,
                 declared: Declarations | None = None, limits: WorkerLimits | None = None,
                 sandbox: SandboxKind = "auto", expected_failures: Mapping[str, str] | None = None,
                 timeout: float | TimeoutPolicy | None = None, in_place: bool = False,
                 twins: int = 0) -> None:
        check_spec(spec)
        self.submission = Path(submission)
        self.in_place = in_place
        if in_place and sandbox == "auto":
            # Containment only (a user's own code): the strongest tier that runs it in place.
            sandbox = "unshare" if "unshare" in available_sandboxes() else "none"
        target = TargetSpec.parse(spec)
        if target.file is not None:  # a missing file needs no worker to say so
            file = target.location
            where = (self.submission.parent if self.submission.is_file() else self.submission)
            if not (where / file).is_file() or (self.submission.is_file()
                                                and file != self.submission.name):
                raise LoadError(WorkerStatus.NOT_FOUND, f"no file {file} in the submission",
                                fatal=False)
        self.spec, self.name = spec, name
        self._configure(limits or WorkerLimits(), sandbox, declared, timeout)
        launched = self._launch()
        try:
            # The twins' loads beside this one's: on other cores, they cost no time here.
            self._spares += [self._launch_spare() for _ in range(twins)]
            declarations = self._loaded(launched)
            declaration = chosen(spec, declarations, name)
        except LoadError:
            self.close()
            raise
        self.declarations: tuple[Declaration, ...] = tuple(declarations)
        self._declare(declaration, expected_failures)

    def _declare(self, declaration: Declaration,
                 expected_failures: Mapping[str, str] | None = None) -> None:
        self.declaration, self.name = declaration, declaration.name
        self.capabilities, self.notes = declaration.capabilities, declaration.notes
        self.expected_failures = dict(declaration.expected_failures
                                      if expected_failures is None else expected_failures)

    def _configure(self, limits: WorkerLimits, sandbox: SandboxKind, declared: Declarations | None,
                   timeout: float | TimeoutPolicy | None) -> None:
        """The state of a subject with no worker yet (a new one's, or a twin's)."""
        self.limits = limits
        self.sandbox = sandbox
        self._declared = declared
        self._timeout = timeout
        self._launched: Launched | None = None
        self._lock = threading.RLock()
        self._released: list[tuple[WorkerProcess, int]] = []
        self._check: str | None = None
        self._poison: WorkerError | None = None
        self._fresh = False
        self.restarts = 0
        self.failures: list[tuple[str | None, WorkerError]] = []
        """Every fatal failure, with the check it happened in (None outside checks)."""
        self.incidents: list[tuple[str | None, WorkerError]] = []
        """Every failure with a status, fatal or not (a worker that survived running out of
        memory, or a forward that called sys.exit, too), with its check: what a grader reads."""
        self._worker: WorkerProcess | None = None
        self._workers: list[WorkerProcess] = []
        self._built = 0
        """Instances numbered so far (numbered here: requests may follow a build before its reply)."""
        self._spares: list[Launched] = []
        """Workers loading the submission that no twin has taken yet (stopped with this)."""
        self._finalizer = weakref.finalize(self, IsolatedSubject._stop_all, self._workers,
                                           self._spares)

    # What the grader reads.

    @property
    def protections(self) -> tuple[str, ...]:
        """The protections active for the current worker (for a run's header)."""
        worker = self._worker or (self._workers[-1] if self._workers else None)
        return worker.protections if worker is not None else ()

    @property
    def defined_names(self) -> tuple[str, ...]:
        return self._defined_names

    @property
    def output(self) -> str:
        """What the workers printed outside forward calls (import time, fd-level writes), capped
        per worker; for the teacher's eyes."""
        return "\n".join(text for text in (w.printed() for w in self._workers) if text)

    @property
    def printed_bytes(self) -> int:
        """How many bytes the workers printed in all (``output`` keeps the first of each)."""
        return sum(w.output_total for w in self._workers)

    def state(self) -> WorkerState:
        """The current worker's live instances and peak memory (one request)."""
        with self._lock:
            return self.call(self._live_worker(), "state", None, [], None, "reporting its state")

    def describe(self) -> str:
        layout = self.declaration.weight_layout
        return self.capabilities.describe() + (f"; {layout}" if layout is not None else "")

    # Workers (their loads: :class:`~conformance.worker.submission_load.Loads`).

    def _live_worker(self) -> WorkerProcess:
        if self._launched is not None and not self.ready():
            raise WorkerError(WorkerStatus.INTERFACE_MISMATCH, "loaded again, the submission "
                              "did not declare the same", fatal=True)
        if self._worker is not None and self._worker.dead is None:
            return self._worker
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        if self.restarts >= self.limits.max_restarts:
            last = next((error for _, error in reversed(self.failures)
                         if error.status is not WorkerStatus.RESTART_LIMIT), None)
            raise WorkerError(WorkerStatus.RESTART_LIMIT,
                              f"the worker died {self.restarts + 1} times; not started again"
                              + (f" (last: {last})" if last else ""), fatal=True)
        self.restarts += 1
        try:
            declarations = self._loaded(self._launch())  # a new worker's
        except (LoadError, WorkerStartError) as error:
            raise WorkerError(error.status, f"restarting the worker failed: {error}",
                              fatal=True) from None
        if not self._same(declarations):
            self._worker.close()
            self._worker = None
            raise WorkerError(WorkerStatus.INTERFACE_MISMATCH,
                              "loaded again, the submission declared something else", fatal=True)
        return self._worker

    def begin_check(self, name: str) -> None:
        with self._lock:
            self._check = name
            self._poison = None
            self._fresh = True  # the next build starts the worker's random state afresh

    def instantiate(self, config: Config, seed: int) -> Instance:
        """The construction is sent without waiting for it: the worker builds while this
        process goes on (drawing the inputs), and a constructor's error is raised by the
        instance's first request, or by its ``settle()``."""
        with self._lock:
            if self._poison is not None:
                raise self._poison.again()
            try:
                worker = self._live_worker()
            except WorkerError as error:
                self._fatal(error)
                raise
            self._built += 1
            request = BuildRequest(self.name, config, seed, self._built,
                                   CHECK_RANDOM_STATE if self._fresh else None)
            self._fresh = False
            pending = self.submit(worker, "build", request, [], config, "constructing it")
            return IsolatedInstance(self, worker, self._built, config, pending)

    # Requests.

    def timeout(self, op: str, config: Config | None) -> float:
        """Seconds allowed for one request (see ``timeout=``; on a GPU: ``gpu.request_seconds``)."""
        seconds = (self._timeout(op, config) if callable(self._timeout) else
                   self._timeout if self._timeout is not None else self.limits.request_seconds)
        return gpu.request_seconds(float(seconds), self.limits, config)

    def call(self, worker: WorkerProcess, op: str, request: Any, tensors: Sequence[torch.Tensor],
             config: Config | None, what: str) -> Any:
        """One request to ``worker``; the decoded reply, or the failure raised."""
        with self._lock:
            return self.collect(worker, self.submit(worker, op, request, tensors, config, what), op)

    def submit(self, worker: WorkerProcess, op: str, request: Any,
               tensors: Sequence[torch.Tensor], config: Config | None, what: str) -> Pending:
        """Send one request to ``worker`` without waiting (:meth:`collect` reads the reply)."""
        with self._lock:
            if self._poison is not None:
                raise self._poison.again()
            if worker.dead is not None:
                raise worker.dead.again()
            tensors = list(tensors)
            body = codec.encode(request, tensors)
            release = [number for owner, number in self._released if owner is worker]
            self._released = [(owner, n) for owner, n in self._released
                              if owner is not worker and owner.dead is None]
            try:
                return worker.submit(op, body, tensors, timeout=self.timeout(op, config),
                                     what=what, release=release)
            except WorkerError as error:
                self._fatal(error)
                raise

    def collect(self, worker: WorkerProcess, pending: Pending, op: str) -> Any:
        """The decoded reply to ``pending`` (an ``op`` request), or its failure raised."""
        with self._lock:
            try:
                frame = worker.reply(pending)
            except WorkerError as error:
                self._fatal(error)
                raise
            if not frame.header["ok"]:
                failure = failure_of(frame)
                if failure.kind == "capability":
                    raise CapabilityError(failure.message)
                if failure.kind == "implementation":
                    raise ImplementationError(failure.message)
                error = WorkerError(failure.status or WorkerStatus.WORKER_ERROR,
                                    failure.message, fatal=False)
                self.incidents.append((self._check, error))
                raise error
            return self._body(worker, frame, op)

    def _body(self, worker: WorkerProcess, frame, op: str) -> Any:
        try:
            return codec.decode(frame.header.get("body"), REQUESTS[op][1], frame.tensors, op)
        except codec.CodecError as error:
            worker.dead = WorkerError(WorkerStatus.PROTOCOL_ERROR,
                                      f"the worker's reply to {op} is malformed: {error}",
                                      fatal=True)
            worker.stop()
            self._fatal(worker.dead)
            raise worker.dead from None

    FAIL_FAST_EXEMPT: tuple[str, ...] = ("gate",)
    """Checks whose calls each deserve their own answer: the gate tries every declared feature
    once (no shrinking), so a feature that hangs must not take the next feature down with it."""

    def _fatal(self, error: WorkerError) -> None:
        if not error.fatal:
            return
        self.failures.append((self._check, error))
        self.incidents.append((self._check, error))
        if self._check is not None and self._check not in self.FAIL_FAST_EXEMPT:
            self._poison = error

    def release(self, worker: WorkerProcess, number: int) -> None:
        """Free instance ``number`` with the next request to ``worker`` (a finalizer sends none)."""
        if worker.dead is None:
            self._released.append((worker, number))

    # Stopping.

    def let_go(self) -> None:  # each worker stops once no process holds it; close() waits
        for worker in self._workers:
            worker.let_go()

    def close(self) -> None:
        """Stop every worker (and everything they started); delete the scratch copies."""
        self._finalizer()
        self._worker = None

    @staticmethod
    def _stop_all(workers: list[WorkerProcess], spares: list[Launched]) -> None:
        for worker in [*workers, *(spare.worker for spare in spares)]:
            worker.close()

    def __enter__(self) -> IsolatedSubject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
