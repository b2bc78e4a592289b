"""What every check shares: the context it runs in, how it explores cases (through its
:class:`~conformance.checks.invariants.search.Search`), how it fails."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import torch
from hypothesis import strategies as st

from conformance.checks.invariants.search import Search
from conformance.checks.invariants.verify import (
    expect_finite_rows,
    expect_output,
    reference_applies,
    revealing,
)
from conformance.checks.invariants.violation import Finding, OtherKind, Severity, Violation
from conformance.checks.mask_mistakes import Mistake, output_mistake
from conformance.generation.cases import Case
from conformance.model.normaliser import Normaliser
from conformance.model.remedies import Remedy
from conformance.model.results import Route
from conformance.model.spec import Capabilities
from conformance.subject.boundary import ImplementationError, Inputs, Instance, Subject


class FirstCall(NamedTuple):
    """A built instance, the case's inputs, its output, and the rows (B, Lq) with keys."""

    instance: Instance
    inputs: Inputs
    output: torch.Tensor
    rows: torch.Tensor


@dataclass
class CheckContext:
    """Everything a check may use: the subject, its effective capabilities, the device, its search."""

    subject: Subject
    capabilities: Capabilities
    device: str
    search: Search
    """How the check's searches run (hypothesis' settings, budget, limits, replay, database)
    and what they found: its observations and warnings."""
    broken: dict[str, str] = field(default_factory=dict)
    """Declared features the gate saw fail, ``{feature: problem}`` (see GateOutcome)."""
    precision: dict[torch.dtype, torch.dtype] = field(default_factory=dict)
    """Dtypes the implementation computes at a lower precision than it runs in, measured by the
    gate: ``{float64: float32}`` for one that computes part of attention in float32."""
    route: Route | None = None  # what the check judged through, where it has two ways

    @property
    def observations(self) -> list[str]:
        return self.search.observations

    @property
    def warnings(self) -> list[Finding]:
        """Robustness findings (see ``explore``): WARNED where one is and no failure."""
        return self.search.warnings

    @property
    def on_example(self) -> Callable[[], None] | None:
        """Called for every example tried (the progress line)."""
        return self.search.on_example

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
        self.search.observe(note)

    def explore(self, strategy: st.SearchStrategy[Case], verify: Callable[[Case], str | None],
                examples: Sequence[Case] = (), max_examples: int | None = None,
                severity: Severity = "fail") -> None:
        """Run ``verify`` over generated cases; on failure raise CheckFailed with the shrunk case
        (see :meth:`Search.explore <conformance.checks.invariants.search.Search.explore>`, whose
        docstring says how)."""
        self.search.explore(self, strategy, verify, examples, max_examples, severity)

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
                                       window=tried.window, chunk=tried.chunk,
                                       encoding=self.capabilities.position.encoding, only=only)
            except (Violation, ImplementationError):
                return None
            if found is not None:
                return found
        return None


class Structure(str, Enum):
    """What a check requires of the structure observed in an implementation (beyond what it
    declares): where it is not observed, the check says what was, in one line, and skips."""

    SOFTMAX = "softmax"
    """A softmax over the keys turns the logits into the weights (nothing else was observed:
    :mod:`conformance.inference.steps.normaliser`)."""


STRUCTURE_WORDS = {Structure.SOFTMAX: "a softmax over the keys (observed; another normaliser "
                                      "is said instead)"}
"""Each requirement in the words of ``list --checks`` and docs/checks.md."""


def observed_normaliser(capabilities: Capabilities) -> Normaliser | None:
    """The map from logits to weights inference observed, where it is no softmax over the keys
    (None where it is one)."""
    encoding = capabilities.position.encoding
    return encoding.normaliser if encoding is not None else None


def unmet(requires: frozenset[Structure], capabilities: Capabilities, what: str) -> str | None:
    """Why a check that requires ``requires`` of the observed structure, to judge ``what``,
    does not apply: the structure observed instead, in one line (what the layer is, as a
    feature it lacks is: no instrument failed); None where all of it holds."""
    normaliser = observed_normaliser(capabilities)
    if Structure.SOFTMAX in requires and normaliser is not None:
        return OtherKind(f"its weights are {normaliser.describe()} (observed: "
                         f"{normaliser.evidence}): {what} is a property of a softmax over the "
                         "keys")
    return None


class Check(ABC):
    """One named check of the catalogue. Its docstring states the property it checks."""

    requires: frozenset[Structure] = frozenset()
    """What it requires of the observed structure (``Structure``); said in ``list --checks``."""
    judged: str = ""
    """What it judges of that structure, in words, for the line that says it does not hold."""

    def unmet(self, capabilities: Capabilities) -> str | None:
        """Why the structure observed does not admit this check (see :func:`unmet`)."""
        return unmet(self.requires, capabilities, self.judged or self.title)

    def why_not(self, capabilities: Capabilities) -> str | None:
        """Why it does not apply: the structure observed (said first), or what it declares."""
        return self.unmet(capabilities) or self.skip_reason(capabilities)

    name: str
    order: int
    """Where it runs and reports among the checks, ascending (gaps of 10 leave room): the
    contract, the mask, softmax's and any attention's properties, numerics, training, then the
    modern forms and the kernel's. A module of ``conformance/checks/invariants`` with a check
    that sets it is in the catalogue (:mod:`conformance.checks.catalogue`)."""
    title: str
    applies: str = "every implementation"
    """When it runs, in words (``list --checks``): what an implementation must have for it;
    its skip reason says which one an implementation lacks."""
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
