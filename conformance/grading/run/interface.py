"""The interface conditions a rubric prescribes beyond what the checks judge.

- ``returns = "tensor"``: forward returns one plain tensor, nothing else. A tuple, or a subclass
  of ``torch.Tensor``, breaks it; the gate's basic call fails with that evidence.
- ``constructor = ["positional", "keyword"]``: the class builds in every listed form. The checks
  run on the first form; each other one is loaded once (interface inference builds the class that
  way and calls it), and a form that does not build breaks the condition.

A target that breaks a condition is an ``interface mismatch``: no check of it is scored (zero for
that class), and the reason is the target's message, which the feedback shows.
"""

from __future__ import annotations

from dataclasses import replace

from conformance.grading.score.rubric import Target
from conformance.model.results import CheckResult, Status
from conformance.subject.boundary import NOT_A_PLAIN_TENSOR, NOT_A_TENSOR

FORM_WORDS = {"keyword": "with keyword arguments", "positional": "with positional arguments"}


def broken_return(target: Target, gate: CheckResult | None) -> str | None:
    """Why ``target``'s declared one-tensor return is broken, from the gate's result; None when
    nothing says so (not declared, or the gate failed for another reason)."""
    if target.declarations.returns != "tensor" or gate is None or gate.status is not Status.FAILED:
        return None
    reason = gate.reason or ""
    if "forward returned " in reason and (NOT_A_TENSOR in reason or NOT_A_PLAIN_TENSOR in reason):
        return f"forward must return one tensor, nothing else: {reason}"
    return None


def other_forms(target: Target) -> tuple[str, ...]:
    """The constructor forms to try besides the one the checks run on."""
    return target.constructor_forms[1:]


def declared_form(target: Target, form: str):
    """``target``'s declarations with the constructor built ``form``-wise."""
    return replace(target.declarations, constructor=form)


def broken_form(form: str, class_name: str, error: str) -> str:
    """The mismatch message for a constructor form that does not build."""
    return f"the constructor must also work {FORM_WORDS[form]} ({class_name}): {error}"
