"""Projection weights in the canonical per-head form, and layouts that read and write them.

The canonical form (all tensors in the module's dtype and device):

    w_q: (H, Dh, D_in)    b_q: (H, Dh)
    w_k: (Hkv, Dh, D_in)  b_k: (Hkv, Dh)
    w_v: (Hkv, Dv, D_in)  b_v: (Hkv, Dv)
    w_o: (D_out, H * Dv) or None (no output projection: the output is the concatenated heads)
    b_o: (D_out,) or None

``Hkv`` = H for multi-head attention; grouped-query attention has fewer key/value heads
(``H % Hkv == 0``, G = H / Hkv query heads per group; multi-query attention has one), and query
head ``h`` reads key/value head ``g(h) = h // G``: the grouping of ``repeat_interleave(G)`` along
the head axis (HuggingFace's ``repeat_kv``). Head ``h`` computes
``softmax((x w_q[h]^T + b_q[h]) (x w_k[g]^T + b_k[g])^T / sqrt(Dh)) (x w_v[g]^T + b_v[g])``; the
heads are concatenated in order and projected by ``w_o``, ``b_o``. A missing bias reads as zeros;
writing a non-zero bias where the module has none is an error.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn


class WeightLayoutError(Exception):
    """The module's parameters don't match the declared layout."""


@dataclass(frozen=True)
class HeadWeights:
    """Projection weights in the canonical per-head form (see the module docstring)."""

    w_q: torch.Tensor
    b_q: torch.Tensor
    w_k: torch.Tensor
    b_k: torch.Tensor
    w_v: torch.Tensor
    b_v: torch.Tensor
    w_o: torch.Tensor | None = None
    b_o: torch.Tensor | None = None

    @property
    def num_heads(self) -> int:
        return self.w_q.shape[0]

    @property
    def head_dim(self) -> int:
        return self.w_q.shape[1]

    @property
    def value_dim(self) -> int:
        return self.w_v.shape[1]

    @property
    def d_in(self) -> int:
        return self.w_q.shape[2]

    @property
    def num_kv_heads(self) -> int:
        return self.w_k.shape[0]

    @property
    def group(self) -> int:
        """Query heads per key/value head (1 for multi-head attention)."""
        return self.num_heads // self.num_kv_heads

    def kv_head(self, h: int) -> int:
        """The key/value head query head ``h`` reads."""
        return h // self.group

    def expanded(self) -> HeadWeights:
        """The same attention with one key/value head per query head (``repeat_interleave``)."""
        if self.group == 1:
            return self
        moved = {name: getattr(self, name).repeat_interleave(self.group, dim=0)
                 for name in ("w_k", "b_k", "w_v", "b_v")}
        return replace(self, **moved)

    @property
    def d_out(self) -> int:
        return self.num_heads * self.value_dim if self.w_o is None else self.w_o.shape[0]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> HeadWeights:
        """Apply ``fn`` to every tensor (``None`` stays ``None``)."""
        return HeadWeights(**{
            name: None if value is None else fn(value) for name, value in self._fields()
        })

    def permute_heads(self, order: Sequence[int]) -> HeadWeights:
        """Relabel heads: new head ``i`` is old head ``order[i]``; ``w_o``'s column blocks follow.

        With grouped key/value heads the order must move whole groups (the key/value heads
        follow their groups) and may reorder query heads within a group."""
        index = torch.as_tensor(list(order), device=self.w_q.device)
        group = self.group
        kv_order = [order[i * group] // group for i in range(self.num_kv_heads)]
        if any(order[i] // group != kv_order[i // group] for i in range(len(order))):
            raise ValueError(f"head order {list(order)} splits a group of {group} query heads")
        kv_index = torch.as_tensor(kv_order, device=self.w_q.device)
        moved = {name: getattr(self, name)[index] for name in ("w_q", "b_q")}
        moved.update({name: getattr(self, name)[kv_index] for name in ("w_k", "b_k", "w_v",
                                                                        "b_v")})
        w_o = self.w_o
        if w_o is not None:
            blocks = w_o.reshape(w_o.shape[0], self.num_heads, self.value_dim)
            w_o = blocks[:, index].reshape(w_o.shape[0], -1)
        return replace(self, w_o=w_o, **moved)

    def head(self, h: int) -> HeadWeights:
        """Query head ``h`` alone with its key/value head, as a one-head module with no output
        projection."""
        g = self.kv_head(h)
        return HeadWeights(
            w_q=self.w_q[h : h + 1], b_q=self.b_q[h : h + 1],
            w_k=self.w_k[g : g + 1], b_k=self.b_k[g : g + 1],
            w_v=self.w_v[g : g + 1], b_v=self.b_v[g : g + 1],
        )

    def _fields(self) -> list[tuple[str, torch.Tensor | None]]:
        return [(name, getattr(self, name))
                for name in ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")]


class WeightLayout(ABC):
    """Where a module keeps its projections; reads and writes them in the canonical form."""

    @abstractmethod
    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        """The module's current weights, canonical form, detached copies.

        ``num_kv_heads``: the key/value heads it was built with (grouped-query attention), where
        the layout can't tell them from shapes alone; None reads them from the shapes."""

    @abstractmethod
    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        """Load ``weights`` into the module's own parameters, in place."""

    @abstractmethod
    def describe(self) -> str:
        """One line naming the submodules, for reports."""

    def paths(self) -> tuple[str, ...]:
        """The submodule and parameter paths it reads (a parameter is a projection's when its
        name is one of them or lies under one)."""
        found: list[str] = []
        for value in vars(self).values():
            if isinstance(value, WeightLayout):
                found += value.paths()
            elif isinstance(value, tuple) and value and isinstance(value[0], str):
                found.append(value[0])
            elif isinstance(value, str):
                found.append(value)
        return tuple(found)


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
        return "weights from " + "/".join(names) + ("" if self.o else ", no output projection")


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
        return f"fused q/k/v weights from {self.qkv}" + (
            f", output projection {self.o}" if self.o else ", no output projection")


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
        return (f"per-head weights from {self.heads}[h].{self.q}/{self.k}/{self.v}"
                + (f", output projection {self.o}" if self.o else ", heads concatenated"))


@dataclass(frozen=True)
class PackedInProjection(WeightLayout):
    """``torch.nn.MultiheadAttention``'s packed ``in_proj_weight`` ([q; k; v]) and ``out_proj``.

    ``path`` names the ``nn.MultiheadAttention`` submodule ("" for the module itself).
    """

    path: str = ""

    def _mha(self, module: nn.Module) -> nn.Module:
        mha = submodule(module, self.path) if self.path else module
        if getattr(mha, "in_proj_weight", None) is None:
            raise WeightLayoutError(
                f"{self.path or type(module).__name__!r} has no packed in_proj_weight")
        return mha

    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        mha = self._mha(module)
        parts = _split_packed(mha.in_proj_weight, mha.in_proj_bias, num_heads, "in_proj_weight")
        parts.update(read_output(mha.out_proj, "out_proj"))
        return HeadWeights(**parts)

    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        mha = self._mha(module)
        _write_packed(mha.in_proj_weight, mha.in_proj_bias, weights, "in_proj_weight")
        write_output(mha.out_proj, weights, "out_proj")

    def describe(self) -> str:
        prefix = f"{self.path}." if self.path else ""
        return f"weights from {prefix}in_proj_weight/{prefix}out_proj"
