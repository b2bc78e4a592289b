"""The weight layouts a user declares (separate q/k/v/out projections, one fused projection, per-head
modules, a packed in-projection like nn.MultiheadAttention's), and the reading and writing of
projection matrices per head they are made of.

Each reads and writes the canonical per-head form, :class:`~conformance.model.weights.HeadWeights`;
:mod:`conformance.model.layouts` adds the layouts only behaviour finds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from conformance.model.weights import (
    HeadWeights,
    WeightLayout,
    WeightLayoutError,
    named_together,
    user_path,
)


def submodule(module: nn.Module, path: str) -> nn.Module:
    """The submodule at ``path``; WeightLayoutError when there is none."""
    try:
        return module.get_submodule(path)
    except AttributeError as error:
        raise WeightLayoutError(f"no submodule {path!r} in {type(module).__name__}") from error


def is_conv1d(module: nn.Module) -> bool:
    """HuggingFace's ``Conv1D``: a linear layer whose weight is stored (in, out), transposed."""
    return type(module).__name__ == "Conv1D"


def linear_parts(linear: nn.Module, path: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight as (out, in), bias); a Conv1D's weight comes back as a transposed view, so
    writing into it writes the module's own parameter."""
    weight = getattr(linear, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise WeightLayoutError(f"{path!r} has no 2-D weight (is it an nn.Linear?)")
    if is_conv1d(linear):
        weight = weight.T
    bias = getattr(linear, "bias", None)
    return weight, bias if isinstance(bias, torch.Tensor) else None


def _split_heads(matrix: torch.Tensor, bias: torch.Tensor | None, heads: int, path: str):
    """(H * Dh, D_in) weight and (H * Dh,) bias -> (H, Dh, D_in), (H, Dh); heads are row blocks."""
    rows, d_in = matrix.shape
    if rows % heads:
        raise WeightLayoutError(f"{path!r} has {rows} output rows, not divisible by {heads} heads")
    w = matrix.detach().reshape(heads, rows // heads, d_in).clone()
    b = (torch.zeros(rows, dtype=matrix.dtype, device=matrix.device)
         if bias is None else bias.detach().clone())
    return w, b.reshape(heads, rows // heads)


def _kv_heads(rows: int, head_dim: int, num_heads: int, path: str) -> int:
    """Key/value heads of ``head_dim`` in ``rows`` output rows: a divisor of ``num_heads``
    (``num_heads`` itself for multi-head attention)."""
    if head_dim and rows % head_dim == 0:
        count = rows // head_dim
        if count and num_heads % count == 0:
            return count
    raise WeightLayoutError(f"{path!r} has {rows} output rows: not key/value heads of width "
                            f"{head_dim} grouping {num_heads} query heads")


def copy_into(param: torch.Tensor | None, value: torch.Tensor | None, path: str) -> None:
    if param is None:
        if value is not None and bool(torch.any(value != 0)):
            raise WeightLayoutError(f"{path!r} has no bias, cannot set a non-zero one")
        return
    if value is None:
        raise WeightLayoutError(f"{path!r} needs a value")
    with torch.no_grad():
        param.copy_(value.reshape(param.shape))


def _split_packed(weight: torch.Tensor, bias: torch.Tensor | None, heads: int, path: str,
                  kv_heads: int | None = None):
    """[q; k; v] stacked rows -> the canonical q, k, v parts (with ``kv_heads`` key/value heads,
    the rows are H Dh + 2 Hkv Dh)."""
    kv_heads = heads if kv_heads is None else kv_heads
    units = heads + 2 * kv_heads
    if weight.shape[0] % units:
        raise WeightLayoutError(f"{path!r} has {weight.shape[0]} rows, not q, k, v parts for "
                                f"{heads} query and {kv_heads} key/value heads")
    head_dim = weight.shape[0] // units
    sizes = (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    parts, start = {}, 0
    for role, size, count in zip("qkv", sizes, (heads, kv_heads, kv_heads), strict=True):
        part_bias = None if bias is None else bias[start : start + size]
        parts[f"w_{role}"], parts[f"b_{role}"] = _split_heads(
            weight[start : start + size], part_bias, count, path)
        start += size
    return parts


def _write_packed(weight: torch.Tensor, bias: torch.Tensor | None, weights: HeadWeights,
                  path: str) -> None:
    d_in = weights.d_in
    copy_into(weight, torch.cat([weights.w_q.reshape(-1, d_in), weights.w_k.reshape(-1, d_in),
                                  weights.w_v.reshape(-1, d_in)]), path)
    copy_into(bias, torch.cat([weights.b_q.reshape(-1), weights.b_k.reshape(-1),
                                weights.b_v.reshape(-1)]), path)


def read_output(linear: nn.Module, path: str) -> dict[str, torch.Tensor]:
    weight, bias = linear_parts(linear, path)
    zeros = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)
    return {"w_o": weight.detach().clone(),
            "b_o": zeros if bias is None else bias.detach().clone()}


def write_output(linear: nn.Module, weights: HeadWeights, path: str) -> None:
    weight, bias = linear_parts(linear, path)
    copy_into(weight, weights.w_o, path)
    copy_into(bias, weights.b_o, path)


@dataclass(frozen=True)
class SeparateProjections(WeightLayout):
    """Separate ``nn.Linear`` layers for q, k, v (and optionally the output), heads as row blocks.

    This is the layout of ``view(B, L, H, Dh).transpose(1, 2)`` implementations: head ``h`` owns
    rows ``h * Dh : (h + 1) * Dh`` of each projection.
    """

    q: str
    k: str
    v: str
    o: str | None = None

    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        parts = {}
        weight, bias = linear_parts(submodule(module, self.q), self.q)
        parts["w_q"], parts["b_q"] = _split_heads(weight, bias, num_heads, self.q)
        weight, bias = linear_parts(submodule(module, self.k), self.k)
        # Key heads of the query's width (fewer of them in grouped-query attention); the values
        # have as many heads, of any width.
        heads = num_kv_heads or _kv_heads(weight.shape[0], parts["w_q"].shape[1], num_heads,
                                          self.k)
        parts["w_k"], parts["b_k"] = _split_heads(weight, bias, heads, self.k)
        weight, bias = linear_parts(submodule(module, self.v), self.v)
        parts["w_v"], parts["b_v"] = _split_heads(weight, bias, heads, self.v)
        if self.o is not None:
            parts.update(read_output(submodule(module, self.o), self.o))
        return HeadWeights(**parts)

    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        for role in ("q", "k", "v"):
            path = getattr(self, role)
            weight, bias = linear_parts(submodule(module, path), path)
            copy_into(weight, getattr(weights, f"w_{role}"), path)
            copy_into(bias, getattr(weights, f"b_{role}").reshape(-1), path)
        if self.o is not None:
            write_output(submodule(module, self.o), weights, self.o)

    def describe(self) -> str:
        names = [self.q, self.k, self.v] + ([self.o] if self.o else [])
        return ("weights from " + named_together(names)
                + ("" if self.o else ", no output projection"))


@dataclass(frozen=True)
class FusedProjection(WeightLayout):
    """One ``nn.Linear`` producing q, k and v stacked along its output rows ([q; k; v])."""

    qkv: str
    o: str | None = None

    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        weight, bias = linear_parts(submodule(module, self.qkv), self.qkv)
        parts = _split_packed(weight, bias, num_heads, self.qkv, num_kv_heads)
        if self.o is not None:
            parts.update(read_output(submodule(module, self.o), self.o))
        return HeadWeights(**parts)

    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        weight, bias = linear_parts(submodule(module, self.qkv), self.qkv)
        _write_packed(weight, bias, weights, self.qkv)
        if self.o is not None:
            write_output(submodule(module, self.o), weights, self.o)

    def describe(self) -> str:
        return f"fused q/k/v weights from {user_path(self.qkv)}" + (
            f", output projection {user_path(self.o)}" if self.o else ", no output projection")


@dataclass(frozen=True)
class PerHeadModules(WeightLayout):
    """A ``ModuleList`` of single-head modules, each with its own q/k/v linears; heads in order."""

    heads: str
    q: str
    k: str
    v: str
    o: str | None = None

    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        head_list = list(submodule(module, self.heads))
        if len(head_list) != num_heads:
            raise WeightLayoutError(f"{self.heads!r} holds {len(head_list)} heads, expected {num_heads}")
        parts: dict[str, list[torch.Tensor]] = {}
        for head in head_list:
            for role in ("q", "k", "v"):
                path = f"{self.heads}[*].{getattr(self, role)}"
                weight, bias = linear_parts(submodule(head, getattr(self, role)), path)
                w, b = _split_heads(weight, bias, 1, path)
                parts.setdefault(f"w_{role}", []).append(w[0])
                parts.setdefault(f"b_{role}", []).append(b[0])
        stacked = {name: torch.stack(values) for name, values in parts.items()}
        if self.o is not None:
            stacked.update(read_output(submodule(module, self.o), self.o))
        return HeadWeights(**stacked)

    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        for h, head in enumerate(submodule(module, self.heads)):
            for role in ("q", "k", "v"):
                path = f"{self.heads}[{h}].{getattr(self, role)}"
                weight, bias = linear_parts(submodule(head, getattr(self, role)), path)
                copy_into(weight, getattr(weights, f"w_{role}")[h], path)
                copy_into(bias, getattr(weights, f"b_{role}")[h], path)
        if self.o is not None:
            write_output(submodule(module, self.o), weights, self.o)

    def describe(self) -> str:
        return (f"per-head weights from {user_path(self.heads)}[h].{self.q}/{self.k}/{self.v}"
                + (f", output projection {user_path(self.o)}" if self.o
                   else ", heads concatenated"))


@dataclass(frozen=True)
class PackedInProjection(WeightLayout):
    """``torch.nn.MultiheadAttention``'s packed ``in_proj_weight`` ([q; k; v]) and ``out_proj``.

    ``path`` names the ``nn.MultiheadAttention`` submodule ("" for the module itself); ``o``,
    where set, the output projection's path from the root module (a layer of its own that packs
    its in-projection so and names its output projection otherwise).
    """

    path: str = ""
    o: str | None = None

    def _mha(self, module: nn.Module) -> nn.Module:
        mha = submodule(module, self.path) if self.path else module
        if getattr(mha, "in_proj_weight", None) is None:
            raise WeightLayoutError(
                f"{self.path or type(module).__name__!r} has no packed in_proj_weight")
        if self.o is None and not isinstance(getattr(mha, "out_proj", None), nn.Linear):
            raise WeightLayoutError(
                f"{self.path or type(module).__name__!r} has no out_proj linear")
        return mha

    def _output(self, module: nn.Module, mha: nn.Module) -> tuple[nn.Module, str]:
        if self.o is None:
            return mha.out_proj, "out_proj"
        return submodule(module, self.o), self.o

    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        mha = self._mha(module)
        parts = _split_packed(mha.in_proj_weight, mha.in_proj_bias, num_heads, "in_proj_weight")
        parts.update(read_output(*self._output(module, mha)))
        return HeadWeights(**parts)

    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        mha = self._mha(module)
        _write_packed(mha.in_proj_weight, mha.in_proj_bias, weights, "in_proj_weight")
        linear, path = self._output(module, mha)
        write_output(linear, weights, path)

    def describe(self) -> str:
        prefix = f"{user_path(self.path)}." if user_path(self.path) else ""
        output = f"{prefix}out_proj" if self.o is None else user_path(self.o)
        return f"weights from {prefix}in_proj_weight/{output}"

    @classmethod
    def of(cls, path: str, mha: nn.Module, output: str | None) -> PackedInProjection | None:
        """The layout of ``mha`` at ``path`` (it has a packed ``in_proj_weight``): with its own
        ``out_proj`` as nn.MultiheadAttention has, else with ``output`` (the path of a layer of
        its own that projects the output); None where it has neither."""
        if isinstance(getattr(mha, "out_proj", None), nn.Linear):
            return cls(path)
        return cls(path, o=output) if output else None
