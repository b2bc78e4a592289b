"""A check's search engine: hypothesis over generated cases, within the check's budget and the
implementation's limits, replaying one case instead where a reproduction asks for it.

:class:`Search` owns what a search runs with (hypothesis' settings and seed, the example database's
key, the time budget, the limits re-probed, the replayed case) and what it finds (observations,
warnings, why a search found no case); :class:`~conformance.checks.invariants.base.CheckContext`
explores through it (``context.explore``), saying what is searched: the subject's capabilities,
and how to build and call it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from hypothesis import example, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Flaky, Unsatisfiable, UnsatisfiedAssumption

from conformance.checks.invariants.budget import Budget, BudgetSpent
from conformance.checks.invariants.limits import REFUSED, ConfigurationLimits, limit_key, unfit_words
from conformance.checks.invariants.violation import CheckFailed, Finding, Severity, Violation, as_warning
from conformance.checks.invariants.violation import reports_earlier_call as _repeated
from conformance.generation.cases import Case
from conformance.generation.profiles import inside_a_users_search, keep_examples
from conformance.generation.replay_fit import ANY, Drawn, drawn_of, misfit
from conformance.generation.search_source import strategies_only
from conformance.inference.observing.attention_probe import ProbeUnfit
from conformance.model.spec import Capabilities, Config
from conformance.subject.boundary import ImplementationError, Inputs, Instance


def _failures_kept(verify: Callable[[Case], str | None]) -> Callable[[Case], str | None]:
    """``verify``, raising again, without running it, what it raised on a case it failed on
    before: hypothesis replays the shrunk case once more to report it, and a warning's second
    search starts from the case that found it, so a failing case was verified two or three
    times (the float16 positions case of 2,056 tokens: a second each). A module that answers
    otherwise the second time is judged by its first answer, at the shrunk case (a replay that
    passed made the search flaky, and the first failure, unshrunk, was reported). Passing cases
    are not kept: hypothesis asks for none twice."""
    failed: dict[Case, BaseException] = {}

    def kept(case: Case) -> str | None:
        if case in failed:
            raise failed[case]
        try:
            return verify(case)
        except (Violation, ImplementationError) as error:
            failed[case] = error
            raise
    return kept


class Searched(Protocol):
    """What a search is of (a CheckContext): the capabilities its cases are generated for, and how
    to build and call the subject, for re-probing a configuration a call failed at."""

    @property
    def capabilities(self) -> Capabilities: ...

    def build(self, case: Case) -> Instance: ...

    def run(self, instance: Instance, inputs: Inputs, case: Case) -> torch.Tensor: ...


@dataclass
class Search:
    """The searches of one check: how they run, and what they found (see ``explore``)."""

    settings: settings
    seed: int | None = None
    on_example: Callable[[], None] | None = None
    """Called for every example tried (the progress line)."""
    replay: Case | None = None
    """A falsifying example to verify alone: every search of the check is that one case (a
    reproduction, deterministic: the case carries its inputs' seed)."""
    limits: ConfigurationLimits = field(default_factory=ConfigurationLimits)
    """Configurations re-probed after a call raised inside a check (see
    :mod:`conformance.checks.invariants.limits`), shared by the checks of one implementation on
    one device, so each is probed once."""
    examples_key: bytes | None = None
    """Where the settings' example database keeps this check's failing examples (by
    implementation, check and device; see ``keep_examples``): None where it has none."""
    budget: Budget = field(default_factory=lambda: Budget(None))
    observations: list[str] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    """Robustness findings (see ``explore``): WARNED where one is and no failure."""
    unfit: list[str] = field(default_factory=list)
    """Why searches of this check found no case at all (see ``explore``); where every search
    did, the check is skipped with the first reason."""
    searches: int = 0
    doubts: dict[str, None] = field(default_factory=dict)  # why a measurement had no case
    _refused_keys: list[Config] = field(default_factory=list, repr=False)

    def observe(self, note: str) -> None:
        if note not in self.observations:
            self.observations.append(note)

    def explore(self, searched: Searched, strategy: st.SearchStrategy[Case],
                verify: Callable[[Case], str | None], examples: Sequence[Case] = (),
                max_examples: int | None = None, severity: Severity = "fail") -> None:
        """Run ``verify`` over generated cases of ``searched``; on failure raise CheckFailed with
        the shrunk case.

        ``verify`` raises Violation (or ImplementationError) when the property fails, and may
        return a note on behaviour worth reporting. ``examples`` are always tried first;
        ``max_examples`` caps the profile's count for expensive properties.

        ``severity="warn"`` explores a robustness property (inputs beyond the normal range): any
        violation there is recorded as a warning (shrunk) instead of raised. In a ``fail``
        exploration, a Violation raised with ``severity="warn"`` is recorded without stopping
        the search, so a warning never hides a failure; it is shrunk afterwards.
        """
        first_warning: dict[str, Finding] = {}
        caps = searched.capabilities
        verify = self._within_budget(self._within_limits(searched, _failures_kept(verify)))

        def fail_tier(case: Case) -> str | None:
            try:
                return verify(case)
            except (Violation, ImplementationError) as error:
                if _repeated(error) or self._severity(error, case, caps) != "warn":
                    raise
                first_warning.setdefault("found", Finding(self._as_warning(error, case), case))
                return None

        def warn_tier(case: Case) -> str | None:
            try:
                return verify(case)
            except (Violation, ImplementationError) as error:
                if _repeated(error):
                    raise
                if self._severity(error, case, caps) == "warn":
                    raise self._as_warning(error, case) from error
                # A failure found while shrinking a warning is still a failure.
                raise CheckFailed(error, case) from error

        if severity == "warn":
            finding = self._search(caps, strategy, verify, examples, max_examples)
            if finding is not None:
                self.warnings.append(Finding(as_warning(finding.error), finding.case))
            return
        finding = self._search(caps, strategy, fail_tier, examples, max_examples)
        if finding is not None:
            raise CheckFailed(finding.error, finding.case) from finding.error
        if first_warning:
            # Search again from the case that found it, letting the warning raise. Hypothesis
            # reports a failing explicit example as it is, unshrunk: the warning stands at the
            # case first found (verified once: _failures_kept). Whether to shrink warnings (by
            # searching without that example) is open: it would change every warning's case.
            found = first_warning["found"]
            finding = self._search(caps, strategy, warn_tier, (found.case, *examples), max_examples)
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

    def _within_limits(self, searched: Searched, verify: Callable[[Case], str | None]
                       ) -> Callable[[Case], str | None]:
        """``verify``, where a case at a configuration the implementation refuses (see
        :mod:`conformance.checks.invariants.limits`) is no example: rejected, as generation would
        have left it out had the gate's probe tried it, and said once per check."""
        def call(probe: Case) -> None:
            searched.run(searched.build(probe), probe.inputs(searched.capabilities.call), probe)

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
                        case, call, searched.capabilities):
                    raise
                self._refused(limit_key(case))
                raise UnsatisfiedAssumption() from error
        return within

    def _refused(self, key: Config) -> None:
        """Say every configuration this check found refused, in one observation kept current."""
        self.observations[:] = [o for o in self.observations if not o.startswith(REFUSED)]
        self._refused_keys = list(dict.fromkeys([*self._refused_keys, key]))
        self.observations.append(self.limits.note(self._refused_keys))

    @staticmethod
    def _severity(error: BaseException, case: Case, capabilities: Capabilities) -> Severity:
        """``warn`` for a warning, and for anything found in a dtype that was only assumed,
        except the end of the implementation's process (a hang, a crash, an exit: no dtype
        explains those away)."""
        if isinstance(error, Violation) and error.severity == "warn":
            return "warn"
        if isinstance(error, ImplementationError) and error.fatal:
            return "fail"
        return "warn" if case.config.dtype in capabilities.floats.assumed else "fail"

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

    def _search(self, capabilities: Capabilities, strategy: st.SearchStrategy[Case],
                verify: Callable[[Case], str | None], examples: Sequence[Case],
                max_examples: int | None) -> Finding | None:
        """Hypothesis over ``strategy``: None when ``verify`` holds throughout, else the error
        and the shrunk case (``capabilities``: what says why a search found no case)."""
        self.budget.search()
        self.searches += 1
        if self.replay is not None:
            return self._replayed(verify, capabilities, drawn_of(strategy) or ANY)
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
                self.unfit.append(next(iter(self.doubts), None) or unfit_words(capabilities.shapes))
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

    def _replayed(self, verify: Callable[[Case], str | None], capabilities: Capabilities,
                  drawn: Drawn) -> Finding | None:
        """``verify`` on the replayed case alone: None when the property holds there, or where
        the case is none this search draws (said: it is not run there)."""
        why = misfit(self.replay, capabilities, drawn)
        if why is not None:
            self.observe(f"the replayed case is not one this search draws ({why}): not run "
                         "there")
            return None
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
