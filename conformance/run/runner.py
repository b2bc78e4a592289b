"""The one function every runner consumes: :class:`Runner`, a check's verdict on one device.

The CLI, the pytest plugin and the grader all call into it; nothing checks twice. The gate runs
first on each device; a failed basic call blocks the other checks, a failed declared feature is
reported once and the other checks run without it.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import torch

from conformance.checks.catalogue import GATE, by_name
from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.budget import Budget, budget_seconds
from conformance.checks.invariants.gate import GateOutcome
from conformance.checks.invariants.limits import ConfigurationLimits
from conformance.checks.invariants.search import Search
from conformance.checks.invariants.violation import CheckFailed, Lacking, NotApplicable, Violation
from conformance.checks.picture import picture
from conformance.checks.precision import FLOAT32_NOISE
from conformance.generation.cases import Case
from conformance.generation.profiles import examples_key, profile_settings
from conformance.generation.strategies import available_devices, device_kind
from conformance.loading.registry import resolve
from conformance.model.check_names import CHECK_NAMES
from conformance.model.picture import Picture
from conformance.model.results import CheckResult, Status, plain
from conformance.model.spec import Capabilities, Implementation
from conformance.numerics.threads import one_thread
from conformance.run import shared
from conformance.run.options import RunOptions
from conformance.subject.boundary import Subject
from conformance.subject.in_process import InProcessSubject

if TYPE_CHECKING:
    from hypothesis.database import ExampleDatabase


class Progress(Protocol):
    """What a run tells about its progress (:class:`conformance.frontends.progress_line.ProgressLine`
    draws it): a check starts, a search draws an example, an implementation is done."""

    def check(self, implementation: str, check: str) -> None: ...

    def example(self) -> None: ...

    def checked(self, result: CheckResult) -> None: ...

    def finished(self, implementation: str, results: Sequence[CheckResult],
                 seconds: float) -> None: ...


SUITE_ERROR_WORDS = ("the suite itself failed in this check, no verdict on the implementation; "
                     "please report it with these lines")
"""How a suite error opens: whose the error is, and what to do with it."""

BLOCKED = "blocked: the gate failed"
"""Why a check after a failed gate did not run. The gate's own reason is said once, by the gate
(repeated per check it buried the report: 23 copies of one sentence)."""


def as_subject(impl: Implementation | Subject | str) -> Subject:
    """A Subject for a registered name / IMPL string, an Implementation, or a Subject."""
    if isinstance(impl, Subject):
        return impl
    if isinstance(impl, str):
        (impl,) = resolve(impl)
    return InProcessSubject(impl)


class Runner:
    """Runs checks with one profile, remembering each (implementation, device) gate.

    ``strict`` promotes warnings (robustness findings beyond the normal range) to failures.
    ``time_budget``: each check's budget in seconds (see
    :mod:`conformance.checks.invariants.budget`; default: the profile's, 0: none).
    ``database``: hypothesis' example database for interactive use (see
    :func:`~conformance.generation.profiles.example_database`): each check's failing examples
    kept there and replayed first by the next run; None (the default) keeps none.
    ``processes``: how many processes one implementation's checks are shared out over (this
    one and forks of it; see :mod:`conformance.run.shared`); the verdicts don't depend on it.
    ``pictures``: each finding's minimal case drawn (``CheckResult.picture``, see
    :mod:`conformance.checks.picture`), for a report that shows them.
    """

    def __init__(self, profile: str = "quick", seed: int | None = None, *,
                 strict: bool = False, progress: Progress | None = None,
                 verbosity: str | None = None, replay: Case | None = None,
                 time_budget: float | None = None,
                 database: ExampleDatabase | None = None, processes: int = 1,
                 pictures: bool = False) -> None:
        self.profile = profile
        self.processes = processes
        self.pictures = pictures
        self.settings = profile_settings(profile, seed=seed, verbosity=verbosity,
                                         database=database)
        if time_budget is not None and time_budget < 0:
            raise ValueError(f"a time budget is a number of seconds >= 0 (0: none), not "
                             f"{time_budget:g}")
        self.time_budget = (budget_seconds(self.settings.max_examples) if time_budget is None
                            else time_budget or None)
        self.seed = seed
        self.strict = strict
        self.progress = progress
        self.replay = replay
        """A falsifying example to run alone (``Case``), instead of a search: the checks verify
        their property on exactly that case (the gate still runs as always)."""
        self._gates: dict[tuple[str, str], tuple[CheckResult, GateOutcome]] = {}
        self._limits: dict[tuple[str, str], ConfigurationLimits] = {}
        """Per implementation and device, the configurations re-probed inside checks
        (Search.limits): one check's finding spares the next its probe."""

    @classmethod
    def of(cls, options: RunOptions, progress: Progress | None = None) -> Runner:
        """The Runner for ``options`` (its checks shared out over ``options.jobs`` processes);
        a bad profile or time budget is a ValueError."""
        return cls(options.profile, options.seed, strict=options.strict, progress=progress,
                   verbosity=options.verbosity, replay=options.replay,
                   time_budget=options.time_budget, database=options.database,
                   processes=max(1, options.jobs), pictures=options.pictures)

    def _context(self, subject: Subject, capabilities, device: str, replay: Case | None = None,
                 *, broken: dict[str, str] | None = None,
                 precision: dict[torch.dtype, torch.dtype] | None = None, **search) -> CheckContext:
        """A check's context; ``search``: the :class:`Search`'s own arguments (its budget, ...)."""
        return CheckContext(subject=subject, capabilities=capabilities, device=device,
                            search=Search(self.settings, seed=self.seed, replay=replay,
                                          on_example=self.progress.example if self.progress
                                          else None, **search),
                            broken=broken or {}, precision=precision or {})

    def gate(self, subject: Subject, device: str) -> tuple[CheckResult, GateOutcome]:
        key = (subject.name, device)
        if key not in self._gates:
            start = time.perf_counter()
            subject.begin_check(GATE.name)
            outcome = GATE.evaluate(self._context(subject, subject.capabilities, device))
            result = CheckResult(subject.name, GATE.name, device, Status.PASSED)
            if outcome.blocked:
                result.status = Status.FAILED
                result.reason = outcome.blocking
                result.hint, result.bug = plain(outcome.hint)
                result.details = ["every other check is blocked"]
            result.observations = [
                *(f"refuses {dtype}, which nobody declared ({problem}): checked without it"
                  for dtype, problem in outcome.refused.items()),
                *(f"{problem}; the other checks run without it"
                  for problem in outcome.broken.values())]
            if outcome.constraint is not None:
                result.observations.append(outcome.constraint.describe())
            if outcome.backward_here:
                result.observations.append(
                    f"forward only where it was probed; on {device} its backward runs: the "
                    "gradient checks run there")
            if outcome.shortest is not None:
                length, problem = outcome.shortest
                result.observations.append(
                    f"refuses fewer than {length} tokens on {device} ({problem}): its cases are "
                    f"{length} tokens or longer")
            if outcome.precision is not None and (
                    outcome.precision.judged_as != torch.float64
                    or outcome.precision.noise > FLOAT32_NOISE):
                result.observations.append(outcome.precision.describe())
            result.seconds = time.perf_counter() - start
            self._gates[key] = (self._expectations(subject, result), outcome)
        return self._gates[key]

    def run_check(self, subject: Subject, name: str, device: str, *,
                  without: Iterable[str] = ()) -> CheckResult:
        """One check's verdict on one device (the gate's, when ``name`` is "gate").

        ``without``: features to leave out of this check's cases (``mask``), as where the
        check that judges them failed and its failure is reported there, once (grading's
        ``requires``); the result says so."""
        if self.progress is not None:
            self.progress.check(subject.name, name)
        with _as_a_check():
            result = self._run_check(subject, name, device, frozenset(without))
        if self.progress is not None:
            self.progress.checked(result)
        return result

    def _run_check(self, subject: Subject, name: str, device: str,
                   without: frozenset[str] = frozenset()) -> CheckResult:
        if device not in available_devices():
            return CheckResult(subject.name, name, device, Status.SKIPPED,
                               reason=f"{device} is not available on this machine")
        refused = _refused(subject, device)
        if refused is not None:  # its contract: stated, never a failure
            return CheckResult(subject.name, name, device, Status.SKIPPED,
                               reason=f"refuses {device} (probed: {refused})")
        gate_result, outcome = self.gate(subject, device)
        if name == GATE.name:
            return gate_result
        check = by_name(name)
        if outcome.blocked:
            return CheckResult(subject.name, name, device, Status.SKIPPED,
                               reason=BLOCKED)
        effective = _without(outcome.effective, without)
        skip = check.device_skip_reason(device) or check.why_not(effective)
        absent = isinstance(skip, Lacking)
        if absent:  # said as where it comes from: a declaration or inference
            skip = skip.said(inferred=bool(subject.notes))
        reports_broken = any(feature in outcome.broken for feature in check.owns)
        if skip is not None and not reports_broken:
            if check.why_not(subject.capabilities) is None:
                skip = f"{skip} (the declared feature failed at the gate; see contract)"
            return CheckResult(subject.name, name, device, Status.SKIPPED, reason=skip,
                               absent=absent)
        judged_as = torch.float64 if outcome.precision is None else outcome.precision.judged_as
        context = self._context(
            subject, effective, device, self.replay, broken=dict(outcome.broken),
            precision={torch.float64: judged_as} if judged_as != torch.float64 else None,
            examples_key=(examples_key(subject.name, name, device)
                          if self.settings.database is not None else None),
            limits=self._limits.setdefault((subject.name, device), ConfigurationLimits()),
            budget=Budget(self.time_budget))
        subject.begin_check(name)
        result = _verdict(check, context, subject.name, device)
        result.seconds = context.search.budget.elapsed()
        if self.pictures and result.counterexample and result.status in FINDINGS:
            result.picture = _picture(subject, context.capabilities, result)
        if effective is not outcome.effective:
            result.observations.append(
                "run without " + ", ".join(sorted(without)) + ": the check that judges "
                + ("it" if len(without) == 1 else "them") + " failed, and says so once")
        return _budgeted(self._expectations(subject, result), context.search.budget)

    def run(self, subject: Subject, *, devices: Sequence[str] | None = None,
            checks: Iterable[str] | None = None, closed_after: bool = False) -> list[CheckResult]:
        """The verdicts of ``checks`` on ``devices``; ``closed_after``: the caller closes
        ``subject`` next, so it is let go as the twins are closed (their stops overlap)."""
        names = list(checks) if checks is not None else list(CHECK_NAMES)
        unknown = [n for n in names if n not in CHECK_NAMES]
        if unknown:
            raise ValueError(f"unknown check(s) {unknown}: choose from {', '.join(CHECK_NAMES)}")
        start = time.perf_counter()
        pairs = [(device, name) for device in (devices or available_devices()) for name in names]
        # Started before the gates run, so that their workers load meanwhile.
        twins = shared.twins(subject, shared.wanted(self.processes, [n for _, n in pairs]))
        try:
            results = (shared.run(self, subject, pairs, twins) if twins else
                       [self.run_check(subject, name, device) for device, name in pairs])
        finally:
            if closed_after:
                subject.let_go()
            for twin in twins:
                if twin is not subject:
                    twin.close()
        if self.progress is not None:
            self.progress.finished(subject.name, results, time.perf_counter() - start)
        return results

    def runs_checks(self, subject: Subject, device: str) -> bool:
        """Whether checks search on ``device``: it is here, and its gate (run now where it has
        not run, as run_check runs it) passed."""
        if device not in available_devices() or _refused(subject, device) is not None:
            return False
        with _as_a_check():
            return not self.gate(subject, device)[1].blocked

    def _expectations(self, subject: Subject, result: CheckResult) -> CheckResult:
        """Apply the subject's expected failures and warnings, and ``strict``.

        A warning satisfies an expected failure (the finding is there); under ``strict`` an
        unexpected warning fails the run, and an expected one is an expected failure.
        """
        expected = subject.expected_failures.get(result.check)
        warned = subject.expected_warnings.get(result.check)
        if result.status is Status.WARNED:
            if expected is not None or (self.strict and warned is not None):
                result.status = Status.EXPECTED_FAILURE
                result.details.append(f"expected: {expected or warned}")
            elif self.strict:
                result.status = Status.FAILED
                result.reason = f"{result.reason} (a warning, failed under strict)"
            elif warned is not None:
                result.details.append(f"expected: {warned}")
            return result
        if expected is None:
            return result
        if result.status is Status.FAILED:
            result.status = Status.EXPECTED_FAILURE
            result.details.append(f"expected: {expected}")
        elif result.status is Status.PASSED:
            result.status = Status.FAILED
            result.reason = f"expected to fail ({expected}) but passed"
        return result


def _refused(subject: Subject, device: str) -> str | None:
    """Why ``subject`` refuses ``device`` (``cuda:1`` as ``cuda``), where it was probed to."""
    return dict(subject.capabilities.refused_devices).get(device_kind(device))


@contextlib.contextmanager
def _as_a_check() -> Iterator[None]:
    """Where a check (or a gate) runs: torch on one thread, and the caller's random state given
    back after it (the check reseeds this process's generator, Subject.begin_check)."""
    with one_thread(), torch.random.fork_rng(devices=[]):
        yield


def _verdict(check: Check, context: CheckContext, implementation: str, device: str) -> CheckResult:
    try:
        check.run(context)
    except CheckFailed as failure:
        return _routed(_finding(Status.FAILED, failure.error, failure.case, implementation,
                                check.name, device), context)
    except NotApplicable as reason:
        return CheckResult(implementation, check.name, device, Status.SKIPPED, reason=str(reason),
                           observations=list(context.observations))
    except Exception as error:  # a defect in the suite itself: report it loudly, keep going
        return CheckResult(implementation, check.name, device, Status.SUITE_ERROR,
                           reason=f"{SUITE_ERROR_WORDS} ({type(error).__name__}: {error})",
                           details=traceback.format_exc().splitlines()[-6:])
    search = context.search
    if search.unfit and len(search.unfit) == search.searches and not context.warnings:
        return CheckResult(implementation, check.name, device, Status.SKIPPED,
                           reason=search.unfit[0], observations=list(context.observations))
    search.observations += [f"part of the check did not run: {words}"
                            for words in dict.fromkeys(search.unfit)]
    if context.warnings:
        error, case = context.warnings[0]
        result = _finding(Status.WARNED, error, case, implementation, check.name, device)
        result.details += [f"also: {str(other).splitlines()[0]}" for other, _ in
                           context.warnings[1:]]
        result.observations = list(context.observations)
        return _routed(result, context)
    return _routed(CheckResult(implementation, check.name, device, Status.PASSED,
                               observations=list(context.observations)), context)


def _routed(result: CheckResult, context: CheckContext) -> CheckResult:
    """``result`` with the route its check judged through."""
    result.route = context.route
    return result


FINDINGS = (Status.FAILED, Status.WARNED)
"""What a picture is drawn for (before the expectations: an expected failure too)."""


def _picture(subject: Subject, capabilities: Capabilities, result: CheckResult) -> Picture | None:
    """``result``'s minimal case drawn; None where its counterexample is not a Case."""
    try:
        case = Case.parse(result.counterexample or "")
    except ValueError:
        return None
    return picture(subject, capabilities, case, result.reason)


def _without(capabilities: Capabilities, features: frozenset[str]) -> Capabilities:
    """``capabilities`` with ``features`` left out (the same object where nothing is)."""
    if "mask" in features and (capabilities.mask is not None or capabilities.mask_formats):
        return replace(capabilities, mask=None, mask_formats=())
    return capabilities


def _budgeted(result: CheckResult, budget: Budget) -> CheckResult:
    """``result`` with what its time budget cut short: a pass on part of the search is a
    warning saying how much ran (never a silent pass); applied after the expectations and
    ``strict``, as it is about the run's time, not the implementation's behaviour."""
    if budget.unshrunk and result.counterexample:
        result.details.append("the time budget ran out while this case was being shrunk: it is "
                              "the first failing case found, not the smallest")
    shortfall = budget.shortfall()
    if shortfall is None:
        return result
    if result.status is Status.PASSED:
        result.status = Status.WARNED
        result.reason = f"cut short: {shortfall}; the property held on each of them"
        result.hint = ("a slow implementation: give the check a larger time budget (or none) "
                       "for the whole search")
    elif result.status is not Status.SKIPPED:
        result.details.append(f"cut short: {shortfall}")
    return result


def _finding(status: Status, error: BaseException, case, implementation: str, check: str,
             device: str) -> CheckResult:
    """A failure or warning with its evidence: the violation's summary, details and likely bug,
    or the implementation's error; and the minimal case."""
    result = CheckResult(implementation, check, device, status,
                         reason=str(error).splitlines()[0] if str(error) else repr(error),
                         counterexample=repr(case) if case else None)
    if isinstance(error, Violation):
        result.details = list(error.details)
        result.hint, result.bug = plain(error.hint)
        result.remedy = error.remedy
    else:
        result.reason = f"the implementation failed: {result.reason}"
    return result
