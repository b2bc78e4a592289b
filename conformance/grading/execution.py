"""Running one staged submission: the only module that knows how student code is executed.

:func:`run_submission` finds the rubric's classes by reading the source (nothing runs for that),
then runs every target's checks and returns a :class:`SubmissionOutcome`. Student code runs only
in the sandboxed worker (:mod:`conformance.worker`): one :class:`IsolatedSubject` per target, a
worker process of its own (restarted after a crash, within its limits), whose calls are requests;
by default in a filesystem sandbox (bubblewrap, else Landlock: ``sandbox="filesystem"``), which
raises :class:`~conformance.worker.SandboxUnavailable` where there is none.
The checks run here, in the checker, with the checker's own torch: nothing a submission does to
torch, builtins or Tensor subclasses in its process changes its verdicts, and it never shares a
process with another submission or with the grader.

Limits: the rubric's per-check wall-clock is a deadline for every request of that check (a
request may take what is left of it), its per-submission wall-clock bounds each worker's life,
its memory goes to the worker's address space (on top of what torch itself needs).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from conformance.catalogue import Runner
from conformance.grading.outcome import RunStatus, SubmissionOutcome, TargetOutcome, overall_status
from conformance.grading.rubric import Limits, Rubric, Target
from conformance.grading.targets import Location, locate, near_misses, scan
from conformance.inference.declarations import Declarations
from conformance.results import Status
from conformance.spec import Config
from conformance.worker import IsolatedSubject, LoadError, SandboxKind, WorkerError
from conformance.worker import Limits as WorkerLimits

OUTPUT_CHARS = 4000
"""How much of a submission's output is kept (head and tail)."""

SHORTEST_REQUEST = 0.5
"""Seconds a request may always take, however little is left of its check's deadline."""

# Worker statuses that have no RunStatus of their own.
_WORKER_STATUSES = {"exited": RunStatus.CRASHED, "cpu limit": RunStatus.TIMEOUT,
                    "output limit": RunStatus.CRASHED, "protocol error": RunStatus.CRASHED,
                    "worker error": RunStatus.GRADER_ERROR, "restart limit": RunStatus.CRASHED}


def plan(staged_dir: Path, rubric: Rubric,
         syntax_errors: Sequence[str] = ()) -> list[tuple[Target, Location | TargetOutcome]]:
    """Where each target is, read from the source alone (nothing is imported or run)."""
    scans = scan(staged_dir)
    return [(target, locate(target, scans, staged_dir, list(syntax_errors),
                            _other_names(rubric, target)))
            for target in rubric.targets]


def _other_names(rubric: Rubric, target: Target) -> tuple[str, ...]:
    return tuple(name for other in rubric.targets if other is not target for name in other.names)


def run_submission(staged_dir: Path, rubric: Rubric, limits: Limits | None = None, *,
                   syntax_errors: Sequence[str] = (),
                   sandbox: SandboxKind = "filesystem") -> SubmissionOutcome:
    """Run every target's checks on the submission staged in ``staged_dir``, in the worker.

    ``syntax_errors`` are problems staging found (notebook cells that don't parse): they explain
    a class that is missing. ``sandbox``: the worker's sandbox (``"filesystem"`` unless told
    otherwise, as by ``grade --no-sandbox``). Never raises for anything the submission does.
    """
    limits = limits or rubric.limits
    start = time.perf_counter()
    targets: list[TargetOutcome] = []
    output: list[str] = []
    protections: list[str] = []
    for target, located in plan(staged_dir, rubric, syntax_errors):
        if isinstance(located, TargetOutcome):
            targets.append(located)
            continue
        outcome, printed, protected = _run_target(staged_dir, located.spec, target,
                                                  target.declarations, rubric, limits, sandbox,
                                                  located, _other_names(rubric, target))
        targets.append(outcome)
        output += [printed] if printed else []
        protections = protections or protected
    status = overall_status(targets)
    outcome = SubmissionOutcome(status, _message(targets), targets, _truncate("\n".join(output)),
                                protections, "worker")
    outcome.seconds = time.perf_counter() - start
    return outcome


def run_registered(rubric: Rubric, target: Target, module: str, limits: Limits | None = None,
                   *, sandbox: SandboxKind = "filesystem") -> SubmissionOutcome:
    """Grade a registered implementation (``module``'s ``IMPLEMENTATION``: a bundled mutant) as
    ``target``, with its own declaration, in the worker like any submission (for
    ``--self-test``: the same path the students take)."""
    limits = limits or rubric.limits
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attention-registered-") as empty:
        # Nothing to copy: the module is imported from the installed package.
        outcome, printed, protections = _run_target(Path(empty), f"{module}:IMPLEMENTATION",
                                                    target, None, rubric, limits, sandbox)
    result = SubmissionOutcome(overall_status([outcome]), _message([outcome]), [outcome],
                               _truncate(printed), protections, "worker")
    result.seconds = time.perf_counter() - start
    return result


class _Deadline:
    """Per-request time limits: what is left of the current check's wall-clock budget."""

    def __init__(self, check_seconds: float) -> None:
        self.check_seconds = check_seconds
        self.until = time.monotonic() + check_seconds

    def start_check(self) -> None:
        self.until = time.monotonic() + self.check_seconds

    def __call__(self, operation: str, config: Config | None) -> float:
        return max(SHORTEST_REQUEST, self.until - time.monotonic())


def _run_target(directory: Path, spec: str, target: Target, declared: Declarations | None,
                rubric: Rubric, limits: Limits, sandbox: SandboxKind,
                located: Location | None = None,
                others: tuple[str, ...] = ()) -> tuple[TargetOutcome, str, list[str]]:
    """One target's outcome, what its workers printed, and the protections they ran under."""
    file = located.file if located else None
    class_name = located.class_name if located else None
    deadline = _Deadline(limits.check_seconds)
    worker_limits = WorkerLimits(request_seconds=limits.check_seconds,
                                 load_seconds=limits.check_seconds,
                                 lifetime_seconds=limits.submission_seconds,
                                 memory_bytes=limits.memory_mb * 2**20)
    try:
        subject = IsolatedSubject(directory, spec, name=None, declared=declared,
                                  limits=worker_limits, expected_failures={}, timeout=deadline,
                                  sandbox=sandbox)
    except LoadError as error:
        status = _status(error.status)
        misses = (near_misses(class_name, list(error.defined_names), others)
                  if status is RunStatus.NOT_FOUND and class_name else [])
        return (TargetOutcome(target.name, status, str(error), class_name, file, misses),
                str(error.output or ""), [])
    with subject:
        outcome = TargetOutcome(target.name, RunStatus.GRADED,
                                _found(located) if located else spec, class_name, file,
                                interface=list(subject.notes))
        runner = Runner(rubric.profile, rubric.seed)
        for check in target.checks:
            deadline.start_check()
            seen = len(subject.incidents)
            try:
                result = runner.run_check(subject, check, "cpu")
            except WorkerError as error:  # the worker can't be restarted any more
                outcome.status, outcome.message = _status(error.status), str(error)
                break
            fresh = subject.incidents[seen:]
            if fresh:
                error = fresh[-1][1]
                status = _status(error.status)
                # A limit broken during the check is the check's failure, whatever the check
                # made of the error (a gate or contract may record it as a broken feature).
                result = replace(result, status=Status.FAILED,
                                 reason=f"{status.value}: {error}")
                outcome.status, outcome.message = status, f"{check}: {error}"
            outcome.results.append(result)
            if fresh and str(getattr(fresh[-1][1].status, "value", "")) == "restart limit":
                break  # no worker will start again: the other checks can't run
        return outcome, subject.output, list(subject.protections)


def _status(value: object) -> RunStatus:
    text = str(getattr(value, "value", value))
    try:
        return RunStatus(text)
    except ValueError:
        return _WORKER_STATUSES.get(text, RunStatus.CRASHED)


def _found(located: Location) -> str:
    how = {"class": "", "assignment": " (bound by an assignment)",
           "import": " (bound by an import: is it the student's own class?)"}[located.how]
    return f"{located.class_name} in {located.file}{how}"


def _message(targets: list[TargetOutcome]) -> str:
    for target in targets:
        if target.status is not RunStatus.GRADED:
            return f"{target.target}: {target.message}"
    return ""


def _truncate(text: str, limit: int = OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters left out ...]\n{text[-half:]}"
