"""The suite's wrapper of a core attention function: its own q/k/v/out projections around
the function, the per-head tensors handed over in the function's layout (see
:mod:`conformance.inference.functions.core_function`)."""

from __future__ import annotations

import inspect

import torch

from conformance.inference.plan import InferenceError
from conformance.model.forms import ALIBI_OPTION, LSE_OPTION
from conformance.numerics.position_encoding import standard_slopes
from conformance.subject.head_projections import HeadProjections

DROPOUT_ARGUMENTS = ("dropout_p",)
"""A kernel's dropout-rate keyword (FlashAttention's, SDPA's)."""


class _StridedCotangent(torch.autograd.Function):
    """Identity whose backward hands on the cotangent with the last two axes' memory order
    swapped: same values, not contiguous. A kernel's backward sees such a ``dout`` wherever a
    model transposes its output before the output projection; one that reads it as contiguous
    (FlashAttention once did) computes a wrong gradient, which ``reference`` then finds."""

    @staticmethod
    def forward(ctx, out: torch.Tensor) -> torch.Tensor:
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.transpose(-1, -2).contiguous().transpose(-1, -2)


class CoreFunctionModule(HeadProjections):
    """A core attention function inside the suite's own q/k/v/out projections; ``layout``
    says how the function takes its per-head tensors. Its backward receives a non-contiguous
    cotangent (see :class:`_StridedCotangent`); in (B, H, L, D) its inputs are non-contiguous
    views too, as a model's transposed projections are."""

    function = staticmethod(lambda q, k, v, **options: q)
    layout = "bhld"
    dropout_argument: str | None = None
    """The function's dropout-rate keyword (``dropout_p``), given the constructor's ``dropout``
    in train mode and 0 in eval."""
    dropout = 0.0
    compute_dtype: torch.dtype | None = None
    """Set only while inference probes a function that refuses float32: the per-head tensors
    are handed to it in this dtype and its output cast back."""

    def per_head(self, query, key, value) -> tuple[torch.Tensor, ...]:
        """q, k, v projected and split into heads in the function's layout (and dtype, while
        inference probes: see ``compute_dtype``), with the dtype they came in."""
        q, k, v = self.heads(query, key, value)
        if self.layout == "blhd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        given = q.dtype
        if self.compute_dtype is not None:
            q, k, v = (t.to(self.compute_dtype) for t in (q, k, v))
        return q, k, v, given

    def merged(self, out: torch.Tensor, given: torch.dtype) -> torch.Tensor:
        """The function's output (in its layout) back in ``given``, heads merged, projected."""
        if self.compute_dtype is not None:
            out = out.to(given)
        if self.layout == "blhd":
            out = out.transpose(1, 2)
        return self.merge(out)

    def forward(self, query, key, value, *args, **options):
        q, k, v, given = self.per_head(query, key, value)
        if self.dropout_argument and self.dropout_argument not in options:
            # The configured rate in train mode, none in eval (a kernel takes it per call).
            options[self.dropout_argument] = self.dropout if self.training else 0.0
        slopes = options.pop(ALIBI_OPTION, None)
        if slopes is not None:  # the paper's slopes for these heads, through its own keyword
            options[slopes] = torch.tensor(standard_slopes(self.num_heads), dtype=torch.float32,
                                           device=q.device)
        keyword = options.pop(LSE_OPTION, None)
        if keyword is not None:  # the log-sum-exp asked for: (B, Lq, H) in place of the output
            lse = self.function(q, k, v, *args, **options, **({keyword: True} if keyword else {}))
            lse = lse[1].float()
            return (lse.squeeze(-1) if lse.dim() == 4 else lse).transpose(1, 2)
        out = self.function(q, k, v, *args, **options)
        if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
            out = out[0]  # the (out, lse) return form
        return self.merged(_StridedCotangent.apply(out), given)


def core_function_class(function, layout: str = "bhld", grouped: bool = False,
                        dropout: bool = True) -> type[CoreFunctionModule]:
    """A CoreFunctionModule subclass calling ``function`` in ``layout``, whose forward carries
    the function's own parameter names (so its mask and causal arguments are read as for any
    class); ``grouped``: its constructor takes ``num_kv_heads`` (the function takes fewer
    key/value heads than query heads), so that inference finds grouped heads as for a class."""
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
    # ``dropout`` False: the function refuses a rate above 0 (probed), so none is configured.
    rate = next((p.name for p in parameters if p.name in DROPOUT_ARGUMENTS and dropout), None)

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 dropout: float = 0.0) -> None:
        HeadProjections.__init__(self, d_model, num_heads, num_kv_heads)
        self.dropout = dropout

    # The constructor takes what the function does: grouped heads, a dropout rate.
    __init__.__signature__ = inspect.Signature([
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in ("self", "d_model", "num_heads")] + [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for name, default, taken in (("num_kv_heads", None, grouped), ("dropout", 0.0, rate))
        if taken])

    return type(getattr(function, "__name__", "core_function"), (CoreFunctionModule,),
                {"function": staticmethod(function), "forward": forward, "layout": layout,
                 "__init__": __init__, "dropout_argument": rate,
                 "__module__": getattr(function, "__module__", __name__)})
