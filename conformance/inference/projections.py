"""Where the projections are, read from submodule names and shapes."""

from __future__ import annotations

from torch import nn

from conformance.weights import (
    FusedProjection,
    PackedInProjection,
    PerHeadModules,
    SeparateProjections,
    WeightLayout,
    WeightLayoutError,
)

NAMES = {
    "q": ("q", "q_proj", "w_q", "wq", "linear_q", "q_linear", "query", "W_query", "to_q",
          "query_proj", "W_q"),
    "k": ("k", "k_proj", "w_k", "wk", "linear_k", "k_linear", "key", "W_key", "to_k", "key_proj",
          "W_k"),
    "v": ("v", "v_proj", "w_v", "wv", "linear_v", "v_linear", "value", "W_value", "to_v",
          "value_proj", "W_v"),
    "o": ("o", "o_proj", "out", "out_proj", "w_o", "wo", "linear_o", "o_linear", "W_o", "to_out",
          "output", "dense", "proj", "c_proj", "out_linear", "fc_out"),
    "qkv": ("qkv", "linear_qkv", "qkv_proj", "c_attn", "Wqkv", "W_qkv", "to_qkv", "in_proj"),
}


def _linears(module: nn.Module, prefix: str = "") -> dict[str, nn.Module]:
    """Direct children with a 2-D weight, by attribute name."""
    return {prefix + name: child for name, child in module.named_children()
            if getattr(child, "weight", None) is not None and child.weight.dim() == 2}


def _find(linears: dict[str, nn.Module], role: str, prefix: str) -> str | None:
    for name in NAMES[role]:
        if prefix + name in linears:
            return prefix + name
    return None


def _candidates(module: nn.Module, prefix: str) -> list[WeightLayout]:
    layouts: list[WeightLayout] = []
    if getattr(module, "in_proj_weight", None) is not None:
        layouts.append(PackedInProjection(prefix.rstrip(".")))
    linears = _linears(module, prefix)
    q, k, v = (_find(linears, role, prefix) for role in "qkv")
    o = _find(linears, "o", prefix)
    if q and k and v:
        layouts.append(SeparateProjections(q=q, k=k, v=v, o=o))
        if o:
            layouts.append(SeparateProjections(q=q, k=k, v=v))
    fused = _find(linears, "qkv", prefix)
    if fused:
        layouts.append(FusedProjection(qkv=fused, o=o))
    for name, child in module.named_children():
        if isinstance(child, nn.ModuleList) and len(child) and all(
                all(_find(_linears(head), role, "") for role in "qkv") for head in child):
            head_linears = _linears(child[0])
            layouts.append(PerHeadModules(heads=prefix + name,
                                          q=_find(head_linears, "q", ""),
                                          k=_find(head_linears, "k", ""),
                                          v=_find(head_linears, "v", ""), o=o))
    return layouts


def _nested_candidates(module: nn.Module, prefix: str, depth: int) -> list[WeightLayout]:
    """Candidates in ``module``, then in its submodules (an attention wrapped in a module)."""
    layouts = _candidates(module, prefix)
    if depth:
        for name, child in module.named_children():
            if not isinstance(child, nn.ModuleList):
                layouts += _nested_candidates(child, f"{prefix}{name}.", depth - 1)
    return layouts


def infer_layout(root: nn.Module, inner: str, num_heads: int, d_model: int,
                 out_width: int) -> WeightLayout | None:
    """The first layout whose weights read with consistent shapes: q/k heads of equal size over
    the model width, an output projection (if any) from the concatenated heads to the output."""
    module = root.get_submodule(inner) if inner else root
    for layout in _nested_candidates(module, f"{inner}." if inner else "", depth=2):
        try:
            weights = layout.read(root, num_heads)
        except WeightLayoutError:
            continue
        if weights.d_in != d_model or weights.w_k.shape != weights.w_q.shape:
            continue
        if weights.w_o is None and weights.num_heads * weights.value_dim != out_width:
            continue
        if weights.w_o is not None and tuple(weights.w_o.shape) != (
                out_width, weights.num_heads * weights.value_dim):
            continue
        return layout
    return None
