"""The root of the suite's exceptions: every error it raises for a user is a :class:`ConformanceError`.

Each layer defines its own errors where they arise (a declaration that can't be read, an IMPL that
names nothing, a rubric, a worker that crashed, ...), all subclasses of this one, so a program that
drives the suite can catch them in one clause. Their message is one line for the user. Where an
error also is a standard one (a bad value is a ``ValueError``), it subclasses both.
"""

from __future__ import annotations


class ConformanceError(Exception):
    """An error of the suite's, for a user: what went wrong, in one line."""


class SuiteError(ConformanceError):
    """The suite itself failed while checking (its own defect, not the implementation's): no
    verdict where it happened. Raised where a front end must not report it as a failure of the
    implementation (pytest); please report it."""
