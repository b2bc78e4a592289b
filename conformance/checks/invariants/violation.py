"""How a check fails: a :class:`Violation` of its property (a failure, or a warning beyond the normal
range), and :class:`CheckFailed`, the violation or the implementation's error with its minimal
case.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from conformance.errors import ConformanceError
from conformance.generation.cases import Case
from conformance.model.remedies import Remedy

Severity = Literal["fail", "warn"]
"""``fail``: attention's contract is violated on inputs in the normal range of the dtype in use.
``warn``: a robustness finding beyond that range (see :class:`conformance.model.results.Status`)."""


class Violation(ConformanceError, AssertionError):
    """The property does not hold: ``summary`` in one line, then evidence and a likely cause.

    ``severity="warn"`` marks a finding that is a warning, not a failure, wherever it is raised.
    """

    def __init__(self, summary: str, *, details: Sequence[str] = (), hint: str | None = None,
                 severity: Severity = "fail", remedy: Remedy | None = None):
        super().__init__(summary)
        self.summary = summary
        self.details = list(details)
        self.hint = hint
        self.severity = severity
        self.remedy = remedy


def reports_earlier_call(error: BaseException | None) -> bool:
    """Whether ``error`` (or what it wraps) reports an earlier call rather than this one."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:  # a chain of causes may loop
        if getattr(error, "repeated", False):
            return True
        seen.add(id(error))
        error = error.__cause__
    return False


def as_warning(error: BaseException) -> Violation:
    """``error`` (a Violation, or the implementation's own error) as a warning Violation."""
    if isinstance(error, Violation):
        return Violation(error.summary, details=error.details, hint=error.hint, severity="warn",
                         remedy=error.remedy)
    summary = str(error).splitlines()[0] if str(error) else repr(error)
    return Violation(f"the implementation failed: {summary}", severity="warn")


class NotApplicable(ConformanceError):
    """The check can't judge this implementation in any way it has (found while it runs: no
    weight layout, and no attention core visible in its forward); the message says why. The
    check is skipped with that reason, never failed."""


class Lacking(str):
    """A skip reason that says what the implementation does not have ("no KV cache"): said as
    declared where it was, or as inferred where inference found it (``said``)."""

    def said(self, inferred: bool) -> str:
        return f"inferred: {self}" if inferred else f"declares {self}"


class OtherKind(Lacking):
    """A skip reason that says the target is not of the kind a check judges ("not a kernel
    function"): absent as a feature is, said as it is."""

    def said(self, inferred: bool) -> str:
        return str(self)


class Finding(NamedTuple):
    """A warning a check found: the violation (or implementation error) and its minimal case."""

    error: BaseException
    case: Case | None


class CheckFailed(ConformanceError):
    """A check failed; carries the violation (or implementation error) and the minimal case."""

    def __init__(self, error: BaseException, case: Case | None):
        super().__init__(str(error))
        self.error = error
        self.case = case
