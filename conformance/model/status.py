"""The words for what stopped an implementation from being checked, written once.

The worker reports them (:class:`conformance.worker.errors.WorkerStatus`), the runner tells bad
input from a crash by them, and the grader records them
(:class:`conformance.grading.score.outcome.RunStatus`): each of those vocabularies takes these
members' values, so the same event reads the same word wherever it is reported.
"""

from __future__ import annotations

from enum import Enum


class LoadProblem(str, Enum):
    """An implementation that is bad input (it does not parse, import, exist or fit), as opposed
    to one that hangs or crashes while it is loaded."""

    SYNTAX_ERROR = "syntax error"
    IMPORT_ERROR = "import error"
    NOT_FOUND = "not found"
    INTERFACE_MISMATCH = "interface mismatch"
    MISSING_PACKAGE = "missing package"
    """It imports a third-party package this environment lacks: the environment's to fix
    (install it), not the code's fault."""


def is_load_problem(status: object) -> bool:
    """Whether ``status`` (a member of any of the vocabularies, or its word) is a load problem."""
    return str(getattr(status, "value", status)) in {problem.value for problem in LoadProblem}
