"""Core attention functions, ``f(q, k, v[, mask][, causal])`` over per-head tensors, checked
inside the suite's own projections.

The projections are correct by construction, so every check applies to the function and any
failure is the function's. The axes are (batch, heads, length, head_dim), PyTorch's SDPA
layout, or (batch, length, heads, head_dim), FlashAttention's: behaviour decides (with batch,
heads and length pairwise distinct, nudging one slice of the key/value inputs along an axis
changes the output only in that slice when the axis is the heads, everywhere when it is the
tokens), or ``--layout`` declares it.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from conformance.inference.infer import infer
from conformance.inference.plan import InferenceError, Inferred
from conformance.model.declarations import DeclarationError, Declarations
from conformance.subject.head_projections import HeadProjections

LAYOUT_WORDS = {"bhld": "(batch, heads, length, head_dim)",
                "blhd": "(batch, length, heads, head_dim)"}


class CoreFunctionModule(HeadProjections):
    """A core attention function inside the suite's own q/k/v/out projections; ``layout``
    says how the function takes its per-head tensors."""

    function = staticmethod(lambda q, k, v, **options: q)
    layout = "bhld"

    def forward(self, query, key, value, *args, **options):
        q, k, v = self.heads(query, key, value)
        if self.layout == "blhd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = self.function(q, k, v, *args, **options)
        if self.layout == "blhd":
            out = out.transpose(1, 2)
        return self.merge(out)


def core_function_class(function, layout: str = "bhld") -> type[CoreFunctionModule]:
    """A CoreFunctionModule subclass calling ``function`` in ``layout``, whose forward carries
    the function's own parameter names (so its mask and causal arguments are read as for any
    class)."""
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    if len([p for p in parameters if p.default is p.empty]) < 3:
        raise InferenceError(f"{getattr(function, '__name__', function)}: a core function takes "
                             "(q, k, v[, mask][, causal]) over (batch, heads, length, dim) or "
                             "(batch, length, heads, dim)")

    def forward(self, query, key, value, *args, **options):
        return CoreFunctionModule.forward(self, query, key, value, *args, **options)

    forward.__signature__ = signature.replace(parameters=[
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *parameters])
    return type(getattr(function, "__name__", "core_function"), (CoreFunctionModule,),
                {"function": staticmethod(function), "forward": forward, "layout": layout,
                 "__module__": getattr(function, "__module__", __name__)})


def _slices_apart(function, axis: int) -> bool | None:
    """Whether nudging the key/value inputs at index 0 of ``axis`` changes the output at that
    index alone; None when the function can't be called on these shapes."""
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=generator) for _ in range(3))
    try:
        with torch.no_grad():
            before = function(q, k, v)
            k2, v2 = k.clone(), v.clone()
            k2.select(axis, 0).add_(torch.randn(k2.select(axis, 0).shape, generator=generator))
            v2.select(axis, 0).add_(torch.randn(v2.select(axis, 0).shape, generator=generator))
            after = function(q, k2, v2)
    except Exception:  # the function's own shape checks: this layout is not its
        return None
    if not isinstance(before, torch.Tensor) or before.shape != q.shape:
        return None
    others = [d for d in range(4) if d != axis]
    changed = (after - before).abs().amax(dim=others) > 1e-6
    return bool(changed[0]) and not bool(changed[1:].any())


def function_layout(function) -> tuple[str, str]:
    """(layout, how it was decided) of a core function, by behaviour (see the module
    docstring); (B, H, L, D) where behaviour can't tell."""
    heads_second, heads_third = _slices_apart(function, 1), _slices_apart(function, 2)
    if heads_third and not heads_second:
        return "blhd", ("probed: slices along the third axis are independent (the heads), the "
                        "second axis mixes (the tokens); declare --layout bhld if meant "
                        "otherwise")
    if heads_second and not heads_third:
        return "bhld", ("probed: slices along the second axis are independent (the heads); "
                        "declare --layout blhd if meant otherwise")
    return "bhld", ("assumed: behaviour could not tell the heads' axis; declare --layout blhd "
                    "for (batch, length, heads, dim)")


def infer_function(function, *, name: str | None = None,
                   declared: Declarations | None = None) -> Inferred:
    """Declaration for a core function ``f(q, k, v[, mask][, causal])`` over per-head tensors."""
    label = name or getattr(function, "__name__", "core_function")
    declared = declared or Declarations()
    try:
        stated = declared.choice("layout", tuple(LAYOUT_WORDS))
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    layout, how = (stated, "declared") if stated else function_layout(function)
    inferred = infer(core_function_class(function, layout), name=label, declared=declared)
    note = (f"core function over {LAYOUT_WORDS[layout]} ({how}), wrapped in the suite's own "
            "q/k/v/out projections: every check applies to the function")
    # The wrapper's constructor, forward and projections are the suite's own: nothing to say.
    notes = (note, *(n for n in inferred.notes[2:] if not n.startswith("weights: ")))
    return Inferred(replace(inferred.implementation, notes=notes), notes)
