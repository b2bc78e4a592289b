"""A submission loaded in a worker: the requests sent (its names, then its load), and the
replies read, as two steps, so that one process can send a load another process reads (a twin's,
:meth:`Loads.twin`); and a subject's loads (:class:`Loads`): its first, its twins', its
restarts'."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import conformance.worker.codec as codec
from conformance.model.declarations import Declarations
from conformance.model.spec import FIRST
from conformance.worker.errors import LoadError, WorkerError, WorkerStatus
from conformance.worker.limits import WorkerLimits
from conformance.worker.process import Pending, WorkerProcess
from conformance.worker.protocol import Declaration, Failure, LoadReply, LoadRequest
from conformance.worker.sandbox import SandboxKind
from conformance.worker.wire import Frame

Decode = Callable[[WorkerProcess, Frame, str], Any]
"""How a reply's body is read (the subject's, which marks a worker that sent a malformed one)."""


class Launched(NamedTuple):
    """A worker started, and its two load requests in flight."""

    worker: WorkerProcess
    asked: Pending
    """Its names (read from the source, nothing run)."""
    loading: Pending


def chosen(spec: str, declarations: Sequence[Declaration], name: str | None) -> Declaration:
    """The declaration ``name`` picks: the only one (None), the first (``FIRST``), the one of
    that name; LoadError (with the names) where that is not one."""
    names = [d.name for d in declarations]
    if name is None and len(declarations) != 1:
        raise LoadError(WorkerStatus.INTERFACE_MISMATCH,
                        f"{spec} names {len(names)} implementations ({', '.join(names)}): "
                        "choose one with name=", defined_names=names, fatal=False)
    found = [d for d in declarations if name in (None, FIRST) or d.name == name]
    if not found:
        raise LoadError(WorkerStatus.NOT_FOUND,
                        f"{spec} has no implementation named {name!r} ({', '.join(names)})",
                        fatal=False)
    return found[0]


def launch(submission: Path, spec: str, declared: Declarations | None, limits: WorkerLimits,
           sandbox: SandboxKind, in_place: bool, named: str | None = None) -> Launched:
    """Start a worker and send it ``spec`` to load (the implementation ``named`` only, where
    given), without waiting."""
    try:
        worker = WorkerProcess(submission, limits=limits, sandbox=sandbox, in_place=in_place)
    except WorkerError as error:
        raise LoadError(error.status, str(error), fatal=True) from None
    body = codec.encode(LoadRequest(spec, declared, named), [])
    try:
        # The names first: a submission that kills its worker while being imported still gets
        # near-miss suggestions.
        return Launched(worker,
                        worker.submit("names", body, [], timeout=limits.load_seconds,
                                      what="reading the source"),
                        worker.submit("load", body, [], timeout=limits.load_seconds,
                                      what="load"))
    except WorkerError as error:
        raise not_loaded(worker, spec, error, ()) from None


def read(launched: Launched, spec: str, decode: Decode) -> LoadReply:
    """What the worker ``launch`` started loaded; :class:`LoadError` (the worker stopped) where it
    did not."""
    worker, names = launched.worker, ()
    try:
        frame = worker.reply(launched.asked)
        if frame.header["ok"]:
            names = decode(worker, frame, "names")
        frame = worker.reply(launched.loading)
        if frame.header["ok"]:
            # A declaration the checker can't read (a hand-written Capabilities with a wrong
            # type, or a forged reply) is malformed like any other reply.
            return decode(worker, frame, "load")
    except WorkerError as error:
        raise not_loaded(worker, spec, error, names) from None
    failure = failure_of(frame)
    worker.close()
    raise LoadError(failure.status or WorkerStatus.INTERFACE_MISMATCH, failure.message,
                    defined_names=failure.defined_names, fatal=False,
                    output=worker.printed(), remedy=failure.remedy)


def failure_of(frame: Frame) -> Failure:
    """The failure a reply carries (a malformed one is the worker's protocol error)."""
    try:
        return codec.decode(frame.header.get("failure"), Failure, frame.tensors, "failure")
    except codec.CodecError as error:
        return Failure("status", f"the worker sent a malformed failure: {error}",
                       WorkerStatus.PROTOCOL_ERROR)


def not_loaded(worker: WorkerProcess, spec: str, error: WorkerError,
               names: tuple[str, ...]) -> LoadError:
    """The LoadError of a worker that failed while loading ``spec`` (stopped here)."""
    worker.close()
    return LoadError(error.status, f"loading {spec}: {error}", defined_names=names,
                     fatal=True, output=worker.printed())


_DECLARED = frozenset({"declaration", "declarations", "capabilities", "notes",
                       "expected_failures"})
"""What a subject knows from its load (a twin asked for an implementation by name: once read)."""


class Loads:
    """How an isolated subject's workers load its submission: its first, its twins' (another
    worker for the same implementation, or for another one its spec names) and its restarts'.
    Mixed into :class:`~conformance.worker.subject.IsolatedSubject`, whose state it reads."""

    def twin(self, name: str | None = None) -> Loads | None:
        """This implementation in a worker of its own (or the one called ``name`` of those its
        spec names, which that worker loads alone: what it declares is that load's, read where
        first needed), its load sent and not waited for (:meth:`ready` waits, in the process
        that uses it); None where none starts."""
        twin = object.__new__(type(self))
        twin.submission, twin.spec, twin.in_place = self.submission, self.spec, self.in_place
        twin._configure(self.limits, self.sandbox, self._declared, self._timeout)
        twin._defined_names, twin.name = self._defined_names, name or self.name
        if name is None:
            for kept in (*_DECLARED, "expected_warnings"):
                setattr(twin, kept, getattr(self, kept))
        try:
            twin._launched = twin._launch(self._spares.pop() if self._spares and name is None
                                          else None)
        except LoadError:
            twin.close()
            return None
        return twin

    def ready(self) -> bool:
        try:
            self.loaded()  # a twin asked for an implementation by name: what its load declares
        except LoadError:
            return False
        launched, self._launched = self._launched, None
        if launched is None:
            return self._worker is not None
        try:
            return self._same(self._loaded(launched))
        except LoadError:
            return False

    def loaded(self) -> None:
        """Wait for the load of a twin asked for an implementation by name (:meth:`twin`), and
        take what it declares; LoadError (its workers stopped) where it failed."""
        if "declaration" in self.__dict__ or self._launched is None:
            return
        launched, self._launched = self._launched, None
        try:
            declarations = self._loaded(launched)
            declaration = chosen(self.spec, declarations, self.name)
        except LoadError:
            self.close()
            raise
        self.declarations = tuple(declarations)
        self._declare(declaration)

    def __getattr__(self, attribute: str) -> object:
        # Only where an attribute is missing: a twin's declaration, before its load is read.
        if attribute in _DECLARED and self.__dict__.get("_launched") is not None:
            self.loaded()
            return getattr(self, attribute)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attribute!r}")

    def _same(self, declarations: Sequence[Declaration]) -> bool:
        """Whether ``declarations``, from a worker that loaded the submission again, declare
        this implementation as the first did."""
        again = {d.name: d for d in declarations}.get(self.name)
        return again is not None and codec.encode(again, []) == codec.encode(self.declaration, [])

    def _launch_spare(self) -> Launched:
        """A worker loading the submission, for a twin."""
        return launch(self.submission, self.spec, self._declared, self.limits, self.sandbox,
                      self.in_place, self.name)

    def _launch(self, launched: Launched | None = None) -> Launched:
        """``launched`` (default: a new worker loading the submission), made this subject's."""
        launched = launched or self._launch_spare()
        self._workers.append(launched.worker)
        self._worker = launched.worker
        return launched

    def _loaded(self, launched: Launched) -> tuple[Declaration, ...]:
        try:
            reply = read(launched, self.spec, self._body)
        except LoadError:
            self._worker = None
            raise
        self._defined_names, self.others = reply.defined_names, reply.others
        return reply.implementations
