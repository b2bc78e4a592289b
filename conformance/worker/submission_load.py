"""A submission loaded in a worker: the requests sent (its names, then its load), and the
replies read, as two steps, so that one process can send a load another process reads (a twin's,
:meth:`~conformance.worker.subject.IsolatedSubject.twin`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import conformance.worker.codec as codec
from conformance.model.declarations import Declarations
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


FIRST = "<first>"
"""The name that asks for the first of the implementations a spec names (see :func:`chosen`)."""


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
