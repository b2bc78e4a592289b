"""Where the projections are, read from submodule names and shapes."""

from __future__ import annotations

from torch import nn

from conformance.model.declared_layouts import (
    FusedProjection,
    PackedInProjection,
    PerHeadModules,
    SeparateProjections,
)
from conformance.model.weights import HeadWeights, WeightLayout, WeightLayoutError

NAMES = {
    "q": ("q", "q_proj", "w_q", "wq", "linear_q", "q_linear", "query", "W_query", "to_q",
          "query_proj", "W_q", "linear_query", "query_linear"),
    "k": ("k", "k_proj", "w_k", "wk", "linear_k", "k_linear", "key", "W_key", "to_k", "key_proj",
          "W_k", "linear_keys", "linear_key", "key_linear"),
    "v": ("v", "v_proj", "w_v", "wv", "linear_v", "v_linear", "value", "W_value", "to_v",
          "value_proj", "W_v", "linear_values", "linear_value", "value_linear"),
    "o": ("o", "o_proj", "out", "out_proj", "w_o", "wo", "linear_o", "o_linear", "W_o", "to_out",
          "output", "dense", "proj", "c_proj", "out_linear", "fc_out", "final_linear",
          "linear_out", "output_linear"),
    "qkv": ("qkv", "linear_qkv", "qkv_proj", "c_attn", "Wqkv", "W_qkv", "to_qkv", "in_proj"),
}


def _is_linear(module: nn.Module) -> bool:
    return getattr(module, "weight", None) is not None and module.weight.dim() == 2


def _linears(module: nn.Module, prefix: str = "") -> dict[str, nn.Module]:
    """Children with a 2-D weight, by attribute name; a Sequential whose only weighted layer
    comes first (``to_out = Sequential(Linear, Dropout)``) stands for that layer as ``name.0``."""
    found = {}
    for name, child in module.named_children():
        if _is_linear(child):
            found[prefix + name] = child
        elif (isinstance(child, nn.Sequential) and len(child) and _is_linear(child[0])
              and not any(p.dim() >= 2 for layer in list(child)[1:] for p in layer.parameters())):
            found[prefix + name] = child[0]
            found[f"{prefix}{name}.0"] = child[0]
    return found


def _find(linears: dict[str, nn.Module], role: str, prefix: str) -> str | None:
    for name in NAMES[role]:
        if prefix + name in linears:
            held = prefix + name
            # A Sequential is read through its first layer, by its path.
            return held + ".0" if f"{held}.0" in linears else held
    return None


def _candidates(module: nn.Module, prefix: str) -> list[WeightLayout]:
    layouts: list[WeightLayout] = []
    linears = _linears(module, prefix)
    q, k, v = (_find(linears, role, prefix) for role in "qkv")
    o = _find(linears, "o", prefix)
    if getattr(module, "in_proj_weight", None) is not None:
        packed = PackedInProjection.of(prefix.rstrip("."), module, o)
        layouts += [packed] if packed else []
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


def _covered(layout: WeightLayout, root: nn.Module, inner: str) -> bool:
    """Whether the layout's submodules hold every weight matrix of the module under ``inner``:
    a matrix left over (an output projection by another name, a gate) means the layout misses
    part of the computation."""
    module = root.get_submodule(inner) if inner else root
    read = {id(p) for p in _layout_parameters(layout, root)}
    return all(id(p) in read for p in module.parameters() if p.dim() >= 2)


def _layout_parameters(layout: WeightLayout, root: nn.Module) -> list[nn.Parameter]:
    paths = [getattr(layout, role, None) for role in ("q", "k", "v", "o", "qkv", "path")]
    parameters = []
    if isinstance(layout, PerHeadModules):
        parameters += list(root.get_submodule(layout.heads).parameters())
    for path in paths:
        if path is None:
            continue
        if isinstance(layout, PerHeadModules) and path in (layout.q, layout.k, layout.v):
            continue
        try:
            parameters += list((root.get_submodule(path) if path else root).parameters())
        except AttributeError:
            return []
    return parameters


def fits(layout: WeightLayout, root: nn.Module, num_heads: int, d_model: int,
         out_width: int, inner: str = "inner", num_kv_heads: int | None = None) -> bool:
    """Whether ``layout`` reads ``root``'s weights with consistent shapes (:func:`shapes_agree`,
    the input width the model's) and accounts for every weight matrix under ``inner``."""
    try:
        weights = layout.read(root, num_heads, num_kv_heads)
    except (WeightLayoutError, AttributeError):  # a candidate whose parts are not there
        return False
    if not _covered(layout, root, inner):
        return False
    return shapes_agree(weights, d_model, out_width)


def shapes_agree(weights: HeadWeights, d_in: int, out_width: int) -> bool:
    """Whether the weights read have consistent shapes: query heads over the input width
    ``d_in``; key heads of the query's width, as many as the value heads, a divisor of the query
    heads (grouped-query attention); an output projection from the concatenated heads to
    ``out_width``, or none where the concatenated heads are the output."""
    if weights.d_in != d_in or weights.w_k.shape[1:] != weights.w_q.shape[1:]:
        return False
    if weights.num_heads % weights.num_kv_heads or weights.w_v.shape[0] != weights.num_kv_heads:
        return False
    if weights.w_o is None:
        return weights.num_heads * weights.value_dim == out_width
    return tuple(weights.w_o.shape) == (out_width, weights.num_heads * weights.value_dim)


def infer_layout(root: nn.Module, inner: str, num_heads: int, d_model: int,
                 out_width: int, num_kv_heads: int | None = None) -> WeightLayout | None:
    """The first layout that :func:`fits` the module."""
    module = root.get_submodule(inner) if inner else root
    for layout in _nested_candidates(module, f"{inner}." if inner else "", depth=2):
        if fits(layout, root, num_heads, d_model, out_width, inner, num_kv_heads):
            return layout
    return None
