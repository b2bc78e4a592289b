"""Grouped key/value heads: query head h reads key/value head h // G, and no other.

Property: for grouped-query attention with H query heads sharing Hkv < H key/value heads
(G = H / Hkv query heads per group), with the output projection set to the identity (so output
block h is query head h's attention output), replacing key/value head g's projection weights
(W_k[g], W_v[g]) with fresh values changes the output blocks of query heads
gG .. gG + G - 1, and leaves every other block unchanged (within the unchanged tolerance). This
is the grouping of ``repeat_interleave(G)`` along the head axis (HuggingFace's ``repeat_kv``,
SDPA's ``enable_gqa``); ``repeat`` pairs query head h with key/value head h mod Hkv instead.
It needs no reference and no position-free attention: it holds with RoPE, ALiBi and windows.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.remedies import Option, Remedy
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import abs_error, only_rows, reordering_tolerance, unchanged_tolerance


def _changed_heads(before: torch.Tensor, after: torch.Tensor, rows: torch.Tensor, heads: int,
                   unchanged: float) -> tuple[list[int], torch.Tensor]:
    """The query heads whose output block moved by more than ``unchanged``, and each head's
    largest change."""
    diff = only_rows(abs_error(after, before, nan_equal=True), rows)
    per_head = diff.reshape(*diff.shape[:2], heads, -1).amax(dim=(0, 1, 3))
    return [h for h in range(heads) if float(per_head[h]) > unchanged], per_head


class KVGroups(Check):
    """Query head h reads key/value head h // (H / Hkv), and only it."""

    name = "kv_groups"
    order = 180
    applies = "grouped key/value heads"
    title = "query head h reads key/value head h // (H / Hkv), and no other (grouped-query)"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.kv_heads is None:
            return Lacking("no grouped key/value heads")
        if not capabilities.weights:
            return "needs canonical weight access to change one key/value head"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.explore(cases(caps, context.device, masks="auto", grouped=True),
                        lambda case: self.verify(context, case))
        context.doubt(caps.doubts.kv_grouping,
                      "inference can't know which convention was meant: it checked the module in "
                      "its own (tiled)",
                      Remedy((Option("kv_grouping", "interleaved", "hold it to HuggingFace's"),
                              Option("kv_grouping", "tiled", "accept it"))))

    def verify(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        weights = instance.read_weights()
        if weights.group == 1:
            return  # one key/value head per query head here: nothing grouped to check
        if weights.w_o is not None and weights.w_o.shape[0] != weights.w_o.shape[1]:
            return  # no identity output projection to read the heads through
        if weights.w_o is not None:
            eye = torch.eye(weights.w_o.shape[0], dtype=weights.w_o.dtype,
                            device=weights.w_o.device)
            weights = replace(weights, w_o=eye, b_o=torch.zeros_like(weights.b_o))
        instance.write_weights(weights)
        inputs = case.inputs(context.capabilities.call)
        rows = context.rows(case)
        before = context.run(instance, inputs, case)
        g = case.seed % weights.num_kv_heads
        fresh = {name: getattr(weights, name).clone() for name in ("w_k", "w_v")}
        for stream, name in enumerate(fresh):
            values = case.tensor(*fresh[name][g].shape, stream=61 + stream)
            fresh[name][g] = values.to(dtype=fresh[name].dtype, device=fresh[name].device)
        instance.write_weights(replace(weights, **fresh))
        after = context.run(instance, inputs, case)

        dtype = context.judged(case.config.dtype)
        unchanged = unchanged_tolerance(dtype, before)
        changed, per_head = _changed_heads(before, after, rows, weights.num_heads, unchanged)
        group = weights.group
        expected = list(range(g * group, (g + 1) * group))
        moved = reordering_tolerance(dtype, before)
        strays = [h for h in changed if h not in expected]
        silent = [h for h in expected if float(per_head[h]) <= moved]
        if not strays and not silent:
            return
        tiled = [h for h in range(weights.num_heads) if h % weights.num_kv_heads == g]
        hint = None
        if sorted(changed) == tiled and tiled != expected:  # else no evidence of tiling
            hint = ("key/value heads expanded with repeat (tiling: query head h reads key/value "
                    f"head h mod {weights.num_kv_heads}) instead of repeat_interleave (h // "
                    f"{group}, HuggingFace's repeat_kv, SDPA's enable_gqa)")
        if strays:
            h = strays[0]
            raise Violation(
                f"changing key/value head {g} of {weights.num_kv_heads} changed query head {h}'s "
                f"output by {fmt(float(per_head[h]))} (tolerance {fmt(unchanged)}), but query "
                f"head {h} belongs to key/value head {h // group} (groups of {group})",
                details=[f"query heads that changed: {sorted(changed)}; expected {expected}"],
                hint=hint)
        h = silent[0]
        raise Violation(
            f"changing key/value head {g} of {weights.num_kv_heads} left query head {h}'s output "
            f"unchanged, but query head {h} reads key/value head {g} (groups of {group})",
            details=[f"query heads that changed: {sorted(changed)}; expected {expected}"],
            hint=hint)
