"""The likely bug behind an output that disagrees with the float64 reference, named only where
the evidence tells it apart: the shared hint of ``reference`` and ``head_split``.

Where the shrunk case can't tell two mistakes apart (one head of width 1: 1/sqrt(num_heads) and
1/sqrt(d_model) are the same number), or can't tell any from the correct output (a minimal causal
case: the one row with two keys differs by less than a match's tolerance), the diagnosis runs
again on the same case at a size where every recognisable scale differs (2 heads of 4), and names
the one that matches there: the hint then names one bug (a kind,
:class:`conformance.model.results.Hint`), as the scale check does.

Behind a row that has keys to attend to and is NaN or inf, the likely bug is a mask applied
wrongly: :func:`expect_finite_or_mask_mistake` names the one the case shows, for every check that
first asks for finite rows.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.diagnosis import AMBIGUOUS, explain, scale_groups
from conformance.checks.invariants.base import CheckContext
from conformance.checks.invariants.verify import expect_finite_rows
from conformance.checks.invariants.violation import Violation
from conformance.checks.mask_mistakes import named
from conformance.generation.cases import Case
from conformance.model.results import Hint
from conformance.model.spec import Capabilities
from conformance.subject.boundary import Inputs, Instance

APART = ((2, 4), (2, 8), (4, 4), (4, 8), (2, 16))
"""(heads, head_dim) tried, in order, for a size where every recognisable scale differs."""


def scales_apart(capabilities: Capabilities, case: Case) -> Case | None:
    """``case`` at a size where every recognisable scale is a different number (and the module
    builds for it), or None."""
    for heads, head_dim in APART:
        if capabilities.shapes is not None and (heads, head_dim) not in capabilities.shapes:
            continue
        if case.kv_heads and heads % case.kv_heads:
            continue
        if all(AMBIGUOUS not in words for words, _ in scale_groups(head_dim, heads)):
            return replace(case, num_heads=heads, head_dim=head_dim)
    return None


def _explained(context: CheckContext, case: Case, instance: Instance, inputs: Inputs,
               output: torch.Tensor, rows: torch.Tensor) -> str | None:
    return explain(output, instance.read_weights(), inputs, causal=case.causal, rows=rows,
                   window=case.window, chunk=case.chunk, encoding=context.capabilities.position.encoding)


def likely_bug(context: CheckContext, case: Case, instance: Instance, inputs: Inputs,
               output: torch.Tensor, rows: torch.Tensor) -> str | None:
    """The known mistake ``output`` reproduces (told apart at another size where this one can't
    tell), else the mask mistake it shows, else None."""
    words = _explained(context, case, instance, inputs, output, rows)
    # Where this case can't tell (several scales one number, or every mistake too close to the
    # correct output at a minimal size: a causal row of two keys), at a size that can.
    if words is None or AMBIGUOUS in words:
        other = scales_apart(context.capabilities, case)
        if other is not None:
            def again() -> str | None:
                built = context.build(other)
                other_inputs = other.inputs(context.capabilities.call)
                return _explained(context, other, built, other_inputs,
                                  context.run(built, other_inputs, other), context.rows(other))

            told = context.hint(again)
            if told is not None and AMBIGUOUS not in told:
                why = ("several scales are one number" if words is not None else
                       "the mistake and the correct output are too close to tell")
                return Hint(f"{told} (told apart at {other.num_heads} heads of "
                            f"{other.head_dim}: at this case's size {why})",
                            getattr(told, "kind", None))
    return words or named(context.mask_mistake(case))


def expect_finite_or_mask_mistake(context: CheckContext, case: Case, output: torch.Tensor,
                                  rows: torch.Tensor) -> None:
    """Raise Violation if an output row in ``rows`` (one with keys to attend to) is NaN or inf
    (:func:`~conformance.checks.invariants.verify.expect_finite_rows`), its hint the mask mistake
    ``case`` shows, if any."""
    try:
        expect_finite_rows(output, rows)
    except Violation as violation:
        violation.hint = context.hint(lambda: named(context.mask_mistake(case)))
        raise
