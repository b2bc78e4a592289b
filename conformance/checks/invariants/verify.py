"""The verifications checks share: the output's form, agreement with the float64 reference under
the tolerance rule, finite rows; when the reference and the padding mask apply; a case that
reveals a mask mistake.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.invariants.violation import (
    Lacking,
    Violation,
)
from conformance.generation.cases import Case, own_queries
from conformance.model.forms import PositionEncoding
from conformance.model.spec import Capabilities
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import plain_attention, reference_attention
from conformance.numerics.tolerance import Agreement, agreement, logit_rounding
from conformance.subject.boundary import Inputs
from conformance.subject.output_shape import output_problem

REVEALING_LENGTH = 5
"""Keys of the case a mask mistake is looked for again when the failing case can't show one."""


def revealing(capabilities: Capabilities, case: Case) -> Case | None:
    """``case`` with REVEALING_LENGTH keys (and queries, where they go with the keys), and where
    it has a padding mask, one that masks the last two keys of every batch element: enough to
    tell mask mistakes apart, where a shrunk case often can't (with every key kept an inverted
    mask shows nothing; in two positions a row that sees the next key sees every key). None
    where that is ``case`` itself or the module takes no sequence that long."""
    length = REVEALING_LENGTH
    if capabilities.length_near(length) != length:
        return None
    same_length = case.causal or capabilities.call == "self" or case.q_len == case.kv_len
    kept = None if case.kept is None else (length - 2,) * case.batch
    shown = own_queries(replace(case, q_len=length if same_length else case.q_len, kv_len=length,
                                kept=kept, mask_seed=None), capabilities)
    return None if shown == case else shown


def expect_output(output: torch.Tensor, case: Case, inputs: Inputs) -> None:
    """Raise Violation unless ``output`` is (B, Lq, d_model) in the case's dtype and device
    (a recognisable malformed output, per-head or pooled, named as such: see
    :mod:`conformance.subject.output_shape`)."""
    problem = output_problem(output, tuple(inputs.query.shape), heads=case.num_heads,
                             width=case.d_model, kv_len=inputs.key.shape[1])
    if problem is not None:
        raise Violation(problem.reason, hint=problem.looks_like)
    # Compared as plain tensors: a subclass's own equality may say anything.
    # Only where attention can't give it: over one key (or a window of one), attention
    # without projections returns its input exactly.
    plain = output.as_subclass(torch.Tensor)
    if (inputs.key.shape[1] > 1 and case.window != 1 and plain.shape == inputs.query.shape
            and torch.equal(plain, inputs.query)):
        raise Violation("the output is the input unchanged: no attention is computed",
                        hint="does forward return its input (x, or query) instead of the "
                             "attention output?")
    if output.dtype != inputs.query.dtype:
        raise Violation(f"output dtype is {output.dtype}, inputs are {inputs.query.dtype}",
                        hint="is the output cast on the way out (.double(), .float()), or "
                             "computed in a dtype of its own? return it in the inputs' dtype")
    if output.device.type != torch.device(case.device).type:
        raise Violation(f"output is on {output.device}, inputs are on {case.device}")


def agree_with_reference(output: torch.Tensor, weights: HeadWeights, inputs: Inputs, case: Case,
                         rows: torch.Tensor | None, *, judged: torch.dtype,
                         largest_logit: float = 0.0,
                         reference_weights: HeadWeights | None = None,
                         encoding: PositionEncoding | None = None,
                         dtype_tables: bool = True) -> tuple[Agreement, torch.Tensor]:
    """``output`` against the float64 reference from ``reference_weights`` (default ``weights``),
    under the tolerance rule with the suite's plain attention in the ``judged`` dtype (the run's,
    or the lower one it computes at, see CheckContext.judged) from ``weights`` as the baseline
    (plus the logit-rounding allowance where ``largest_logit`` is given), with the module's
    relative position ``encoding`` applied to both (``dtype_tables``: see
    :func:`~conformance.numerics.reference.plain_attention`). Returns the agreement and the
    reference output."""
    expected = reference_attention(reference_weights or weights, inputs.query, inputs.key,
                                   inputs.value, keep=inputs.keep, causal=case.causal,
                                   window=case.window, chunk=case.chunk, encoding=encoding,
                                   start=inputs.position).output
    baselines = plain_attention(weights, inputs.query, inputs.key, inputs.value, keep=inputs.keep,
                                causal=case.causal, dtype=judged, window=case.window, chunk=case.chunk,
                                encoding=encoding, start=inputs.position,
                                dtype_tables=dtype_tables)
    extra = logit_rounding(judged, largest_logit, expected) if largest_logit else 0.0
    return agreement(output, expected, baselines, judged, rows, extra=extra), expected


def output_disagreement(seen: Agreement, output: torch.Tensor, expected: torch.Tensor, *,
                        against: str, reference: str, mean_error: bool = False) -> Violation:
    """The violation of an ``output`` that disagrees with a float64 reference ``expected`` under
    the tolerance rule (``seen``): the agreement in numbers and where its largest error is
    (``against``: what the reference is, in the summary); in the details both values there
    (``reference``: the reference's name) and the same-dtype baseline's error (and the mean error,
    where ``mean_error``). Its hint is the caller's to measure, once these are read."""
    b, row, feature = seen.worst
    mean = f"mean error {fmt(seen.mean_error)}; " if mean_error else ""
    return Violation(
        f"output differs from the {against}: {seen.describe()}; largest at batch {b}, row {row}, "
        f"feature {feature}",
        details=[f"implementation {fmt(float(output[b, row, feature]))}, {reference} "
                 f"{fmt(float(expected[b, row, feature]))}; {mean}same-dtype baseline error "
                 f"{fmt(seen.baseline_error)}"])


def expect_finite_rows(output: torch.Tensor, rows: torch.Tensor, *,
                       hint: str | None = None) -> None:
    """Raise Violation if an output row in ``rows`` (B, Lq) bool, a row with keys to attend to,
    holds NaN or inf."""
    bad = ~torch.isfinite(output.detach()).all(dim=-1).cpu() & rows.cpu()
    if bool(bad.any()):
        b, row = (int(i) for i in torch.nonzero(bad)[0])
        kind = "NaN" if bool(torch.isnan(output[b, row]).any()) else "infinite"
        raise Violation(f"output row {row} of batch {b} is {kind}, though the row has keys to "
                        "attend to", hint=hint)


def position_skip_reason(capabilities: Capabilities) -> str | None:
    """Why a check that compares with the float64 reference can't apply: a position encoding
    inside that the reference does not model (RoPE and ALiBi it does, once known), or another
    part of its computation it does not (``Capabilities.unmodelled``: a per-head QK-norm)."""
    encoding = capabilities.position.encoding
    if capabilities.position.positional and (encoding is None or not encoding.positional):
        return (f"{capabilities.position.positional}: the suite's float64 reference does not model this "
                "position encoding, so this comparison does not apply")
    if capabilities.unmodelled:
        return (f"{capabilities.unmodelled}: the suite's float64 reference from its weights does "
                "not model that, so this comparison does not apply")
    return None


def reference_skip_reason(capabilities: Capabilities,
                          purpose: str = "to build the reference") -> str | None:
    """Why a check that compares with the float64 reference built from the module's own weights
    can't apply: a position encoding inside that the reference does not model (said first), or
    no canonical weight access (``purpose``: what the check needs the weights for)."""
    if position_skip_reason(capabilities):
        return position_skip_reason(capabilities)
    if not capabilities.weights:
        return f"needs canonical weight access {purpose}"
    return None


def reference_applies(capabilities: Capabilities) -> bool:
    """Whether outputs can be compared with the float64 reference: weights are accessible and
    any position encoding inside is one the reference models."""
    return reference_skip_reason(capabilities) is None


def mask_skip_reason(capabilities: Capabilities) -> str | None:
    """Why a check that needs the padding mask can't run: none declared, or none inferred (then
    ``padding`` reports it once)."""
    if capabilities.mask is not None:
        return None
    if capabilities.doubts.mask_problem:
        return "no mask convention could be inferred for its mask argument (see padding)"
    return Lacking("no padding mask")


def fmt(value: float) -> str:
    return f"{value:.3g}"
