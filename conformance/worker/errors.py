"""How an isolated implementation failed: a status, and one line of evidence.

Every failure of the worker process (it exited, crashed, hung, ran out of memory, sent
garbage) reaches the checks as a :class:`WorkerError`, an
:class:`~conformance.subject.boundary.ImplementationError`, so the check in flight fails with that evidence
and the run goes on.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from conformance.errors import ConformanceError
from conformance.model.remedies import Remedy
from conformance.model.status import LoadProblem
from conformance.subject.boundary import ImplementationError


class WorkerStatus(str, Enum):
    """Why an isolated implementation could not be loaded or called."""

    SYNTAX_ERROR = LoadProblem.SYNTAX_ERROR.value
    """The submission does not parse."""
    IMPORT_ERROR = LoadProblem.IMPORT_ERROR.value
    """Importing it raised (a missing dependency, an exception at import time)."""
    NOT_FOUND = LoadProblem.NOT_FOUND.value
    """The named file, module or attribute does not exist."""
    INTERFACE_MISMATCH = LoadProblem.INTERFACE_MISMATCH.value
    """It exists but is not checkable: not an attention module, or its interface can't be inferred."""
    MISSING_PACKAGE = LoadProblem.MISSING_PACKAGE.value
    """It imports a third-party package the environment lacks (not a module of its own)."""
    TIMEOUT = "timeout"
    """A request, the start-up or the worker's lifetime ran past its wall-clock limit."""
    CRASHED = "crashed"
    """The worker was killed by a signal (segfault, abort, ...)."""
    EXITED = "exited"
    """The worker exited (``os._exit``, ``sys.exit``) or tried to."""
    OUT_OF_MEMORY = "out of memory"
    """An allocation failed under the memory limit."""
    CPU_LIMIT = "cpu limit"
    """The worker used up its CPU seconds."""
    PROTOCOL_ERROR = "protocol error"
    """The worker sent something that is not a well-formed reply."""
    WORKER_ERROR = "worker error"
    """The worker's own code failed (e.g. after the submission patched what it relies on)."""
    RESTART_LIMIT = "restart limit"
    """The worker died too often; it is not started again."""


FATAL = frozenset({WorkerStatus.TIMEOUT, WorkerStatus.CRASHED, WorkerStatus.OUT_OF_MEMORY,
                   WorkerStatus.CPU_LIMIT, WorkerStatus.PROTOCOL_ERROR,
                   WorkerStatus.RESTART_LIMIT})
"""Statuses after which the worker is gone (or is killed): its instances are dead."""


class WorkerError(ImplementationError):
    """A call to an isolated implementation failed with ``status``; ``str()`` is the evidence.

    ``fatal``: the worker died or was killed, so every instance it held is gone.
    """

    def __init__(self, status: WorkerStatus, message: str, *, fatal: bool | None = None,
                 repeated: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fatal = status in FATAL if fatal is None else fatal
        self.repeated = repeated
        """Raised again for a later call, without running it (the worker is dead, or its check
        already failed this way): evidence about an earlier call, not about this one."""

    def again(self) -> WorkerError:
        """A fresh error with the same status and evidence, to raise once more for a call that
        is not run (raising one exception object over and over would grow its traceback)."""
        return WorkerError(self.status, self.message, fatal=self.fatal, repeated=True)


class LoadError(WorkerError):
    """The submission could not be loaded; ``defined_names`` are the classes and functions its
    target module defines (read from the source, never run), for near-miss suggestions;
    ``output`` what the worker printed meanwhile (capped), for the teacher; ``remedy`` what
    to declare, where inference could not settle its interface."""

    def __init__(self, status: WorkerStatus, message: str, *,
                 defined_names: Sequence[str] = (), fatal: bool | None = None,
                 output: str = "", remedy: Remedy | None = None) -> None:
        super().__init__(status, message, fatal=fatal)
        self.defined_names = tuple(defined_names)
        self.output = output
        self.remedy = remedy


class WorkerStartError(ConformanceError):
    """The worker process could not start (before anything of the submission ran): this
    machine's or this installation's problem, never the implementation's; one line, with the
    last line the worker printed."""

    def __init__(self, status: WorkerStatus, message: str, printed: str = "") -> None:
        last = next((line.strip() for line in reversed(printed.splitlines()) if line.strip()), "")
        super().__init__(f"the worker process could not start here, before anything of the "
                         f"submission ran: {message}" + (f" (it printed: {last[:300]})"
                                                          if last else ""))
        self.status = status


class ProtocolError(ConformanceError):
    """A malformed frame or message (from the worker, or to it)."""


def describe_signal(number: int) -> str:
    """``11 (segfault)``-style text for evidence lines."""
    common = {signal.SIGSEGV: "segfault", signal.SIGABRT: "abort", signal.SIGBUS: "bus error",
              signal.SIGILL: "illegal instruction", signal.SIGFPE: "arithmetic error",
              signal.SIGKILL: "SIGKILL", signal.SIGXCPU: "CPU time limit",
              signal.SIGXFSZ: "file size limit", signal.SIGTERM: "SIGTERM"}
    try:
        name = common.get(signal.Signals(number)) or signal.Signals(number).name
    except ValueError:
        name = "unknown signal"
    return f"{number} ({name})"


def how_it_ended(exit_line: Mapping[str, Any] | None, *, bwrap: bool, cpu_seconds: float,
                 what: str) -> tuple[WorkerStatus, str]:
    """The status and evidence of a worker that closed its reply pipe during ``what``, from its
    supervisor's exit line (``code``, ``signal``, ``cpu_seconds``; None when none came)."""
    code, number = (exit_line or {}).get("code"), (exit_line or {}).get("signal")
    if bwrap and number is None and isinstance(code, int) and code > 128:
        code, number = None, code - 128  # bubblewrap reports a signal as 128 + its number
    used = (exit_line or {}).get("cpu_seconds")
    if number == signal.SIGXCPU or (isinstance(used, (int, float)) and used >= cpu_seconds):
        # SIGXCPU at the soft limit, or SIGKILL at the hard one: a PID namespace's init (the
        # worker in namespaces of its own) ignores SIGXCPU, so the hard limit's SIGKILL ends it.
        return (WorkerStatus.CPU_LIMIT,
                f"the worker used up its {cpu_seconds} CPU seconds during {what}")
    if isinstance(number, int):
        message = f"the worker was killed by signal {describe_signal(number)} during {what}"
        if number == signal.SIGKILL:
            message += " (not by the checker: the system's out-of-memory killer?)"
        return WorkerStatus.CRASHED, message
    if isinstance(code, int):
        return (WorkerStatus.EXITED,
                f"the worker exited with status {code} during {what} (os._exit or sys.exit?)")
    return WorkerStatus.CRASHED, f"the worker closed its reply pipe during {what}"
