"""Running one staged submission: the only module that knows how student code is executed.

:func:`run_submission` finds the rubric's classes by reading the source (nothing runs for that),
then runs every target's checks and returns a :class:`SubmissionOutcome`. Student code runs only
in the sandboxed worker (:mod:`conformance.worker`): one :class:`IsolatedSubject` per target, a
worker process of its own (restarted after a crash, within its limits), whose calls are requests;
by default in a filesystem sandbox (Landlock or bubblewrap: ``sandbox="filesystem"``), which
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
from typing import NamedTuple

from conformance.checks.catalogue import GATE, by_name
from conformance.grading.run import interface
from conformance.grading.run.called import called, mask_spec
from conformance.grading.run.targets import Location, locate, near_misses, scan
from conformance.grading.score.outcome import RunStatus, SubmissionOutcome, TargetOutcome, overall_status
from conformance.grading.score.rubric import Rubric, RubricLimits, Target, prerequisites
from conformance.model.bugs import MASK_JUDGE
from conformance.model.declarations import Declarations
from conformance.model.remedies import texts
from conformance.model.results import Status
from conformance.model.spec import Config
from conformance.run.options import RunOptions
from conformance.run.runner import Runner
from conformance.worker import IsolatedSubject, LoadError, SandboxKind, WorkerError, WorkerLimits

OUTPUT_CHARS = 4000
"""How much of a submission's output is kept (head and tail)."""

SHORTEST_REQUEST = 0.5
"""Seconds a request may always take, however little is left of its check's deadline."""

# Worker statuses that have no RunStatus of their own.
_WORKER_STATUSES = {"exited": RunStatus.CRASHED, "cpu limit": RunStatus.TIMEOUT,
                    "protocol error": RunStatus.CRASHED,
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


def run_submission(staged_dir: Path, rubric: Rubric, limits: RubricLimits | None = None, *,
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
    printed_bytes = 0
    protections: list[str] = []
    for target, located in plan(staged_dir, rubric, syntax_errors):
        if isinstance(located, TargetOutcome):
            targets.append(located)
            continue
        ran = _run_target(staged_dir, located.spec, target, target.declarations, rubric, limits,
                          sandbox, located, _other_names(rubric, target))
        targets.append(ran.outcome)
        output += [ran.printed] if ran.printed else []
        printed_bytes += ran.printed_bytes
        protections = protections or ran.protections
    status = overall_status(targets)
    outcome = SubmissionOutcome(status, _message(targets), targets, _truncate("\n".join(output)),
                                protections, "worker", printed_bytes=printed_bytes)
    outcome.seconds = time.perf_counter() - start
    return outcome


def run_registered(rubric: Rubric, target: Target, module: str, limits: RubricLimits | None = None,
                   *, sandbox: SandboxKind = "filesystem") -> SubmissionOutcome:
    """Grade a registered implementation (``module``'s ``IMPLEMENTATION``: a bundled mutant) as
    ``target``, with its own declaration, in the worker like any submission (for
    ``--self-test``: the same path the students take)."""
    limits = limits or rubric.limits
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="attention-registered-") as empty:
        # Nothing to copy: the module is imported from the installed package.
        ran = _run_target(Path(empty), f"{module}:IMPLEMENTATION", target, None, rubric, limits,
                          sandbox)
    result = SubmissionOutcome(overall_status([ran.outcome]), _message([ran.outcome]),
                               [ran.outcome], _truncate(ran.printed), ran.protections, "worker",
                               printed_bytes=ran.printed_bytes)
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


class _Ran(NamedTuple):
    """One target's outcome, what its workers printed (the first bytes of each) and how much
    in all, and the protections they ran under."""

    outcome: TargetOutcome
    printed: str
    printed_bytes: int
    protections: list[str]


def _run_target(directory: Path, spec: str, target: Target, declared: Declarations | None,
                rubric: Rubric, limits: RubricLimits, sandbox: SandboxKind,
                located: Location | None = None, others: tuple[str, ...] = ()) -> _Ran:
    """Run one target's checks in its worker."""
    file = located.file if located else None
    class_name = located.class_name if located else None
    deadline = _Deadline(limits.check_seconds)
    worker_limits = WorkerLimits(request_seconds=limits.check_seconds,
                                 load_seconds=limits.check_seconds,
                                 lifetime_seconds=limits.submission_seconds,
                                 memory_bytes=limits.memory_mb * 2**20,
                                 accelerators=rubric.device == "cuda")
    try:
        subject = IsolatedSubject(directory, spec, name=None, declared=declared,
                                  limits=worker_limits, expected_failures={}, timeout=deadline,
                                  sandbox=sandbox)
    except LoadError as error:
        status = _status(error.status)
        misses = (near_misses(class_name, list(error.defined_names), others)
                  if status is RunStatus.NOT_FOUND and class_name else [])
        printed = str(error.output or "")
        return _Ran(TargetOutcome(target.name, status, str(error), class_name, file, misses),
                    printed, len(printed.encode("utf-8")), [])
    with subject:
        outcome = TargetOutcome(target.name, RunStatus.GRADED,
                                _found(located) if located else spec, class_name, file,
                                interface=texts(subject.notes), called=called(subject),
                                mask=mask_spec(subject))
        other_forms = ""
        if declared is not None:
            broken, other_forms = _other_forms(directory, spec, target, worker_limits, sandbox,
                                               class_name or spec)
            if broken is not None:
                outcome.status, outcome.message = RunStatus.INTERFACE_MISMATCH, broken
                return _printed(outcome, subject, other_forms)
        runner = Runner.of(RunOptions(rubric.profile, rubric.seed))
        for check in target.checks:
            deadline.start_check()
            seen = len(subject.incidents)
            try:
                result = runner.run_check(subject, check, rubric.device,
                                          without=_judged_elsewhere(target, check, outcome))
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
            if result.status is Status.SUITE_ERROR:  # the grader's, not the student's: a look
                outcome.status, outcome.message = RunStatus.GRADER_ERROR, f"{check}: {result.reason}"
            if fresh and str(getattr(fresh[-1][1].status, "value", "")) == "restart limit":
                break  # no worker will start again: the other checks can't run
            broken = interface.broken_return(target, result) if check == GATE.name else None
            if broken is not None:
                outcome.status, outcome.message = RunStatus.INTERFACE_MISMATCH, broken
                break  # zero for this class: nothing else is scored
        if outcome.status is RunStatus.GRADED:
            _without_the_mask(runner, subject, target, outcome, rubric.device, deadline)
        return _printed(outcome, subject, other_forms)


def _without_the_mask(runner: Runner, subject: IsolatedSubject, target: Target,
                      outcome: TargetOutcome, device: str, deadline: _Deadline) -> None:
    """Where the check that judges the mask failed, each other failed check run again without
    the mask, its status kept as the diagnosis's evidence (``CheckResult.unmasked``): a failure
    gone without the mask is the mask's, charged once, where the mask is judged. A check a
    rubric's ``requires`` already ran without it, and a run again that breaks a limit, add
    nothing."""
    judge = outcome.result(MASK_JUDGE)
    if judge is None or judge.status is not Status.FAILED:
        return
    for result in list(outcome.results):
        if (result.status is not Status.FAILED or result.check in (GATE.name, MASK_JUDGE)
                or _judged_elsewhere(target, result.check, outcome)):
            continue
        deadline.start_check()
        seen = len(subject.incidents)
        try:
            again = runner.run_check(subject, result.check, device, without={"mask"})
        except WorkerError:
            return
        if len(subject.incidents) == seen:
            result.unmasked = again.status


def _printed(outcome: TargetOutcome, subject: IsolatedSubject, other_forms: str) -> _Ran:
    """``outcome`` with what ``subject``'s workers (and the other constructor forms') printed."""
    return _Ran(outcome, _joined([subject.output, other_forms]),
                subject.printed_bytes + len(other_forms.encode("utf-8")),
                list(subject.protections))


def _other_forms(directory: Path, spec: str, target: Target, limits: WorkerLimits,
                 sandbox: SandboxKind, class_name: str) -> tuple[str | None, str]:
    """Load the target once in each other constructor form the rubric lists: the first form
    that does not build, as a mismatch message (None when all do), and what was printed."""
    printed = []
    for form in interface.other_forms(target):
        try:
            with IsolatedSubject(directory, spec, name=None,
                                 declared=interface.declared_form(target, form), limits=limits,
                                 expected_failures={}, sandbox=sandbox) as other:
                printed.append(other.output)
        except LoadError as error:
            printed.append(str(error.output or ""))
            return interface.broken_form(form, class_name, str(error)), _joined(printed)
    return None, _joined(printed)


def _judged_elsewhere(target: Target, check: str, outcome: TargetOutcome) -> set[str]:
    """The features a failed prerequisite of ``check`` judges (``padding``: the mask): the
    check runs without them, so the one mistake is charged once, where it is judged, and the
    check is scored on the rest of its property."""
    features: set[str] = set()
    for prerequisite in prerequisites(target, check):
        result = outcome.result(prerequisite)
        if prerequisite != GATE.name and result is not None and result.status is Status.FAILED:
            features.update(by_name(prerequisite).judges)  # (the gate judges no feature)
    return features


def _joined(printed: list[str]) -> str:
    return "\n".join(text for text in printed if text)


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
