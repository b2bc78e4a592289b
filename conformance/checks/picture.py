"""A finding's falsifying case drawn: what the implementation attends to, and what it should.

The minimal case is run once more. Where the implementation's weights can be read and the probe
fits (:mod:`conformance.inference.observing.attention_probe`), its attention probabilities
are measured through its own forward, beside the float64 reference's for the same probe
weights and inputs: softmax of q.k / sqrt(head_dim) (plus the position encoding's bias) over
the keys the mask, causality and window allow, each row with no such key all zeros. Elsewhere,
each query row's largest output error against the float64 reference (an output-only finding).
One batch and head is drawn: the one the finding names (its reason says "batch b, head h"),
else where the two differ most.

A picture is evidence, never a verdict: whatever goes wrong while it is made (the probe does not
fit, the module has no weights to read, a call fails) is said in its place.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

import torch

from conformance.checks.core_route import second_inputs
from conformance.generation.cases import Case, own_queries
from conformance.inference.observing.attention_probe import probe, probe_unfit_reason
from conformance.model.core import CoreKind
from conformance.model.picture import Matrix, Picture
from conformance.model.spec import Capabilities
from conformance.numerics.core_fit import fitted_scale, logit_bias
from conformance.numerics.reference import allowed_keys, reference_attention
from conformance.subject.boundary import CapabilityError, Subject

LOCATION = re.compile(r"batch (\d+), head (\d+)")
"""How a finding's reason names where it is."""


def picture(subject: Subject, capabilities: Capabilities, case: Case, reason: str) -> Picture:
    """The picture of ``case`` (a finding's minimal case, whose ``reason`` may name a batch and
    head) on ``subject``; a call that fails leaves a picture saying so."""
    named = LOCATION.search(reason)
    batch, head = (int(named[1]), int(named[2])) if named else (0, 0)
    try:
        return _drawn(subject, capabilities, case, named is not None, batch, head)
    except Exception as error:  # evidence, not a verdict: whatever it was is said in its place
        first = str(error).splitlines()[0] if str(error) else ""
        return Picture(batch, head, unavailable=f"the case could not be run again "
                                                f"({type(error).__name__}: {first})")


DRAWN_LENGTH = 8
"""Queries and keys of a case drawn larger than its minimal one (too small for the probe to
measure, as shrunk cases are): rows enough to see a pattern (a diagonal, a masked column), few
enough to read each cell."""

LEGIBLE = 4
"""Keys enough in a minimal case for its own picture to show a pattern; with fewer, a larger
case that shows the finding as well is drawn."""

VISIBLE = 1e-3
"""The least difference between the probabilities that shows the finding in a larger case."""


def _drawn(subject: Subject, capabilities: Capabilities, case: Case, named: bool, batch: int,
           head: int) -> Picture:
    instance = subject.instantiate(case.config, case.seed)
    instance.settle()
    try:
        weights = instance.read_weights()
    except CapabilityError:
        weights = None
    unfit = None if weights is None else probe_unfit_reason(weights, case.kv_len)
    if weights is not None and unfit is None and case.kv_len >= LEGIBLE:
        return _probabilities(subject, capabilities, case, named, batch, head, instance)
    larger = None if weights is None else _enlarged(case, capabilities)
    if larger is not None:
        try:
            drawn = _probabilities(subject, capabilities, larger, False, 0, 0)
        except Exception:  # it does not build or run at that size: the minimal case, then
            drawn = Picture(0, 0)
        if _differ(drawn):
            small = f"too small to measure ({unfit})" if unfit else "small"
            return replace(drawn, where=f"the minimal case is {small}: drawn larger, "
                                        f"{larger!r}, at the batch and head where its attention "
                                        "differs from the reference's most")
    if weights is not None and unfit is None:
        return _probabilities(subject, capabilities, case, named, batch, head, instance)
    keep, allowed = _allowed(case)
    if weights is None:
        core = _core(capabilities, case, named, batch, head, instance)
        if core is not None:
            return core
        return Picture(batch, head, **_marks(case, keep, allowed, batch),
                       unavailable="the attention probabilities can't be measured: its weights "
                                   "can't be read (no weight layout), and no attention core "
                                   "shows in its forward")
    inputs = case.inputs(capabilities.call)
    output = instance.forward(inputs).to(torch.float64).cpu()
    expected = reference_attention(weights, inputs.query, inputs.key, inputs.value, keep=keep,
                                   causal=case.causal, window=case.window, chunk=case.chunk,
                                   encoding=capabilities.position.encoding).output.cpu()
    if output.shape != expected.shape:
        raise ValueError(f"its output has shape {tuple(output.shape)}, the reference's "
                         f"{tuple(expected.shape)}")
    error = (output - expected).abs().nan_to_num(nan=math.inf).amax(dim=-1)  # (B, Lq)
    if not named:
        batch = int(error.amax(dim=-1).argmax())
    return Picture(batch, head, row_error=tuple(float(e) for e in error[batch]),
                   **_marks(case, keep, allowed, batch), where=_where(named),
                   unavailable=f"the probabilities can't be measured ({unfit}): each query "
                               "row's output error is drawn instead")


def _probabilities(subject: Subject, capabilities: Capabilities, case: Case, named: bool,
                   batch: int, head: int, instance=None) -> Picture:
    """The measured and reference probabilities of ``case`` (the probe fits it)."""
    instance = instance or subject.instantiate(case.config, case.seed)
    keep, allowed = _allowed(case)
    seen = probe(instance, case, capabilities.call, keep=keep, causal=case.causal,
                 encoding=capabilities.position.encoding)
    scores = seen.logits / math.sqrt(case.head_dim)
    if seen.bias is not None:
        scores = scores + seen.bias
    scores = scores.masked_fill(~allowed[:, None], -math.inf)
    reference = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    measured = seen.attention
    if not named:
        batch, head = _worst((measured - reference).abs().nan_to_num(nan=math.inf)
                             .amax(dim=(-2, -1)))
    return Picture(batch, head, measured=_matrix(measured[batch, head]),
                   reference=_matrix(reference[batch, head]),
                   **_marks(case, keep, allowed, batch), where=_where(named))


def _core(capabilities: Capabilities, case: Case, named: bool, batch: int, head: int,
          instance) -> Picture | None:
    """The weights its attention core multiplies the values by (observed in its forward), beside
    softmax(q·kᵀ / sqrt(w) + the bias the tokens don't move) over the keys the case allows, from
    the q and k the core computed; None where no core shows. Its groups are read batch first."""
    # Evidence, not a check: its output is not validated, and a forward with no core is None.
    call = capabilities.call
    first = instance.observe(case.inputs(call)).sites
    second = instance.observe(second_inputs(case, call)).sites
    shown = [(a, b) for a, b in zip(first, second, strict=False) if a.kind is CoreKind.SOFTMAX
             and a.used is not None and a.used.shape == a.probabilities.shape]
    if not shown or shown[0][0].used.shape[0] % case.batch:
        return None
    site, other = shown[0]
    per = site.used.shape[0] // case.batch
    keep, allowed = _allowed(case)
    fitted, _ = fitted_scale(site, other)
    bias = torch.nan_to_num(logit_bias(site, other, fitted), nan=0.0) if fitted == fitted else 0.0
    scores = site.scores / math.sqrt(site.widths[0]) + bias
    scores = scores.masked_fill(~allowed.repeat_interleave(per, dim=0), -math.inf)
    reference = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    measured = site.used.to(torch.float64).cpu()
    if named and head < per:
        group = batch * per + head
    else:
        group = int((measured - reference).abs().nan_to_num(nan=math.inf).amax(dim=(-2, -1))
                    .argmax())
    batch, head = divmod(group, per)
    return Picture(batch, head, measured=_matrix(measured[group]),
                   reference=_matrix(reference[group]), **_marks(case, keep, allowed, batch),
                   where=(_where(named) + ": the weights its attention core multiplies the values "
                          "by, observed in its forward (its groups read batch first)"))


def _allowed(case: Case) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The case's key mask (B, Lk) and the keys each row may see (B, Lq, Lk)."""
    keep = case.keep()
    keep = None if keep is None else keep.cpu()
    return keep, allowed_keys(case.batch, case.q_len, case.kv_len, keep, case.causal,
                              window=case.window, chunk=case.chunk)[:, 0]


def _enlarged(case: Case, capabilities: Capabilities) -> Case | None:
    """``case`` with ``DRAWN_LENGTH`` queries and keys and heads wide enough for the probe (its
    features kept: mask, causality, window, dtype, seed), where the module builds for it."""
    length = capabilities.length_near(DRAWN_LENGTH)
    if length <= case.kv_len:
        return None
    heads, width = case.num_heads, max(case.head_dim, 2 * length)
    if capabilities.shapes is not None:
        fits = [(h, d) for h, d in capabilities.shapes
                if d >= length and h * d > length and (not case.kv_heads or h % case.kv_heads == 0)]
        if not fits:
            return None
        heads, width = fits[0]

    def scaled(count: int) -> int:
        if count in (0, case.kv_len):
            return 0 if count == 0 else length
        return min(length - 1, max(1, round(count * length / case.kv_len)))

    q_len = length if case.q_len == case.kv_len else max(1, round(case.q_len * length
                                                                  / case.kv_len))
    return own_queries(replace(case, q_len=q_len, kv_len=length, num_heads=heads, head_dim=width,
                               kept=None if case.kept is None else tuple(scaled(k) for k in
                                                                         case.kept)),
                       capabilities)


def _differ(drawn: Picture) -> bool:
    """Whether the drawn probabilities show a difference (or a NaN)."""
    for measured, reference in zip(drawn.measured or (), drawn.reference or (), strict=True):
        for m, r in zip(measured, reference, strict=True):
            if not abs(m - r) <= VISIBLE:
                return True
    return False


def _marks(case: Case, keep: torch.Tensor | None, allowed: torch.Tensor, batch: int) -> dict:
    return dict(allowed=tuple(tuple(bool(a) for a in row) for row in allowed[batch]),
                kept=None if keep is None else tuple(bool(k) for k in keep[batch].cpu()),
                attending=tuple(bool(a) for a in allowed[batch].any(dim=-1)),
                causal=case.causal)


def _worst(per_pair: torch.Tensor) -> tuple[int, int]:
    """The (batch, head) of the largest value of ``per_pair`` (B, H)."""
    index = int(per_pair.flatten().argmax())
    return divmod(index, per_pair.shape[1])


def _where(named: bool) -> str:
    return ("the batch and head the finding names" if named
            else "the batch and head where the implementation and the reference differ most")


def _matrix(rows: torch.Tensor) -> Matrix:
    return tuple(tuple(float(x) for x in row) for row in rows.to(torch.float64).cpu())
