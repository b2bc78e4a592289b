"""The catalogue of named checks, and the one function every runner consumes: :func:`check`.

The CLI, the pytest plugin and the grader all call into :class:`Runner`; nothing checks twice.
The gate runs first on each device; a failed basic call blocks the other checks, a failed
declared feature is reported once and the other checks run without it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
import traceback
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import torch

from conformance.adapter import InProcessSubject, Subject
from conformance.inference.declarations import Declarations
from conformance.invariants.alibi import Alibi
from conformance.invariants.autograd import Autograd
from conformance.invariants.base import Check, CheckContext, CheckFailed, Violation
from conformance.invariants.batch_independence import BatchIndependence
from conformance.invariants.causal import Causal
from conformance.invariants.contract import Contract
from conformance.invariants.determinism import Determinism
from conformance.invariants.dropout import Dropout
from conformance.invariants.fully_masked import FullyMasked
from conformance.invariants.gate import Gate, GateOutcome
from conformance.invariants.head_split import HeadSplit
from conformance.invariants.kv_cache import KVCacheDecoding
from conformance.invariants.kv_groups import KVGroups
from conformance.invariants.low_precision import LowPrecision
from conformance.invariants.mask_formats import MaskFormats
from conformance.invariants.packed import Packed
from conformance.invariants.padding import Padding
from conformance.invariants.path_agreement import PathAgreement
from conformance.invariants.permutation import Permutation
from conformance.invariants.position_shift import PositionShift
from conformance.invariants.reference_agreement import ReferenceAgreement
from conformance.invariants.row_stochastic import RowStochastic
from conformance.invariants.scale import Scale
from conformance.invariants.sliding_window import SlidingWindow
from conformance.invariants.stability import Stability
from conformance.precision import FLOAT32_NOISE
from conformance.profiles import profile_settings
from conformance.registry import resolve
from conformance.results import CheckResult, Status
from conformance.spec import Implementation
from conformance.strategies import available_devices

GATE = Gate()
CATALOGUE: tuple[Check, ...] = (
    Contract(), Padding(), FullyMasked(), RowStochastic(), HeadSplit(), Causal(),
    ReferenceAgreement(), Scale(), MaskFormats(), Permutation(), BatchIndependence(),
    Stability(), LowPrecision(), Dropout(), Autograd(), Determinism(), PathAgreement(),
    # The modern forms, each skipped (at no cost) by an implementation that doesn't declare it.
    KVGroups(), PositionShift(), Alibi(), SlidingWindow(), KVCacheDecoding(), Packed(),
)
"""The checks after the gate, in report order."""

CHECK_NAMES: tuple[str, ...] = (GATE.name, *(c.name for c in CATALOGUE))


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
    """

    def __init__(self, profile: str = "quick", seed: int | None = None, *,
                 strict: bool = False) -> None:
        self.profile = profile
        self.settings = profile_settings(profile)
        self.seed = seed
        self.strict = strict
        self._gates: dict[tuple[str, str], tuple[CheckResult, GateOutcome]] = {}

    def _context(self, subject: Subject, capabilities, device: str) -> CheckContext:
        return CheckContext(subject=subject, capabilities=capabilities, device=device,
                            settings=self.settings, seed=self.seed)

    def gate(self, subject: Subject, device: str) -> tuple[CheckResult, GateOutcome]:
        key = (subject.name, device)
        if key not in self._gates:
            start = time.perf_counter()
            outcome = GATE.evaluate(self._context(subject, subject.capabilities, device))
            result = CheckResult(subject.name, GATE.name, device, Status.PASSED)
            if outcome.blocked:
                result.status = Status.FAILED
                result.reason = outcome.blocking
                result.details = ["every other check is blocked"]
            result.observations = [f"{problem}; the other checks run without it"
                                   for problem in outcome.broken.values()]
            if outcome.constraint is not None:
                result.observations.append(outcome.constraint.describe())
            if outcome.precision is not None and (
                    outcome.precision.judged_as != torch.float64
                    or outcome.precision.noise > FLOAT32_NOISE):
                result.observations.append(outcome.precision.describe())
            result.seconds = time.perf_counter() - start
            self._gates[key] = (self._expectations(subject, result), outcome)
        return self._gates[key]

    def run_check(self, subject: Subject, name: str, device: str) -> CheckResult:
        """One check's verdict on one device (the gate's, when ``name`` is "gate")."""
        with one_thread():
            return self._run_check(subject, name, device)

    def _run_check(self, subject: Subject, name: str, device: str) -> CheckResult:
        if device not in available_devices():
            return CheckResult(subject.name, name, device, Status.SKIPPED,
                               reason=f"{device} is not available on this machine")
        gate_result, outcome = self.gate(subject, device)
        if name == GATE.name:
            return gate_result
        check = _by_name(name)
        if outcome.blocked:
            return CheckResult(subject.name, name, device, Status.SKIPPED,
                               reason=f"blocked: the gate failed ({gate_result.reason})")
        skip = check.device_skip_reason(device) or check.skip_reason(outcome.effective)
        reports_broken = any(feature in outcome.broken for feature in check.owns)
        if skip is not None and not reports_broken:
            if check.skip_reason(subject.capabilities) is None:
                skip = f"{skip} (the declared feature failed at the gate; see contract)"
            return CheckResult(subject.name, name, device, Status.SKIPPED, reason=skip)
        context = self._context(subject, outcome.effective, device)
        context.broken = dict(outcome.broken)
        if outcome.precision is not None and outcome.precision.judged_as != torch.float64:
            context.precision = {torch.float64: outcome.precision.judged_as}
        start = time.perf_counter()
        result = _verdict(check, context, subject.name, device)
        result.seconds = time.perf_counter() - start
        return self._expectations(subject, result)

    def run(self, subject: Subject, *, devices: Sequence[str] | None = None,
            checks: Iterable[str] | None = None) -> list[CheckResult]:
        names = list(checks) if checks is not None else list(CHECK_NAMES)
        unknown = [n for n in names if n not in CHECK_NAMES]
        if unknown:
            raise ValueError(f"unknown check(s) {unknown}: choose from {', '.join(CHECK_NAMES)}")
        return [self.run_check(subject, name, device)
                for device in (devices or available_devices()) for name in names]

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


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to one while checks run, then restored.

    The checks call implementations on tiny tensors, where threads cost more than they save, and
    on a busy machine their synchronisation is ruinous: `check textbook reference-torch-mha`
    took 36 to 72 s with torch's default two threads beside other work, 4.4 to 6.9 s with one
    (4.4 s both ways on an idle machine).
    """
    previous = torch.get_num_threads()
    if previous != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if previous != 1:
            torch.set_num_threads(previous)


def _by_name(name: str) -> Check:
    for check in CATALOGUE:
        if check.name == name:
            return check
    raise ValueError(f"unknown check {name!r}: choose from {', '.join(CHECK_NAMES)}")


def _verdict(check: Check, context: CheckContext, implementation: str, device: str) -> CheckResult:
    try:
        check.run(context)
    except CheckFailed as failure:
        return _finding(Status.FAILED, failure.error, failure.case, implementation, check.name,
                        device)
    except Exception as error:  # a defect in the suite itself: report it loudly, keep going
        return CheckResult(implementation, check.name, device, Status.FAILED,
                           reason=f"the check itself crashed ({type(error).__name__}: {error}); "
                                  "please report this",
                           details=traceback.format_exc().splitlines()[-6:])
    if context.warnings:
        error, case = context.warnings[0]
        result = _finding(Status.WARNED, error, case, implementation, check.name, device)
        result.details += [f"also: {str(other).splitlines()[0]}" for other, _ in
                           context.warnings[1:]]
        result.observations = list(context.observations)
        return result
    return CheckResult(implementation, check.name, device, Status.PASSED,
                       observations=list(context.observations))


def _finding(status: Status, error: BaseException, case, implementation: str, check: str,
             device: str) -> CheckResult:
    """A failure or warning with its evidence: the violation's summary, details and likely bug,
    or the implementation's error; and the minimal case."""
    result = CheckResult(implementation, check, device, status,
                         reason=str(error).splitlines()[0] if str(error) else repr(error),
                         counterexample=repr(case) if case else None)
    if isinstance(error, Violation):
        result.details = list(error.details)
        result.hint = error.hint
    else:
        result.reason = f"the implementation failed: {result.reason}"
    return result


def _check_in_worker(spec: str, name: str, expected_failures: dict[str, str],
                     expected_warnings: dict[str, str], declared: Declarations | None,
                     profile: str, seed: int | None, strict: bool,
                     devices: Sequence[str] | None,
                     checks: Sequence[str] | None) -> list[CheckResult]:
    """One implementation's verdicts, in a worker process: resolved again there by its IMPL
    (expected failures and declarations travel along: they may come from files or flags the
    worker never saw)."""
    torch.set_num_threads(1)  # the workers share the cores between them
    (impl,) = [i for i in resolve(spec, declared) if i.name == name]
    impl = replace(impl, expected_failures=expected_failures, expected_warnings=expected_warnings)
    return Runner(profile, seed, strict=strict).run(InProcessSubject(impl), devices=devices,
                                                    checks=checks)


def check_many(targets: Sequence[tuple[str, Implementation]], *, profile: str = "quick",
               devices: Sequence[str] | None = None, checks: Sequence[str] | None = None,
               seed: int | None = None, jobs: int = 1,
               declared: Declarations | None = None, strict: bool = False) -> list[CheckResult]:
    """Verdicts for several implementations, ``jobs`` at a time; results in input order.

    ``targets`` pairs each implementation with the IMPL string (and ``declared``, the
    declarations) that resolve to it, so a worker process can find it again. The verdicts don't
    depend on ``jobs``. ``strict`` promotes warnings to failures.
    """
    if jobs <= 1 or len(targets) <= 1:
        runner = Runner(profile, seed, strict=strict)
        return [result for _, impl in targets
                for result in runner.run(InProcessSubject(impl), devices=devices, checks=checks)]
    # Spawned, not forked: torch's thread pools don't survive a fork.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(targets)), mp_context=context) as pool:
        futures = [pool.submit(_check_in_worker, spec, impl.name, dict(impl.expected_failures),
                               dict(impl.expected_warnings), declared, profile, seed, strict,
                               devices, checks)
                   for spec, impl in targets]
        return [result for future in futures for result in future.result()]


def check(impl: Implementation | Subject | str, *, profile: str = "quick",
          devices: Sequence[str] | None = None, checks: Iterable[str] | None = None,
          seed: int | None = None, strict: bool = False) -> list[CheckResult]:
    """Run the catalogue on one implementation; one result per (check, device).

    ``impl`` is an :class:`Implementation`, a :class:`Subject`, a registered name or an IMPL
    string. ``devices`` defaults to every available one; ``checks`` to the whole catalogue.
    Expected failures declared by the implementation come back as ``expected-failure``;
    robustness findings as ``warning``, or as failures with ``strict=True``.
    """
    return Runner(profile, seed, strict=strict).run(as_subject(impl), devices=devices,
                                                    checks=checks)
