"""Weights by behaviour: which parameters hold q, k, v and the output projection, decided by
what the forward does, not by what things are called.

1. Trace a float64 forward (:mod:`conformance.inference.observing.tracing`): the parameter-holding
   submodules it calls, which of them read a model input, which one's output is the module's
   output, and which parameters the output depends on at all (unused ones are not projections).
2. Candidates: every way the called layers could hold the projections: three layers in any
   role order; one fused layer with its rows stacked, per head or per group, in any role
   order; q beside a fused k/v; per-head modules; ``nn.MultiheadAttention``'s packed
   ``in_proj``; raw parameter tensors in any form. Grouped-query candidates come twice: query
   head h reading key/value head h // G, or h mod Hkv (tiled). Names only order them.
3. A candidate is accepted when the float64 reference computed from the weights it reads
   reproduces the module's own float64 output (with its causality, and for a module whose
   output depends on the tokens' order, the RoPE or ALiBi that reproduces it, see
   :mod:`conformance.inference.weights.encoding_search`), every parameter the output depends on read.
4. When none reproduces (a bug in the attention itself, or something the reference does not
   model), the candidate whose roles agree with interventions is kept, and said so: nudging
   one token's query changes that token's row alone, a value changes every row linearly, a key
   every row through the softmax.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from conformance.inference.weights.encoding_search import fit_theta
from conformance.inference.weights.projections import NAMES, shapes_agree
from conformance.inference.weights.weight_interventions import by_roles
from conformance.inference.weights.weight_trace import Source, Trace, weight_of
from conformance.model.declared_layouts import (
    PackedInProjection,
    PerHeadModules,
    SeparateProjections,
)
from conformance.model.forms import PositionEncoding, Rotary
from conformance.model.layouts import ArrangedProjection, ParameterProjections, RelabelledHeads
from conformance.model.weights import HeadWeights, WeightLayout, WeightLayoutError
from conformance.numerics.reference import reference_attention
from conformance.numerics.tolerance import FLOAT64_AGREEMENT

REPRODUCED = 1e-8
"""Largest relative error of a float64 reproduction when the module computes in float64
throughout: far above float64 rounding (1e-15), far below any wrong assignment (1e-3 and up)."""

REPRODUCED_FLOAT64 = FLOAT64_AGREEMENT
"""Largest relative error of a reproduction that is float64's own rounding: more, in a module
that makes no float32 call, is a part built at a lower precision and cast (which the gate
measures on the checks' own cases)."""

REPRODUCED_FLOAT32 = 1e-4
"""The same where the module computes parts in float32 inside a float64 run (RoPE tables,
softmax): float32 rounding is ~1e-7 relative, a wrong assignment still 1e-3 and up."""

MAX_CANDIDATES = 400

REFINED = 4
"""How many of the closest RoPE shapes (pairing, rotated share) get their theta fitted."""


@dataclass
class Found:
    """The outcome: the layout (None when nothing fits), whether it reproduces the module's
    output and with what error, the position encoding that did, and the evidence in words."""

    layout: WeightLayout | None
    reproduced: bool = False
    error: float = float("inf")
    encoding: PositionEncoding | None = None
    tried: int = 0
    evidence: list[str] = field(default_factory=list)


def _name_score(layout: WeightLayout) -> int:
    """How many roles a layout gives paths whose last part is a known name for that role."""
    def named(path: str | None, role: str) -> bool:
        return path is not None and path.rsplit(".", 1)[-1] in NAMES[role]

    score = 0
    for role in ("q", "k", "v", "o"):
        path = getattr(layout, role, None)
        if isinstance(path, tuple):
            path = path[0]
        score += named(path, role)
    fused = getattr(layout, "qkv", None)
    if fused is not None and getattr(layout, "q", None) is None:
        score += 2 * named(fused, "qkv")
    return score


def _role_order_ok(roles: dict[str, Source]) -> bool:
    """In a q, k, v call the layer holding a role must read that role's input (in a cross call,
    k and v the context; or something of its shape, or nothing: a layer the forward never
    calls)."""
    wanted = {"q": ("query",), "k": ("key", "context"), "v": ("value", "context")}
    return all(source.reads.lstrip("~") in ("x", *wanted[role], "unused")
               for role, source in roles.items())


def _reader_rank(source: Source) -> int:
    """Layers that read a model input first, then those reading something of its shape, then
    layers the forward never calls."""
    return 2 if source.reads == "unused" else 1 if source.reads.startswith("~") else 0


def candidates(found: Trace, root: nn.Module) -> list[WeightLayout]:
    """Every layout the traced calls allow, best-named first (see the module docstring)."""
    readers = sorted((s for s in found.sources if s.reads is not None and not s.gives_output),
                     key=_reader_rank)
    outputs = [s.path for s in found.sources
               if s.gives_output and (s.reads is None or s.reads.startswith("~"))]
    o_options: list[str | None] = [outputs[-1]] if outputs else [None]
    packed = (PackedInProjection.of(path, root.get_submodule(path), o_options[0])
              for path in found.packed)
    layouts: list[WeightLayout] = [layout for layout in packed if layout is not None]
    for o in o_options:
        for q, k, v in itertools.permutations(readers, 3):
            if _role_order_ok({"q": q, "k": k, "v": v}) and k.rows == v.rows:
                layouts.append(SeparateProjections(q.path, k.path, v.path, o))
        for source in readers:
            if source.reads.lstrip("~") != "x":
                continue
            for arrangement in ("stacked", "per_head", "per_group"):
                for order in ("qkv", "qvk", "kqv", "kvq", "vqk", "vkq"):
                    layouts.append(ArrangedProjection(source.path, arrangement, order, o))
        for q, kv in itertools.permutations(readers, 2):
            if not _role_order_ok({"q": q, "k": kv}) or kv.rows % 2:
                continue
            for arrangement in ("stacked", "per_head"):
                for order in ("kv", "vk"):
                    layouts.append(ArrangedProjection(kv.path, arrangement, order, o, q=q.path))
        layouts += _per_head_modules(readers, root, o)
    layouts += _raw_parameters(found, root)
    unused = {s.path for s in found.sources if s.reads == "unused"}

    def rank(layout: WeightLayout) -> tuple[int, int]:
        paths = {getattr(layout, role, None) for role in ("q", "k", "v", "qkv")}
        return (len(paths & unused), -_name_score(layout))

    layouts.sort(key=rank)
    return layouts[:MAX_CANDIDATES]


def _per_head_modules(readers: Sequence[Source], root: nn.Module,
                      o: str | None) -> list[WeightLayout]:
    """Per-head modules in a ModuleList: ``heads[i].<q, k, v>`` for every head, the roles in
    any order (the same in every head)."""
    by_parent: dict[str, list[str]] = {}
    for source in readers:
        parent, _, name = source.path.rpartition(".")
        holder, _, index = parent.rpartition(".")
        if index.isdigit():
            by_parent.setdefault(holder, []).append(f"{index}.{name}")
    layouts: list[WeightLayout] = []
    for holder, members in by_parent.items():
        names = sorted({m.split(".", 1)[1] for m in members})
        if len(names) != 3 or not isinstance(root.get_submodule(holder), nn.ModuleList):
            continue
        for q, k, v in itertools.permutations(names, 3):
            layouts.append(PerHeadModules(holder, q, k, v, o))
    return layouts


RAW_FORMS = {2: ("out_in", "in_out"), 3: ("in_heads_dim", "heads_dim_in", "heads_in_dim")}
RAW_OUTPUT_FORMS = {2: ("out_in", "in_out"), 3: ("heads_dim_out",)}


def _raw_parameters(found: Trace, root: nn.Module) -> list[WeightLayout]:
    """Raw parameter tensors the output depends on and no called layer holds as its weight,
    three of them (or four, with an output) in every role order and form."""
    held = set()
    for call in found.calls:
        for name, _ in call.module.named_parameters(recurse=False):
            if weight_of(call.module) is not None and name == "weight":
                held.add(f"{call.path}.{name}")
    for path in found.packed:
        held |= {f"{path}.{name}" for name, _ in root.get_submodule(path).named_parameters()}
    raw = [name for name in sorted(found.used)
           if name not in held and root.get_parameter(name).dim() in (2, 3)]
    if len(raw) < 3 or len(raw) > 4:
        return []
    layouts: list[WeightLayout] = []
    for chosen in itertools.permutations(raw, len(raw)):
        q, k, v = chosen[:3]
        o = chosen[3] if len(chosen) == 4 else None
        dims = [root.get_parameter(n).dim() for n in (q, k, v)]
        if len(set(dims)) != 1:
            continue
        o_forms = RAW_OUTPUT_FORMS[root.get_parameter(o).dim()] if o else (None,)
        for form in RAW_FORMS[dims[0]]:
            for o_form in o_forms:
                layouts.append(ParameterProjections((q, form), (k, form), (v, form),
                                                    (o, o_form) if o else None))
    return layouts


def _touched(layout: WeightLayout, root: nn.Module, heads: int,
             parameters: Sequence[str]) -> set[str]:
    """The parameters among ``parameters`` that ``layout`` reads (reading changes when they
    change)."""
    base = layout.read(root, heads)
    touched = set()
    for name in parameters:
        parameter = root.get_parameter(name)
        with torch.no_grad():
            parameter.add_(1.0)
            try:
                after = layout.read(root, heads)
            finally:
                parameter.sub_(1.0)
        if any(not torch.equal(a, b) for a, b in zip(_tensors(base), _tensors(after),
                                                       strict=True)):
            touched.add(name)
    return touched


def _tensors(weights: HeadWeights) -> list[torch.Tensor]:
    return [t for t in (weights.w_q, weights.b_q, weights.w_k, weights.b_k, weights.w_v,
                        weights.b_v, weights.w_o, weights.b_o) if t is not None]


def consistent(layout: WeightLayout, root: nn.Module, heads: int, d_in: int, out_width: int,
               used: set[str], kv_heads: int | None = None) -> HeadWeights | None:
    """The weights ``layout`` reads when they have consistent shapes
    (:func:`~conformance.inference.weights.projections.shapes_agree`) and it reads every weight matrix
    the output depends on; else None."""
    try:
        weights = layout.read(root, heads, kv_heads)
    except (WeightLayoutError, RuntimeError, IndexError, ValueError):
        return None
    if not shapes_agree(weights, d_in, out_width):
        return None
    matrices = [name for name in used if root.get_parameter(name).dim() >= 2]
    if set(matrices) - _touched(layout, root, heads, matrices):
        return None
    return weights


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max(1, |expected|); inf where only one of them is NaN, 0 where
    both are (a row with nothing to attend to, given NaN by both)."""
    a, e = actual.double(), expected.double()
    if not torch.equal(torch.isnan(a), torch.isnan(e)):
        return float("inf")
    a, e = torch.nan_to_num(a), torch.nan_to_num(e)
    scale = max(1.0, float(e.abs().max()))
    return float((a - e).abs().max()) / scale


def reproduction_error(weights: HeadWeights, found: Trace, causal: bool,
                       encoding: PositionEncoding | None) -> float:
    """How far the float64 reference from ``weights`` is from the module's own output."""
    inputs = found.inputs
    expected = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                   causal=causal, encoding=encoding).output
    if expected.shape != found.output.shape:
        return float("inf")
    return relative_error(found.output, expected)


def with_groupings(layout: WeightLayout, weights: HeadWeights,
                   groupings: tuple[str, ...] = ("interleaved", "tiled")
                   ) -> Iterator[WeightLayout]:
    """The layout read with each grouping of ``groupings`` that differs for its key/value
    heads: ``interleaved`` as it is, ``tiled`` relabelled (see RelabelledHeads)."""
    grouped = 1 < weights.num_kv_heads < weights.num_heads
    if "interleaved" in groupings or not grouped:
        yield layout
    if grouped and "tiled" in groupings:
        yield RelabelledHeads(layout)


def search(found: Trace, root: nn.Module, heads: int, *, causal: bool,
           encodings: Callable[[WeightLayout, HeadWeights], Iterator[PositionEncoding | None]],
           threshold: float, groupings: tuple[str, ...] = ("interleaved", "tiled"),
           loose: float | None = None) -> Found:
    """The first candidate that reproduces the output within ``threshold`` under one of
    ``encodings(layout, weights)`` (grouped key/value heads read with each of ``groupings``);
    else, after every candidate, the closest one where it is within ``loose`` (a module with a
    part computed at a lower precision: no wrong assignment comes that close, and of several
    hypotheses the closest is the module's); else the candidate the interventions agree with
    (not reproduced)."""
    d_in = found.inputs.query.shape[-1]
    out_width = found.output.shape[-1]
    fitting: list[tuple[WeightLayout, HeadWeights]] = []
    best = Found(None)
    rotary: dict[tuple[str, float, int | None], tuple[float, WeightLayout, HeadWeights]] = {}
    for layout in candidates(found, root):
        weights = consistent(layout, root, heads, d_in, out_width, found.used)
        if weights is None:
            continue
        for variant in with_groupings(layout, weights, groupings):
            read = variant.read(root, heads)
            fitting.append((variant, read))
            for encoding in encodings(variant, read):
                best.tried += 1
                error = reproduction_error(read, found, causal, encoding)
                if error < best.error:
                    best.layout, best.error, best.encoding = variant, error, encoding
                if error <= threshold:
                    best.reproduced = True
                    return best
                if encoding is not None and encoding.rotary is not None:
                    shape = (encoding.rotary.pairing, encoding.rotary.fraction,
                             encoding.rotary.dims, encoding.rotary.reversed)
                    if error < rotary.get(shape, (float("inf"),))[0]:
                        rotary[shape] = (error, variant, read)
    # RoPE whose theta is none of the usual ones: fit theta, for the closest pairing/fraction.
    for (pairing, fraction, dims, turned), (_, variant, read) in sorted(
            rotary.items(), key=lambda item: item[1][0])[:REFINED]:
        def error_at(theta: float, variant=variant, read=read, pairing=pairing,
                     fraction=fraction, dims=dims, turned=turned) -> float:
            encoding = PositionEncoding(rotary=Rotary(pairing, theta, fraction, dims,
                                                      reversed=turned))
            return reproduction_error(read, found, causal, encoding)

        theta, error = fit_theta(error_at)
        best.tried += 1
        fitted = PositionEncoding(rotary=Rotary(pairing, theta, fraction, dims, reversed=turned))
        if error <= threshold:
            return Found(variant, True, error, fitted, best.tried)
        if error < best.error:
            best.layout, best.error, best.encoding = variant, error, fitted
    if loose is not None and best.error <= loose:
        best.reproduced = True
        return best
    if not fitting:
        return Found(None, tried=best.tried)
    chosen = by_roles(found, root, fitting)
    return Found(chosen, reproduced=False, error=best.error if best.layout == chosen else
                 float("inf"), encoding=None, tried=best.tried)
