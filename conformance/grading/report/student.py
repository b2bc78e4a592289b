"""A row of the grade book: who the student is, what their submission gave, and its score.

Plain data, built by :mod:`conformance.grading.pipeline` and read by everything that writes the
class's outputs (grade books, feedback, the class report, Gradescope results).
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.grading.run.store import Record
from conformance.grading.score.outcome import RunStatus, SubmissionOutcome
from conformance.grading.score.scoring import SubmissionScore


@dataclass
class Student:
    """One row of the grade book: who, what their submission gave, and its score."""

    id: str
    name: str
    email: str
    layout: str
    late: bool
    repository: str | None
    roster_identifier: str
    record: Record | None
    score: SubmissionScore

    @property
    def status(self) -> RunStatus:
        return self.score.status

    @property
    def submission_hash(self) -> str:
        return self.record.submission_hash if self.record else ""

    @property
    def outcome(self) -> SubmissionOutcome | None:
        return self.record.outcome if self.record else None
