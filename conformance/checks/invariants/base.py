"""What every check shares: the context it runs in, how it explores cases, how it fails."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from hypothesis import example, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky, Unsatisfiable, UnsatisfiedAssumption

from conformance.checks.invariants.budget import Budget, BudgetSpent
from conformance.checks.invariants.limits import REFUSED, Limits, limit_key, unfit_words
from conformance.checks.invariants.verify import (
    expect_finite_rows,
    expect_output,
    reference_applies,
    revealing,
)
from conformance.checks.invariants.violation import CheckFailed, Finding, Severity, Violation, as_warning
from conformance.checks.invariants.violation import reports_earlier_call as _repeated
from conformance.checks.mask_mistakes import Mistake, output_mistake
from conformance.checks.probes import ProbeUnfit
from conformance.generation.cases import Case
from conformance.generation.profiles import inside_a_users_search, keep_examples
from conformance.generation.search_source import strategies_only
from conformance.model.remedies import Remedy
from conformance.model.results import Route
from conformance.model.spec import Capabilities, Config
from conformance.subject.boundary import ImplementationError, Inputs, Instance, Subject


class FirstCall(NamedTuple):
    """A built instance, the case's inputs, its output, and the rows (B, Lq) with keys."""

    instance: Instance
    inputs: Inputs
    output: torch.Tensor
    rows: torch.Tensor


@dataclass
class CheckContext:
    """Everything a check may use: the subject, its effective capabilities, the device, settings."""

    subject: Subject
    capabilities: Capabilities
    device: str
    settings: settings
    seed: int | None = None
    observations: list[str] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    """Robustness findings (see ``explore``): WARNED where one is and no failure."""
    broken: dict[str, str] = field(default_factory=dict)
    """Declared features the gate saw fail, ``{feature: problem}`` (see GateOutcome)."""
    on_example: Callable[[], None] | None = None
    """Called for every example tried (the progress line)."""
    precision: dict[torch.dtype, torch.dtype] = field(default_factory=dict)
    """Dtypes the implementation computes at a lower precision than it runs in, measured by the
    gate: ``{float64: float32}`` for one that computes part of attention in float32."""
    replay: Case | None = None
    """A falsifying example to verify alone: every search of the check is that one case (a
    reproduction, deterministic: the case carries its inputs' seed)."""
    limits: Limits = field(default_factory=Limits)
    """Configurations re-probed after a call raised inside a check (see
    :mod:`conformance.checks.invariants.limits`), shared by the checks of one implementation on
    one device, so each is probed once."""
    unfit: list[str] = field(default_factory=list)
    """Why searches of this check found no case at all (see ``explore``); where every search
    did, the check is skipped with the first reason."""
    searches: int = 0
    doubts: dict[str, None] = field(default_factory=dict)  # why a measurement had no case
    examples_key: bytes | None = None
    """Where the settings' example database keeps this check's failing examples (by
    implementation, check and device; see ``keep_examples``): None where it has none."""
    route: Route | None = None  # what the check judged through, where it has two ways
    budget: Budget = field(default_factory=lambda: Budget(None))
    _refused_keys: list[Config] = field(default_factory=list, repr=False)

    def rows(self, case: Case) -> torch.Tensor:
        """(B, Lq) bool on the CPU: the output rows attention specifies. Rows with a key to
        attend to (the others are the fully_masked check's); and in self-attention, where the
        mask pads the queries too, only the kept positions unless padded queries are declared
        to attend like any other (``any``): what a layer outputs at a padded query is
        unspecified (libraries zero those rows, or let them attend to themselves, by design;
        a declared ``zero`` or ``self`` is the padding check's)."""
        rows = case.attendable_rows()
        caps = self.capabilities
        if caps.call == "self" and case.kept is not None and caps.padded_queries != "any":
            rows = rows & case.keep().cpu()[:, : case.q_len]
        return rows

    def judged(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype whose tolerances judge a run in ``dtype``."""
        return self.precision.get(dtype, dtype)

    def doubt(self, words: str | None, hint: str, remedy: Remedy | None = None) -> None:
        """Record ``words`` (what inference could not settle, where it is set) as a warning with
        no case: an intent behaviour can't tell; ``hint`` says why, ``remedy`` what to declare."""
        if words:
            self.warnings.append(Finding(Violation(words, severity="warn", hint=hint,
                                                   remedy=remedy), None))

    def observe(self, note: str) -> None:
        if note not in self.observations:
            self.observations.append(note)

    def explore(self, strategy: st.SearchStrategy[Case], verify: Callable[[Case], str | None],
                examples: Sequence[Case] = (), max_examples: int | None = None,
                severity: Severity = "fail") -> None:
        """Run ``verify`` over generated cases; on failure raise CheckFailed with the shrunk case.

        ``verify`` raises Violation (or ImplementationError) when the property fails, and may
        return a note on behaviour worth reporting. ``examples`` are always tried first;
        ``max_examples`` caps the profile's count for expensive properties.

        ``severity="warn"`` explores a robustness property (inputs beyond the normal range): any
        violation there is recorded as a warning (shrunk) instead of raised. In a ``fail``
        exploration, a Violation raised with ``severity="warn"`` is recorded without stopping
        the search, so a warning never hides a failure; it is shrunk afterwards.
        """
        first_warning: dict[str, Finding] = {}
        verify = self._within_budget(self._within_limits(verify))

        def fail_tier(case: Case) -> str | None:
            try:
                return verify(case)
            except (Violation, ImplementationError) as error:
                if _repeated(error) or self._severity(error, case) != "warn":
                    raise
                first_warning.setdefault("found", Finding(self._as_warning(error, case), case))
                return None

        def warn_tier(case: Case) -> str | None:
            try:
                return verify(case)
            except (Violation, ImplementationError) as error:
                if _repeated(error):
                    raise
                if self._severity(error, case) == "warn":
                    raise self._as_warning(error, case) from error
                # A failure found while shrinking a warning is still a failure.
                raise CheckFailed(error, case) from error

        if severity == "warn":
            finding = self._search(strategy, verify, examples, max_examples)
            if finding is not None:
                self.warnings.append(Finding(as_warning(finding.error), finding.case))
            return
        finding = self._search(strategy, fail_tier, examples, max_examples)
        if finding is not None:
            raise CheckFailed(finding.error, finding.case) from finding.error
        if first_warning:
            # Search again, letting the warning raise, so hypothesis shrinks it (where the
            # budget stops that search, the warning as first found).
            found = first_warning["found"]
            finding = self._search(strategy, warn_tier, (found.case, *examples), max_examples)
            if finding is not None:
                self.warnings.append(finding)
            elif self.budget.cut:
                self.warnings.append(found)

    def _within_budget(self, verify: Callable[[Case], str | None]
                       ) -> Callable[[Case], str | None]:
        """``verify``, started only while the check's budget allows (else BudgetSpent)."""
        def within(case: Case) -> str | None:
            self.budget.allow()
            return verify(case)
        return within

    def _within_limits(self, verify: Callable[[Case], str | None]
                       ) -> Callable[[Case], str | None]:
        """``verify``, where a case at a configuration the implementation refuses (see
        :mod:`conformance.checks.invariants.limits`) is no example: rejected, as generation would
        have left it out had the gate's probe tried it, and said once per check."""
        def call(probe: Case) -> None:
            self.run(self.build(probe), probe.inputs(self.capabilities.call), probe)

        # UnsatisfiedAssumption is what hypothesis' reject() raises; raised directly, it also
        # means "no example" to a replay, which runs outside a search.
        def within(case: Case) -> str | None:
            if self.limits.known(case):
                self._refused(limit_key(case))  # found by another check: said here too
                raise UnsatisfiedAssumption()
            try:
                return verify(case)
            except ProbeUnfit as unfit:  # no case for a measurement: the instrument's doubt
                self.doubts.setdefault(str(unfit).splitlines()[0], None)
                raise UnsatisfiedAssumption() from unfit
            except ImplementationError as error:
                if error.fatal or _repeated(error) or not self.limits.probe(
                        case, call, self.capabilities):
                    raise
                self._refused(limit_key(case))
                raise UnsatisfiedAssumption() from error
        return within

    def _refused(self, key: Config) -> None:
        """Say every configuration this check found refused, in one observation kept current."""
        self.observations[:] = [o for o in self.observations if not o.startswith(REFUSED)]
        self._refused_keys = list(dict.fromkeys([*self._refused_keys, key]))
        self.observations.append(self.limits.note(self._refused_keys))

    def _severity(self, error: BaseException, case: Case) -> Severity:
        """``warn`` for a warning, and for anything found in a dtype that was only assumed,
        except the end of the implementation's process (a hang, a crash, an exit: no dtype
        explains those away)."""
        if isinstance(error, Violation) and error.severity == "warn":
            return "warn"
        if isinstance(error, ImplementationError) and error.fatal:
            return "fail"
        return "warn" if case.config.dtype in self.capabilities.assumed_dtypes else "fail"

    @staticmethod
    def _as_warning(error: BaseException, case: Case) -> Violation:
        """``error`` as a warning; a finding in an assumed dtype says why it is one."""
        if isinstance(error, Violation) and error.severity == "warn":
            return error
        warning = as_warning(error)
        warning.summary = (f"in {case.dtype}, which was assumed rather than declared: "
                           f"{warning.summary}")
        warning.args = (warning.summary,)
        return warning

    def _search(self, strategy: st.SearchStrategy[Case], verify: Callable[[Case], str | None],
                examples: Sequence[Case], max_examples: int | None) -> Finding | None:
        """Hypothesis over ``strategy``: None when ``verify`` holds throughout, else the error
        and the shrunk case."""
        self.budget.search()
        self.searches += 1
        if self.replay is not None:
            return self._replayed(verify)
        last: dict[str, Case] = {}
        first: dict[str, Finding] = {}

        # Keep this function's source as it is: hypothesis seeds a derandomized search from it
        # (function_digest), so an edit here changes every check's examples, and verdicts.
        def property_holds(case: Case) -> None:
            last["case"] = case
            if self.on_example is not None:
                self.on_example()
            try:
                note = verify(case)
            except (Violation, ImplementationError) as error:
                if _repeated(error):
                    # The call was not run (its check already lost the implementation to a hang
                    # or a crash): nothing is known about this example.
                    reject()
                first.setdefault("finding", Finding(error, case))
                raise
            if note:
                self.observe(note)

        with inside_a_users_search():
            test = given(strategy)(property_holds)
        for case in examples:
            test = example(case)(test)
        chosen = self.settings
        if max_examples is not None:
            chosen = settings(chosen, max_examples=min(chosen.max_examples, max_examples))
        test = settings(chosen)(test)
        if self.seed is not None:
            test = hypothesis_seed(self.seed)(test)
        keep_examples(test, self.examples_key, self.searches)
        try:
            with strategies_only():
                test()
        except BudgetSpent:
            # A failure found before the budget ran out (its shrinking cut short) stands, as
            # first found; otherwise the search ends with what it ran.
            if "finding" in first:
                self.budget.unshrunk = True
                return first["finding"]
            self.budget.stopped(len(examples) + chosen.max_examples)
            return None
        except (Violation, ImplementationError) as error:
            # Hypothesis replays the minimal example last, so `last` holds the shrunk case.
            return Finding(error, last.get("case"))
        except Unsatisfiable:
            if not self._refused_keys:
                # No case at all: none it needs fits what the module builds for, or its
                # instrument does not fit the module (said as it is).
                self.unfit.append(next(iter(self.doubts), None) or unfit_words(self.capabilities.shapes))
                return None
            # Every case was rejected: each at a configuration the implementation refuses.
            return Finding(Violation(
                "every case this check generated is at a configuration the implementation "
                "refuses (every call fails there: " + "; ".join(self.limits.refused(self._refused_keys)[:2])
                + "), so the property could not be checked anywhere",
                hint="the gate's configuration runs, these do not: a feature the check needs "
                     "(grouped key/value heads, a window, a dtype) fails at every size tried"),
                last.get("case"))
        except Flaky:
            # A failure that could not be replayed: a call that hung or crashed the
            # implementation's process, after which calls are not run. The case that did it is
            # the evidence (it could not be shrunk).
            if "finding" in first:
                return first["finding"]
            raise
        return None

    def _replayed(self, verify: Callable[[Case], str | None]) -> Finding | None:
        """``verify`` on the replayed case alone: None when the property holds there."""
        if self.on_example is not None:
            self.on_example()
        try:
            note = verify(self.replay)
        except (Violation, ImplementationError) as error:
            return Finding(error, self.replay)
        except UnsatisfiedAssumption:
            return None  # a limit of its configurations (observed), or no case for this search
        if note:
            self.observe(note)
        return None

    # Helpers shared by the invariants: building, calling, validating.

    def build(self, case: Case) -> Instance:
        return self.subject.instantiate(case.config, case.seed)

    def first_call(self, case: Case, *, finite: bool = False) -> FirstCall:
        """Build for ``case`` and call it once with the case's inputs (output validated); with
        ``finite``, every row that has a key to attend to must be finite."""
        instance = self.build(case)
        inputs = case.inputs(self.capabilities.call)
        output = self.run(instance, inputs, case)
        rows = self.rows(case)
        if finite:
            expect_finite_rows(output, rows)
        return FirstCall(instance, inputs, output, rows)

    def run(self, instance: Instance, inputs: Inputs, case: Case) -> torch.Tensor:
        """Forward, with the output's shape, dtype and device validated."""
        output = instance.forward(inputs)
        expect_output(output, case, inputs)
        return output

    @staticmethod
    def hint(measure: Callable[[], str | None]) -> str | None:
        """``measure()``, the likely bug a failure's evidence shows, or None where measuring it
        fails in any way: a hint is extra evidence, and failing to gather it must never change
        the verdict or the reason it goes with."""
        try:
            return measure()
        except Exception:  # any failure of the measurement means "no hint" (see above)
            return None

    def mask_mistake(self, case: Case, *,
                     only: tuple[Mistake, ...] | None = None) -> Mistake | None:
        """The mask mistake (see :mod:`conformance.checks.mask_mistakes`) the module's output
        reproduces on ``case`` or, where that case shows none, on its :func:`revealing` case;
        None without weight access, with a position encoding the reference does not model, or
        when a measurement fails. ``only`` restricts the mistakes tried to those."""
        if not reference_applies(self.capabilities):
            return None
        for tried in (case, revealing(self.capabilities, case)):
            if tried is None:
                continue
            try:
                instance = self.build(tried)
                inputs = tried.inputs(self.capabilities.call)
                output = self.run(instance, inputs, tried)
                found = output_mistake(output, instance.read_weights(), inputs,
                                       causal=tried.causal, rows=self.rows(tried),
                                       window=tried.window, encoding=self.capabilities.encoding,
                                       only=only)
            except (Violation, ImplementationError):
                return None
            if found is not None:
                return found
        return None


class Check(ABC):
    """One named check of the catalogue. Its docstring states the property it checks."""

    name: str
    title: str
    owns: tuple[str, ...] = ()
    """Declared features this check reports when the gate saw them break (see GateOutcome)."""
    judges: tuple[str, ...] = ()
    """Features whose behaviour this check is the judge of (``padding``: the mask): where it
    failed, a check that requires it can run without them (see Runner.run_check's
    ``without``), so one mistake is charged once."""

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        """Why this check does not apply to an implementation declaring ``capabilities``."""
        return None

    def device_skip_reason(self, device: str) -> str | None:
        """Why this check does not run on ``device``."""
        return None

    @abstractmethod
    def run(self, context: CheckContext) -> None:
        """Check the property; raise CheckFailed when it does not hold."""
