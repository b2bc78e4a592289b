"""Step 4 of finding weights by behaviour (:mod:`conformance.inference.weights.weight_search`): where no
candidate reproduces the output, the one whose roles agree with interventions. Nudging one
token's query changes that token's row alone, a value changes every row linearly, a key every
row through the softmax.
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.inference.observing.tracing import intervention
from conformance.inference.weights.weight_trace import Trace, weight_of
from conformance.model.declared_layouts import (
    SeparateProjections,
    is_conv1d,
)
from conformance.model.layouts import ArrangedProjection, RelabelledHeads, role_rows
from conformance.model.weights import HeadWeights, WeightLayout


def by_roles(found: Trace, root: nn.Module,
              fitting: list[tuple[WeightLayout, HeadWeights]]) -> WeightLayout:
    """Of the fitting candidates, the first whose role for every head-wide block of every
    source agrees with what nudging that block does (see :func:`block_roles`)."""
    measured: dict[str, list[str]] = {}
    for layout, weights in fitting:
        predicted = _predicted_roles(layout, weights)
        if predicted is None:
            continue
        for path in predicted:
            if path not in measured:
                measured[path] = block_roles(found, root, path, weights.head_dim)
        if all(_agree(measured[path], roles) for path, roles in predicted.items()):
            return layout
    return fitting[0][0]


def _agree(measured: list[str], predicted: list[str]) -> bool:
    return len(measured) == len(predicted) and all(
        m in (p, "unused") for m, p in zip(measured, predicted, strict=True))


def _predicted_roles(layout: WeightLayout, weights: HeadWeights) -> dict[str, list[str]] | None:
    """The role of every head-wide block of every source the layout reads, where it can say."""
    if isinstance(layout, RelabelledHeads):
        layout = layout.inner
    heads, kv, head_dim = weights.num_heads, weights.num_kv_heads, weights.head_dim
    if isinstance(layout, SeparateProjections):
        return {layout.q: ["q"] * heads, layout.k: ["k"] * kv, layout.v: ["v"] * kv}
    if isinstance(layout, ArrangedProjection):
        order = layout.order
        counts = {"q": heads, "k": kv, "v": kv} if layout.q is None else {"k": kv, "v": kv}
        rows = role_rows(layout.arrangement, order, counts.get("q", kv), kv, head_dim)
        blocks = ["?"] * (sum(counts.values()))
        for role, index in rows.items():
            for row in index[::head_dim].tolist():
                blocks[row // head_dim] = role
        predicted = {layout.qkv: blocks}
        if layout.q is not None:
            predicted[layout.q] = ["q"] * heads
        return predicted
    return None


def block_roles(found: Trace, root: nn.Module, path: str, head_dim: int) -> list[str]:
    """What nudging each head-wide block of ``path``'s output at the first token does:
    ``q`` (only that token's row changes), ``v`` (every row, linearly), ``k`` (every row, not
    linearly) or ``unused``."""
    module = root.get_submodule(path)
    call = next((c for c in found.calls if c.path == path), None)
    if call is None:
        width = weight_of(module).shape[1 if is_conv1d(module) else 0]
        return ["unused"] * (width // head_dim)
    width = call.output.shape[-1]
    token_axis = _token_axis(call.output, found.output)
    roles = []
    for start in range(0, width - head_dim + 1, head_dim):
        deltas = []
        for size in (0.5, 1.0):
            def nudge(output: torch.Tensor, size=size, start=start) -> torch.Tensor:
                changed = output.clone()
                index = [slice(None)] * output.dim()
                index[token_axis] = 0
                index[-1] = slice(start, start + head_dim)
                changed[tuple(index)] += size
                return changed

            with intervention(module, nudge):
                after = found.rerun()
            # A row NaN before and after (nothing to attend to) did not change.
            both = torch.isnan(after) & torch.isnan(found.output)
            deltas.append(torch.where(both, torch.zeros((), dtype=after.dtype),
                                      after - found.output))
        roles.append(_role(deltas[0], deltas[1]))
    return roles


def _token_axis(inner: torch.Tensor, output: torch.Tensor) -> int:
    """The token axis of an internal tensor: 1 when it leads with (B, L) as the output does,
    0 when with (L, B) (a sequence-first module)."""
    batch, length = output.shape[:2]
    if inner.dim() >= 2 and tuple(inner.shape[:2]) == (length, batch) and batch != length:
        return 0
    return 1


def _role(half: torch.Tensor, whole: torch.Tensor) -> str:
    scale = max(1e-300, float(whole.abs().max()))
    if float(whole.abs().max()) <= 1e-12:
        return "unused"
    rows = whole.abs().amax(dim=(0, 2)) > 1e-9 * scale
    if bool(rows[0]) and not bool(rows[1:].any()):
        return "q"
    linear = float((whole - 2 * half).abs().max()) <= 1e-7 * scale
    return "v" if linear else "k"
