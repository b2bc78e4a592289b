"""The RoPE a reproduction found, measured at every head width generated and held to what the
module states (a declaration, its constructor's defaults)."""

from __future__ import annotations

import math
from dataclasses import replace

from conformance.inference.weights.encoding_search import rotary_hypotheses, stated
from conformance.inference.weights.reproduction import Build, probe_inputs
from conformance.inference.weights.weight_search import relative_error
from conformance.model.forms import PositionEncoding, Rotary
from conformance.model.remedies import Note, Remedy
from conformance.model.weights import WeightLayout, WeightLayoutError
from conformance.numerics.reference import reference_attention
from conformance.subject.boundary import ImplementationError


def as_stated(measured: Rotary, cls: type, rope: tuple[str, float | None, float | None] | None,
               head_dim: int, notes: list[str | Note]) -> Rotary:
    """The RoPE the reference holds the module to: what it does, unless what it states (a
    declaration, or its constructor's theta / rotary-fraction defaults) differs; then what it
    states, and the difference is said (reference fails, naming it)."""
    theta, fraction = stated(cls)
    pairing = None
    if rope is not None:
        pairing, theta, fraction = rope[0], rope[1] or theta, rope[2] or fraction
    expected = replace(measured,
                       pairing=pairing or measured.pairing,
                       theta=theta if theta is not None and not measured.table else measured.theta,
                       fraction=fraction if fraction is not None else measured.fraction,
                       dims=None if fraction is not None else measured.dims)
    if rope is not None and measured.reversed:
        expected = replace(expected, reversed=False)  # a declared RoPE turns the usual way
    differences = []
    if measured.reversed and not expected.reversed:
        differences.append("turns the other way round (by -p * theta^(-2i/r))")
    if expected.pairing != measured.pairing:
        differences.append(f"pairs {measured.pairing} where {expected.pairing} is declared")
    if not measured.table and not math.isclose(expected.theta, measured.theta, rel_tol=1e-3):
        differences.append(f"theta {measured.theta:.6g} where it states {expected.theta:g}")
    if expected.rotated_dims(head_dim) != measured.rotated_dims(head_dim):
        differences.append(f"rotates {measured.rotated_dims(head_dim)} of {head_dim} dims where "
                           f"it states {expected.rotated_dims(head_dim)}")
    if not differences:
        return measured
    notes.append(Note(f"RoPE: its output is reproduced as {measured.describe()}, but it "
                      + "; ".join(differences) + ": the reference holds it to what it states",
                      Remedy.to("rope", None, "state otherwise")))
    return expected


def rotary_across_widths(build: Build, layout: WeightLayout, found: PositionEncoding, cls: type,
                          call: str, causal: bool, heads: int, probed_width: int,
                          pairs: tuple[tuple[int, int], ...] | None, length: int,
                          threshold: float) -> tuple[Rotary, tuple[int, ...]]:
    """The RoPE of the encoding ``found``, checked at every head width generated: the same
    rule where it reproduces the output at each, else a table measured per width (the rotated
    dimensions and theta x-transformers derives from each width); and the widths where no
    hypothesis reproduces the output (RoPE undefined there: an odd or one-dimensional rotation,
    as HuggingFace's layers run at head_dim 1). Every other part found with it (a softcap, a
    scale, ALiBi) is held as found: only the rotation is measured per width."""
    rotary = found.rotary
    assert rotary is not None, "only an encoding with RoPE is measured across widths"
    widths = sorted({d for h, d in pairs if h == heads}) if pairs else list(range(1, 17))
    entries, differs, unexplained = [], False, []
    fixed_rule = replace(rotary, dims=rotary.rotated_dims(probed_width), table=())
    for width in widths:
        try:
            instance = build(heads, width, None)
            inputs = probe_inputs(call, heads, width, length, seed=13)
            output = instance.forward(inputs)
            weights = layout.read(instance.module, heads)
        except (ImplementationError, RuntimeError, WeightLayoutError):
            continue  # the constraints report configurations that fail
        # As found, then the same count of rotated dimensions at every width (GPT-J's fixed
        # rotary_dim), then the usual hypotheses.
        tried = [rotary, fixed_rule] + [r for r in rotary_hypotheses(instance.module.inner, cls, width)
                                   if (r.pairing, r.reversed) == (rotary.pairing, rotary.reversed)]
        # The closest hypothesis, not the first within the threshold: in a float32-table
        # module a rotation by pos * 1e-4 is within it of none at all.
        errors = []
        for candidate in tried:
            encoding = replace(found, rotary=candidate)
            expected = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                           causal=causal, encoding=encoding).output
            errors.append((relative_error(output, expected), len(errors), candidate))
        error, _, best = min(errors, key=lambda e: e[:2])
        if error <= threshold:
            # RoPE as found, unless another hypothesis is clearly closer (float32 tables
            # scatter the errors of equivalent ones by a little).
            chosen = rotary if errors[0][0] <= 2 * error + 1e-12 else best
            frequencies = tuple(chosen.frequencies(width).tolist())
            differs = differs or not _same_frequencies(frequencies,
                                                       tuple(rotary.frequencies(width).tolist()))
            entries.append((width, frequencies))
        else:
            unexplained.append(width)
    if not differs:
        return rotary, tuple(unexplained)
    if entries and all(_same_frequencies(e, tuple(fixed_rule.frequencies(w).tolist()))
                       for w, e in entries):
        return fixed_rule, tuple(unexplained)  # one count of rotated dimensions at every width
    return replace(rotary, table=tuple(entries)), tuple(unexplained)


def _same_frequencies(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Equal to float32's precision: a frequency table buffered in float32 is the rule's."""
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b, strict=True))
