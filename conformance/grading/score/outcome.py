"""What running one submission gave: a status, and per target the check results.

These are plain data, independent of how they were obtained (the sandboxed worker, the
temporary trusted path, a stored JSON file, or a test that builds them by hand): scoring,
outputs and resuming only ever see these types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from conformance.model.remedies import Remedy
from conformance.model.results import CheckResult, Route, Status
from conformance.model.status import LoadProblem


class RunStatus(str, Enum):
    """How far a submission (or one of its targets) got."""

    GRADED = "graded"
    SYNTAX_ERROR = LoadProblem.SYNTAX_ERROR.value
    IMPORT_ERROR = LoadProblem.IMPORT_ERROR.value
    NOT_FOUND = LoadProblem.NOT_FOUND.value
    INTERFACE_MISMATCH = LoadProblem.INTERFACE_MISMATCH.value
    MISSING_PACKAGE = LoadProblem.MISSING_PACKAGE.value
    """It needs a package the grading environment lacks: the teacher's to install, and no
    grade is given until then (never a 0 for the student)."""
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    OUT_OF_MEMORY = "out of memory"
    UNREADABLE = "unreadable"
    NO_CODE = "no code"
    NO_SUBMISSION = "no submission"
    GRADER_ERROR = "grader error"
    PARTLY_EVALUATED = "partly evaluated"
    """Graded, but some items could not be evaluated for a reason that is not a failure of the
    student's (a check that could not run): never a silent zero (see scoring)."""


NEEDS_A_LOOK = frozenset({RunStatus.CRASHED, RunStatus.TIMEOUT, RunStatus.INTERFACE_MISMATCH,
                          RunStatus.OUT_OF_MEMORY, RunStatus.IMPORT_ERROR, RunStatus.UNREADABLE,
                          RunStatus.GRADER_ERROR, RunStatus.PARTLY_EVALUATED,
                          RunStatus.MISSING_PACKAGE})
"""Statuses a human should look at: the grade may say more about the grader than the student."""

WITHHELD = frozenset({RunStatus.GRADER_ERROR, RunStatus.MISSING_PACKAGE})
"""Statuses where the grader or its environment, not the submission, stopped the grading: no
grade is given (an empty total, not a 0) until the teacher has fixed it and regraded."""

PROVISIONAL = frozenset({RunStatus.PARTLY_EVALUATED})
"""Statuses whose points so far are not a grade: an item could not be evaluated through no
failure of the student's, and a person decides it. The grade books give no final total (an empty
one, never a number that looks final) and carry the points so far as provisional."""


def status_line(status: RunStatus, message: str) -> str:
    """``status: message`` for a reader, the status said once: a message that already begins
    with it ("syntax error in attention.py, line 17: ...") stands alone."""
    if not message:
        return status.value
    if re.match(rf"{re.escape(status.value)}\b", message, re.IGNORECASE):
        return message
    return f"{status.value}: {message}"


# When targets end differently, the submission's status is the most serious one.
_SERIOUSNESS = [RunStatus.GRADER_ERROR, RunStatus.MISSING_PACKAGE, RunStatus.UNREADABLE, RunStatus.NO_CODE,
                RunStatus.NO_SUBMISSION, RunStatus.CRASHED, RunStatus.OUT_OF_MEMORY,
                RunStatus.TIMEOUT, RunStatus.SYNTAX_ERROR, RunStatus.IMPORT_ERROR,
                RunStatus.INTERFACE_MISMATCH, RunStatus.NOT_FOUND, RunStatus.PARTLY_EVALUATED,
                RunStatus.GRADED]


@dataclass
class TargetOutcome:
    """One rubric target in one submission.

    Attributes:
        target: the rubric's class name.
        status: ``graded`` when the checks ran (whatever they found), else why not.
        message: one line: what went wrong, or where the class was found.
        found_as: the class name that matched (the target's or an alias).
        location: the file (relative to the submission) that defines it.
        near_misses: class names that look like the target (difflib), for "did you mean".
        interface: what was inferred or declared about the class, in words (the teacher's).
        called: how the class was built and called, in the course's words (the student's:
            see :mod:`conformance.grading.run.called`).
        mask: the mask convention it was called with, as declared (``keep_int:rows_broadcast``;
            None: no mask), for examples shown with their mask as the course passes it.
        results: one CheckResult per check run (fewer when the run stopped early).
    """

    target: str
    status: RunStatus
    message: str = ""
    found_as: str | None = None
    location: str | None = None
    near_misses: list[str] = field(default_factory=list)
    interface: list[str] = field(default_factory=list)
    called: list[str] = field(default_factory=list)
    mask: str | None = None
    results: list[CheckResult] = field(default_factory=list)

    def result(self, check: str) -> CheckResult | None:
        for result in self.results:
            if result.check == check:
                return result
        return None

    def to_dict(self) -> dict:
        return {"target": self.target, "status": self.status.value, "message": self.message,
                "found_as": self.found_as, "location": self.location,
                "near_misses": list(self.near_misses), "interface": list(self.interface),
                "called": list(self.called), "mask": self.mask,
                "results": [result.to_dict() for result in self.results]}

    @classmethod
    def from_dict(cls, data: dict) -> TargetOutcome:
        return cls(target=data["target"], status=RunStatus(data["status"]),
                   message=data.get("message", ""), found_as=data.get("found_as"),
                   location=data.get("location"), near_misses=list(data.get("near_misses", [])),
                   interface=list(data.get("interface", [])),
                   called=list(data.get("called", [])), mask=data.get("mask"),
                   results=[result_from_dict(r) for r in data.get("results", [])])


@dataclass
class SubmissionOutcome:
    """Everything running one submission gave.

    Attributes:
        status: the most serious of the targets' statuses (or a staging problem).
        output: what the submission printed (stdout and stderr), its beginning and end: for the
            teacher only, never in a student's feedback.
        printed_bytes: how much it printed in all (what ``output`` leaves out was dropped).
        protections: which protections were active while it ran (the worker says).
        isolation: how it ran: ``worker`` or ``trusted-unsandboxed``.
    """

    status: RunStatus
    message: str = ""
    targets: list[TargetOutcome] = field(default_factory=list)
    output: str = ""
    protections: list[str] = field(default_factory=list)
    isolation: str = ""
    seconds: float = 0.0
    printed_bytes: int = 0

    def target(self, name: str) -> TargetOutcome | None:
        for target in self.targets:
            if target.target == name:
                return target
        return None

    @property
    def sandbox(self) -> str:
        """The filesystem sandbox its code ran in, read from the protections: ``bwrap``,
        ``landlock``, ``none`` (not sandboxed); ``""`` when nothing of it ran."""
        for protection in self.protections:
            if protection.startswith("filesystem: "):
                return protection.removeprefix("filesystem: ")
        if not self.protections:
            return ""
        # Recorded before the protections named the sandbox: bubblewrap hid the host.
        return "bwrap" if "host filesystem hidden" in self.protections else "none"

    def to_dict(self) -> dict:
        return {"status": self.status.value, "message": self.message,
                "targets": [t.to_dict() for t in self.targets], "output": self.output,
                "protections": list(self.protections), "isolation": self.isolation,
                "seconds": round(self.seconds, 3), "printed_bytes": self.printed_bytes}

    @classmethod
    def from_dict(cls, data: dict) -> SubmissionOutcome:
        return cls(status=RunStatus(data["status"]), message=data.get("message", ""),
                   targets=[TargetOutcome.from_dict(t) for t in data.get("targets", [])],
                   output=data.get("output", ""), protections=list(data.get("protections", [])),
                   isolation=data.get("isolation", ""), seconds=float(data.get("seconds", 0.0)),
                   printed_bytes=int(data.get("printed_bytes", len(data.get("output", "")))))


def overall_status(targets: list[TargetOutcome]) -> RunStatus:
    """The most serious target status (``graded`` when every target was graded)."""
    if not targets:
        return RunStatus.GRADED
    return min((t.status for t in targets), key=_SERIOUSNESS.index)


def result_from_dict(data: dict) -> CheckResult:
    """A CheckResult back from :meth:`CheckResult.to_dict`.

    A status this version does not know (written by a newer one) comes back as failed, with its
    name kept in the reason: it was not a pass.
    """
    fields = dict(data)
    raw = fields.pop("status")
    if fields.get("remedy") is not None:
        fields["remedy"] = Remedy.from_dict(fields["remedy"])
    try:
        status = Status(raw)
    except ValueError:
        status = Status.FAILED
        fields["reason"] = f"[{raw}] {fields.get('reason', '')}".strip()
    if fields.get("route") is not None:
        fields["route"] = Route(fields["route"])
    if fields.get("unmasked") is not None:
        try:
            fields["unmasked"] = Status(fields["unmasked"])
        except ValueError:
            fields["unmasked"] = None  # a newer version's status: no evidence read
    known = {"implementation", "check", "device", "reason", "counterexample", "details", "hint",
             "observations", "seconds", "remedy", "route", "bug", "absent", "unmasked"}
    return CheckResult(status=status, **{k: v for k, v in fields.items() if k in known})
