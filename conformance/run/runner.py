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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import torch

from conformance.checks.invariants.alibi import Alibi
from conformance.checks.invariants.autograd import Autograd
from conformance.checks.invariants.base import Check, CheckContext, CheckFailed, Violation
from conformance.checks.invariants.batch_independence import BatchIndependence
from conformance.checks.invariants.causal import Causal
from conformance.checks.invariants.contract import Contract
from conformance.checks.invariants.determinism import Determinism
from conformance.checks.invariants.dropout import Dropout
from conformance.checks.invariants.fully_masked import FullyMasked
from conformance.checks.invariants.gate import Gate, GateOutcome, base_case
from conformance.checks.invariants.head_split import HeadSplit
from conformance.checks.invariants.kv_cache import KVCacheDecoding
from conformance.checks.invariants.kv_groups import KVGroups
from conformance.checks.invariants.low_precision import LowPrecision
from conformance.checks.invariants.mask_formats import MaskFormats
from conformance.checks.invariants.packed import Packed
from conformance.checks.invariants.padding import Padding
from conformance.checks.invariants.path_agreement import PathAgreement
from conformance.checks.invariants.permutation import Permutation
from conformance.checks.invariants.position_shift import PositionShift
from conformance.checks.invariants.reference_agreement import ReferenceAgreement
from conformance.checks.invariants.row_stochastic import RowStochastic
from conformance.checks.invariants.scale import Scale
from conformance.checks.invariants.sliding_window import SlidingWindow
from conformance.checks.invariants.stability import Stability
from conformance.checks.precision import FLOAT32_NOISE
from conformance.frontends.progress_line import ProgressLine
from conformance.generation.cases import Case
from conformance.generation.constraints import discover
from conformance.generation.profiles import profile_settings
from conformance.generation.strategies import available_devices
from conformance.loading.registry import implementations_of, resolve
from conformance.model.check_names import CHECK_NAMES, unknown_checks
from conformance.model.declarations import Declarations
from conformance.model.results import CheckResult, Status
from conformance.model.spec import Config, Implementation
from conformance.subject.boundary import ImplementationError, InProcessSubject, Subject

GATE = Gate()
CATALOGUE: tuple[Check, ...] = (
    Contract(), Padding(), FullyMasked(), RowStochastic(), HeadSplit(), Causal(),
    ReferenceAgreement(), Scale(), MaskFormats(), Permutation(), BatchIndependence(),
    Stability(), LowPrecision(), Dropout(), Autograd(), Determinism(), PathAgreement(),
    # The modern forms, each skipped (at no cost) by an implementation that doesn't declare it.
    KVGroups(), PositionShift(), Alibi(), SlidingWindow(), KVCacheDecoding(), Packed(),
)
"""The checks after the gate, in report order."""

if (GATE.name, *(c.name for c in CATALOGUE)) != CHECK_NAMES:
    raise ImportError("conformance.model.check_names.CHECK_NAMES must list the catalogue's checks, "
                      "the gate first, in order")


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
                 strict: bool = False, progress: ProgressLine | None = None,
                 verbosity: str | None = None, replay: Case | None = None) -> None:
        self.profile = profile
        self.settings = profile_settings(profile, seed=seed, verbosity=verbosity)
        self.seed = seed
        self.strict = strict
        self.progress = progress
        self.replay = replay
        """A falsifying example to run alone (``Case``), instead of a search: the checks verify
        their property on exactly that case (the gate still runs as always)."""
        self._gates: dict[tuple[str, str], tuple[CheckResult, GateOutcome]] = {}

    def _context(self, subject: Subject, capabilities, device: str,
                 replay: Case | None = None) -> CheckContext:
        return CheckContext(subject=subject, capabilities=capabilities, device=device,
                            settings=self.settings, seed=self.seed,
                            on_example=self.progress.example if self.progress else None,
                            replay=replay)

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
        if self.progress is not None:
            self.progress.check(subject.name, name)
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
        context = self._context(subject, outcome.effective, device, self.replay)
        context.broken = dict(outcome.broken)
        if outcome.precision is not None and outcome.precision.judged_as != torch.float64:
            context.precision = {torch.float64: outcome.precision.judged_as}
        start = time.perf_counter()
        subject.begin_check(name)
        result = _verdict(check, context, subject.name, device)
        result.seconds = time.perf_counter() - start
        return self._expectations(subject, result)

    def run(self, subject: Subject, *, devices: Sequence[str] | None = None,
            checks: Iterable[str] | None = None) -> list[CheckResult]:
        names = list(checks) if checks is not None else list(CHECK_NAMES)
        unknown = [n for n in names if n not in CHECK_NAMES]
        if unknown:
            raise ValueError(f"unknown check(s) {unknown}: choose from {', '.join(CHECK_NAMES)}")
        start = time.perf_counter()
        results = [self.run_check(subject, name, device)
                   for device in (devices or available_devices()) for name in names]
        if self.progress is not None:
            self.progress.finished(subject.name, results, time.perf_counter() - start)
        return results

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


@dataclass(frozen=True)
class Isolated:
    """Every implementation an IMPL string names, to check in worker processes of their own
    (``check --isolate``), never imported here: what each is expected to fail or warn, by name
    (from an expected-failures file; their own declarations add theirs), and the time limit of
    one call (see :class:`conformance.worker.local.CallLimits`)."""

    expected_failures: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    expected_warnings: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    call_seconds: float = 10.0


Target = tuple[str, "Implementation | Isolated"]
"""An IMPL string, and what it resolves to: an Implementation (checked in this process), or
Isolated (its implementations checked in worker processes)."""

Interfaces = dict[str, tuple[str, tuple[str, ...]]]
"""``{implementation: (what it declares, what was inferred)}``, for reports."""


class BadInput(Exception):
    """An isolated implementation is not checkable (a syntax or import error, not found, an
    interface that can't be inferred): one line for the user, as in-process resolution gives."""


LOAD_PROBLEMS = ("syntax error", "import error", "not found", "interface mismatch")
"""What a worker says when an implementation is bad input, as opposed to one that hangs or
crashes while it is loaded (a failed gate, with the evidence)."""


def not_loaded(name: str, error: BaseException, devices: Sequence[str] | None,
               checks: Sequence[str] | None) -> list[CheckResult]:
    """The verdicts of an implementation the isolated worker could not load (a constructor that
    hangs, a crash while its interface is inferred): the gate fails with the worker's evidence,
    the rest is blocked."""
    status = getattr(error, "status", None)
    reason = f"{getattr(status, 'value', status)}: loading it in the isolated worker: {error}"
    return [CheckResult(name, check, device,
                        Status.FAILED if check == GATE.name else Status.SKIPPED,
                        reason=reason if check == GATE.name else
                        f"blocked: the gate failed ({reason})")
            for device in (devices or available_devices())
            for check in (list(checks) if checks is not None else list(CHECK_NAMES))]


def preflight(subject: Subject) -> None:
    """BadInput when the constructor raises for every generated configuration: said once, in
    a line, instead of every check failing (one that rejects some is the gate's to narrow
    down)."""
    caps = subject.capabilities
    case = base_case(caps, caps.dtypes[0], "cpu")
    try:
        subject.instantiate(case.config, case.seed)
    except ImplementationError as error:
        def builds(heads: int, head_dim: int) -> bool:
            config = Config(batch=2, q_len=5, kv_len=5, d_model=heads * head_dim,
                            num_heads=heads, dtype=caps.dtypes[0])
            try:
                subject.instantiate(config, 0)
            except ImplementationError:
                return False
            return True

        try:
            discover(builds, heads=caps.heads)
        except ValueError:
            raise BadInput(f"{subject.name}: {error}") from error


def _isolated_results(runner: Runner, spec: str, what: Isolated,
                      declared: Declarations | None, devices: Sequence[str] | None,
                      checks: Sequence[str] | None,
                      interfaces: Interfaces) -> list[CheckResult]:
    from conformance.loading.registry import origin
    from conformance.worker.errors import LoadError
    from conformance.worker.local import open_all

    try:
        subjects = open_all(spec, declared, call_seconds=what.call_seconds)
    except LoadError as error:
        if str(getattr(error.status, "value", error.status)) in LOAD_PROBLEMS:
            raise BadInput(f"{spec}: {error}") from None
        interfaces[origin(spec)] = ("not loaded", ())
        return not_loaded(origin(spec), error, devices, checks)
    results: list[CheckResult] = []
    try:
        for subject in subjects:
            preflight(subject)
            subject.expected_failures = {**subject.expected_failures,
                                         **what.expected_failures.get(subject.name, {})}
            subject.expected_warnings = {**subject.expected_warnings,
                                         **what.expected_warnings.get(subject.name, {})}
            interfaces[subject.name] = (subject.describe(), tuple(subject.notes))
            results += runner.run(subject, devices=devices, checks=checks)
    finally:
        for subject in subjects:
            subject.close()
    return results


def _results(runner: Runner, spec: str, what: Implementation | Isolated,
             declared: Declarations | None, devices: Sequence[str] | None,
             checks: Sequence[str] | None, interfaces: Interfaces) -> list[CheckResult]:
    """Every verdict of one target."""
    if isinstance(what, Isolated):
        return _isolated_results(runner, spec, what, declared, devices, checks, interfaces)
    subject = InProcessSubject(what)
    interfaces[what.name] = (subject.describe(), tuple(what.notes))
    return runner.run(subject, devices=devices, checks=checks)


@dataclass(frozen=True)
class _Resolved:
    """An in-process implementation on its way to a spawned process: its factory may be a local
    function, so it travels as its name and expectations and is resolved again there."""

    name: str
    expected_failures: dict[str, str]
    expected_warnings: dict[str, str]


def _travelling(what: Implementation | Isolated) -> _Resolved | Isolated:
    if isinstance(what, Isolated):
        return what
    return _Resolved(what.name, dict(what.expected_failures), dict(what.expected_warnings))


def _check_in_worker(spec: str, what: _Resolved | Isolated,
                     declared: Declarations | None, profile: str, seed: int | None,
                     strict: bool, devices: Sequence[str] | None,
                     checks: Sequence[str] | None,
                     replay: Case | None = None) -> tuple[list[CheckResult], Interfaces]:
    """One target's verdicts (and interfaces), in a spawned process: an in-process one is
    resolved again there by its IMPL (expected failures and declarations travel along: they may
    come from files or flags the process never saw)."""
    torch.set_num_threads(1)  # the processes share the cores between them
    if isinstance(what, _Resolved):
        (impl,) = [i for i in resolve(spec, declared) if i.name == what.name]
        what = replace(impl, expected_failures=what.expected_failures,
                       expected_warnings=what.expected_warnings)
    interfaces: Interfaces = {}
    results = _results(Runner(profile, seed, strict=strict, replay=replay), spec, what,
                       declared, devices, checks, interfaces)
    return results, interfaces


def check_many(targets: Sequence[Target], *, profile: str = "quick",
               devices: Sequence[str] | None = None, checks: Sequence[str] | None = None,
               seed: int | None = None, jobs: int = 1,
               declared: Declarations | None = None, strict: bool = False,
               progress: ProgressLine | None = None,
               interfaces: Interfaces | None = None,
               replay: Case | None = None) -> list[CheckResult]:
    """Verdicts for several implementations, ``jobs`` at a time; results in input order.

    ``targets`` pairs each implementation with the IMPL string (and ``declared``, the
    declarations) that resolve to it, so a worker process can find it again; an
    :class:`Isolated` target's implementations run in worker processes of their own. The
    verdicts don't depend on ``jobs``. ``strict`` promotes warnings to failures. ``interfaces``,
    when given, receives what each implementation declares and what was inferred. ``replay``
    runs the checks on that one case instead of a search (see :class:`Runner`). Raises
    :class:`BadInput` when an isolated implementation is not checkable.
    """
    interfaces = interfaces if interfaces is not None else {}
    if jobs <= 1 or len(targets) <= 1:
        runner = Runner(profile, seed, strict=strict, progress=progress, replay=replay)
        return [result for spec, what in targets
                for result in _results(runner, spec, what, declared, devices, checks,
                                       interfaces)]
    # Spawned, not forked: torch's thread pools don't survive a fork.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(targets)), mp_context=context) as pool:
        futures = [pool.submit(_check_in_worker, spec, _travelling(what), declared, profile,
                               seed, strict, devices, checks, replay)
                   for spec, what in targets]
        results: list[CheckResult] = []
        start = time.perf_counter()
        for future in futures:
            done, seen = future.result()
            interfaces.update(seen)
            if progress is not None:
                for name in dict.fromkeys(r.implementation for r in done):
                    progress.finished(name, [r for r in done if r.implementation == name],
                                      time.perf_counter() - start)
            results += done
        return results


def check(target: object, *, profile: str = "quick", devices: Sequence[str] | None = None,
          checks: Iterable[str] | None = None, seed: int | None = None, strict: bool = False,
          declare: Mapping[str, object] | None = None,
          replay: Case | str | None = None) -> list[CheckResult]:
    """Run the catalogue on an implementation; one result per (implementation, check, device).

    ``target`` is what the command line takes: an ``nn.Module`` class (inferred), an instance
    (through its class), a core attention function, an :class:`Implementation` (or several), a
    :class:`Subject`, a registered name or an IMPL string. ``declare`` overrides inference with
    the command line's declarations in their TOML spellings (``{"causal": "always"}``), over what
    the nearest ``pyproject.toml`` declares. ``devices`` defaults to every available one;
    ``checks`` to the whole catalogue (an unknown name is a ValueError with a suggestion).
    Expected failures declared by the implementation come back as ``expected-failure``;
    robustness findings as ``warning``, or as failures with ``strict=True``. ``replay`` runs the
    checks on that one falsifying example (a ``Case`` or its text, as a report prints it).
    """
    from conformance.model.declarations import from_mapping

    names = list(checks) if checks is not None else None
    problem = unknown_checks(names or [])
    if problem:
        raise ValueError(problem)
    case = Case.parse(replay) if isinstance(replay, str) else replay
    runner = Runner(profile, seed, strict=strict, replay=case)
    if isinstance(target, Subject):
        return runner.run(target, devices=devices, checks=names)
    stated = from_mapping(dict(declare or {}), "check(declare=...)") if declare else None
    return [result for impl in implementations_of(target, stated)
            for result in runner.run(InProcessSubject(impl), devices=devices, checks=names)]
