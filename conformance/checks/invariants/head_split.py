"""Head split: multi-head attention is H single-head attentions, concatenated, then projected.

Property: the output equals ``concat_h(attention_h) W_o^T + b_o``, where ``attention_h`` is
single-head attention computed in float64 from the per-head slices ``W_q[h], b_q[h], W_k[g],
b_k[g], W_v[g], b_v[g]`` of the implementation's own projections, g = h for multi-head attention
and g = h // (H / Hkv), the query head's group, for grouped-query attention (within the tolerance
rule of :mod:`conformance.numerics.tolerance`); and relabelling the heads consistently (permuting the head
blocks of W_q, W_k, W_v and the matching column blocks of W_o; with groups, whole groups and the
query heads within them) leaves the output unchanged (not tested under ALiBi, whose slopes
belong to the head positions: a relabelled head gets another slope). With RoPE or ALiBi inside,
each head's attention carries it (head h its own ALiBi slope).
"""

from __future__ import annotations

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.likely_bug import expect_finite_or_mask_mistake, likely_bug
from conformance.checks.invariants.verify import fmt, output_disagreement, reference_skip_reason
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.forms import PositionEncoding
from conformance.model.spec import Capabilities
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import plain_attention, reference_attention
from conformance.numerics.tolerance import abs_error, agreement, only_rows, worst_index


def concatenated_heads(weights: HeadWeights, inputs, *, causal: bool,
                       window: int | None = None, chunk: int | None = None,
                       encoding: PositionEncoding | None = None) -> torch.Tensor:
    """float64 ``concat_h(single-head attention h) W_o^T + b_o`` from per-head weight slices
    (query head h with its group's key/value head; ALiBi with head h's own slope)."""
    per_head = [
        reference_attention(weights.head(h), inputs.query, inputs.key, inputs.value,
                            keep=inputs.keep, causal=causal, window=window, chunk=chunk,
                            encoding=encoding, start=inputs.position,
                            heads=(h, weights.num_heads, weights.num_kv_heads)).output
        for h in range(weights.num_heads)
    ]
    concat = torch.cat(per_head, dim=-1)
    if weights.w_o is None:
        return concat
    return concat @ weights.w_o.to(torch.float64).T + weights.b_o.to(torch.float64)


def _relabelling(num_heads: int, group: int, seed: int) -> list[int]:
    """A head permutation that moves at least one head, and moves groups of ``group`` query
    heads whole (their key/value head goes with them)."""
    generator = torch.Generator().manual_seed(seed)
    groups = torch.randperm(num_heads // group, generator=generator).tolist()
    within = torch.randperm(group, generator=generator).tolist()
    order = [g * group + i for g in groups for i in within]
    if order == sorted(order):
        order = order[group:] + order[:group] if len(groups) > 1 else order[1:] + order[:1]
    return order


class HeadSplit(Check):
    """Output = concatenated single-head attentions; relabelling heads changes nothing."""

    name = "head_split"
    order = 50
    applies = "more than one head"
    title = "output = concat of per-head attentions; relabelling heads changes nothing"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        unreferenced = reference_skip_reason(capabilities, "for the per-head projections")
        if unreferenced:
            return unreferenced
        if capabilities.heads == 1:
            return "single-head implementation: no heads to split"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.explore(cases(caps, context.device, masks="auto",
                              causal=caps.causality.kind == "always", min_heads=2),
                        lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        instance, inputs, output, rows = context.first_call(case)
        weights = instance.read_weights()
        expect_finite_or_mask_mistake(context, case, output, rows)
        encoding = context.capabilities.position.encoding
        expected = concatenated_heads(weights, inputs, causal=case.causal, window=case.window,
                                      chunk=case.chunk, encoding=encoding)
        judged = context.judged(case.config.dtype)
        baseline = plain_attention(weights, inputs.query, inputs.key, inputs.value,
                                   keep=inputs.keep, causal=case.causal, dtype=judged,
                                   window=case.window, chunk=case.chunk, encoding=encoding,
                                   start=inputs.position)
        seen = agreement(output, expected, baseline, judged, rows)
        if not seen.ok:
            violation = output_disagreement(seen, output, expected,
                                            against="concatenated per-head attentions",
                                            reference="per-head reference", mean_error=True)
            violation.hint = context.hint(lambda: likely_bug(context, case, instance, inputs,
                                                             output, rows))
            raise violation

        order = _relabelling(case.num_heads, weights.group, case.seed)
        if order == list(range(case.num_heads)):
            return  # one head: nothing to relabel
        if encoding is not None and encoding.alibi is not None:
            # ALiBi gives each head position its own slope: relabelled heads get other slopes.
            context.observe("relabelling heads not tested: ALiBi's slopes belong to the head "
                            "positions")
            return
        instance.write_weights(weights.permute_heads(order))
        relabelled = context.run(instance, inputs, case)
        if weights.w_o is None:
            # No output projection to absorb the relabelling: the output's head blocks move.
            blocks = output.reshape(*output.shape[:2], case.num_heads, -1)
            output = blocks[:, :, order].reshape(output.shape)
        diff = only_rows(abs_error(relabelled, output), rows)
        allowed = 2 * seen.allowed
        if float(diff.max()) > allowed:
            b, row, feature = worst_index(diff)
            raise Violation(
                f"relabelling heads as {order} changed output row {row} of batch {b} by "
                f"{fmt(float(diff[b, row, feature]))} (allowed {fmt(allowed)})",
                hint="do the heads of q, k and v come from different slices of the projections?")
