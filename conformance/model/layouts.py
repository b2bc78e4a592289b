"""Weight layouts that behaviour finds and names can't: projections fused with their rows
arranged per head or per group, q beside a fused k/v, raw parameter tensors used by einsum or
matmul, and grouped-query heads relabelled.

Every layout here reads and writes the canonical per-head form of :mod:`conformance.model.weights`.
A fused projection's output rows are a sequence of blocks of one head's width; an
*arrangement* says which canonical (role, head) each block is:

- ``stacked``: every q head, then every k head, then every v head (``qkv(x).chunk(3)``,
  GPT-2's ``c_attn``, Phi-3's ``qkv_proj``);
- ``per_head``: for each head, its q, k and v blocks together (GPT-NeoX and BLOOM's
  ``query_key_value`` viewed as (B, L, H, 3 * Dh));
- ``per_group``: for each key/value head, the G query heads that read it, then its k and v
  blocks (Falcon's new decoder architecture).

``order`` names the roles in the order they come (``"qkv"`` for the usual one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import nn

from conformance.model.declared_layouts import copy_into, linear_parts, read_output, submodule, write_output
from conformance.model.weights import (
    HeadWeights,
    WeightLayout,
    WeightLayoutError,
    named_together,
    user_path,
)

Arrangement = Literal["stacked", "per_head", "per_group"]

ARRANGEMENT_WORDS = {
    "stacked": "stacked [q; k; v]",
    "per_head": "arranged per head [q_h; k_h; v_h]",
    "per_group": "arranged per key/value group [q_g...; k_g; v_g]",
}


def role_rows(arrangement: Arrangement, order: str, heads: int, kv_heads: int,
              head_dim: int) -> dict[str, torch.Tensor]:
    """For each role in ``order``, the fused rows of its canonical heads (head-major: head h's
    rows h * Dh .. h * Dh + Dh - 1 of the role come first)."""
    counts = {"q": heads, "k": kv_heads, "v": kv_heads}
    blocks: list[tuple[str, int]] = []
    if arrangement == "stacked":
        blocks = [(role, h) for role in order for h in range(counts[role])]
    elif arrangement == "per_head":
        if kv_heads != heads:
            raise WeightLayoutError("a per-head arrangement needs as many key/value heads as "
                                    "query heads")
        blocks = [(role, h) for h in range(heads) for role in order]
    else:
        group = heads // kv_heads
        for g in range(kv_heads):
            for role in order:
                blocks += ([("q", g * group + i) for i in range(group)] if role == "q"
                           else [(role, g)])
    rows: dict[str, list[int]] = {role: [0] * (counts[role] * head_dim) for role in order}
    for index, (role, h) in enumerate(blocks):
        for d in range(head_dim):
            rows[role][h * head_dim + d] = index * head_dim + d
    return {role: torch.tensor(values, dtype=torch.long) for role, values in rows.items()}


def _heads_of(rows: int, heads: int, kv_heads: int | None, roles: str, path: str,
              d_in: int) -> tuple[int, int]:
    """(key/value heads, head_dim) of a fused projection with ``rows`` output rows holding
    ``roles``: the given key/value heads, else the count that makes heads of the input's width
    over the heads (d_in / H) where one does, else the largest that divides."""
    candidates = [kv_heads] if kv_heads else [k for k in range(heads, 0, -1) if heads % k == 0]
    fits = []
    for kv in candidates:
        units = sum(heads if role == "q" else kv for role in roles)
        if rows % units == 0:
            fits.append((rows // units != d_in // heads, -kv, kv, rows // units))
    if fits:
        _, _, kv, head_dim = min(fits)
        return kv, head_dim
    raise WeightLayoutError(f"{path!r} has {rows} rows, not {'/'.join(roles)} parts for "
                            f"{heads} query heads")


def _split_rows(weight: torch.Tensor, bias: torch.Tensor | None,
                rows: dict[str, torch.Tensor], counts: dict[str, int]) -> dict[str, torch.Tensor]:
    parts = {}
    for role, index in rows.items():
        w = weight.detach()[index.to(weight.device)]
        b = (torch.zeros(len(index), dtype=weight.dtype, device=weight.device) if bias is None
             else bias.detach()[index.to(weight.device)])
        parts[f"w_{role}"] = w.reshape(counts[role], -1, weight.shape[1]).clone()
        parts[f"b_{role}"] = b.reshape(counts[role], -1).clone()
    return parts


def _write_rows(weight: torch.Tensor, bias: torch.Tensor | None, rows: dict[str, torch.Tensor],
                weights: HeadWeights, path: str) -> None:
    full_w = weight.detach().clone()
    full_b = None if bias is None else bias.detach().clone()
    any_bias = False
    for role, index in rows.items():
        index = index.to(weight.device)
        full_w[index] = getattr(weights, f"w_{role}").reshape(len(index), -1).to(full_w)
        value = getattr(weights, f"b_{role}").reshape(-1)
        if full_b is not None:
            full_b[index] = value.to(full_b)
        any_bias = any_bias or bool(torch.any(value != 0))
    copy_into(weight, full_w, path)
    if full_b is not None:
        copy_into(bias, full_b, path)
    elif any_bias:
        raise WeightLayoutError(f"{path!r} has no bias, cannot set a non-zero one")


@dataclass(frozen=True)
class ArrangedProjection(WeightLayout):
    """One linear layer producing q, k and v (``qkv``), its rows arranged as ``arrangement``
    says, or a query projection ``q`` beside one producing k and v (``qkv`` then holds the
    key/value rows; ``order`` is ``"kv"`` or ``"vk"``)."""

    qkv: str
    arrangement: Arrangement = "stacked"
    order: str = "qkv"
    o: str | None = None
    q: str | None = None

    def _rows(self, weight: torch.Tensor, heads: int, kv_heads: int | None):
        kv, head_dim = _heads_of(weight.shape[0], heads, kv_heads, self.order, self.qkv,
                                 weight.shape[1])
        return role_rows(self.arrangement, self.order, heads, kv, head_dim), {
            "q": heads, "k": kv, "v": kv}

    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        weight, bias = linear_parts(submodule(module, self.qkv), self.qkv)
        parts: dict[str, torch.Tensor] = {}
        if self.q is not None:
            q_weight, q_bias = linear_parts(submodule(module, self.q), self.q)
            rows = {"q": torch.arange(q_weight.shape[0])}
            parts.update(_split_rows(q_weight, q_bias, rows, {"q": num_heads}))
            head_dim = parts["w_q"].shape[1]
            kv = weight.shape[0] // (2 * head_dim)
            if num_kv_heads is not None and kv != num_kv_heads:
                raise WeightLayoutError(f"{self.qkv!r} has {weight.shape[0]} rows, not k and v "
                                        f"for {num_kv_heads} key/value heads of {head_dim}")
            kv_rows = role_rows(self.arrangement, self.order, kv, kv, head_dim)
            parts.update(_split_rows(weight, bias, kv_rows, {"k": kv, "v": kv}))
        else:
            rows, counts = self._rows(weight, num_heads, num_kv_heads)
            parts.update(_split_rows(weight, bias, rows, counts))
        if self.o is not None:
            parts.update(read_output(submodule(module, self.o), self.o))
        return HeadWeights(**parts)

    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        weight, bias = linear_parts(submodule(module, self.qkv), self.qkv)
        if self.q is not None:
            q_weight, q_bias = linear_parts(submodule(module, self.q), self.q)
            _write_rows(q_weight, q_bias, {"q": torch.arange(q_weight.shape[0])}, weights, self.q)
            kv = weights.num_kv_heads
            rows = role_rows(self.arrangement, self.order, kv, kv, weights.head_dim)
        else:
            rows = role_rows(self.arrangement, self.order, weights.num_heads,
                             weights.num_kv_heads, weights.head_dim)
        _write_rows(weight, bias, rows, weights, self.qkv)
        if self.o is not None:
            write_output(submodule(module, self.o), weights, self.o)

    def paths(self) -> tuple[str, ...]:
        return tuple(path for path in (self.qkv, self.q, self.o) if path is not None)

    def describe(self) -> str:
        words = ARRANGEMENT_WORDS[self.arrangement].replace("[q; k; v]", f"[{'; '.join(self.order)}]")
        qkv = user_path(self.qkv)
        fused = (f"q from {user_path(self.q)}, k and v fused in {qkv} "
                 f"({words.replace('q_h; ', '')})" if self.q else f"q, k, v fused in {qkv} ({words})")
        return "weights: " + fused + (f", output projection {user_path(self.o)}" if self.o
                                      else ", no output projection")


ParameterForm = Literal["out_in", "in_out", "in_heads_dim", "heads_dim_in", "heads_in_dim"]
"""How a raw parameter tensor maps the input to a projection's output: ``out_in`` (H Dh, D),
used as ``x @ W.T``; ``in_out`` (D, H Dh), ``x @ W``; ``in_heads_dim`` (D, H, Dh),
``einsum("bnd,dhk->bhnk")``; ``heads_dim_in`` (H, Dh, D); ``heads_in_dim`` (H, D, Dh)."""

OutputForm = Literal["out_in", "in_out", "heads_dim_out"]
"""How a raw output parameter maps the concatenated heads to the output: (D_out, H Dv),
(H Dv, D_out), or (H, Dv, D_out)."""


def _to_canonical(tensor: torch.Tensor, form: ParameterForm, heads: int) -> torch.Tensor:
    """A raw projection parameter as (H, Dh, D)."""
    t = tensor.detach()
    if form == "out_in":
        return t.reshape(heads, -1, t.shape[-1])
    if form == "in_out":
        return t.T.reshape(heads, -1, t.shape[0])
    if form == "in_heads_dim":
        return t.permute(1, 2, 0)
    if form == "heads_dim_in":
        return t
    return t.transpose(1, 2)  # heads_in_dim


def _from_canonical(weight: torch.Tensor, form: ParameterForm, shape: torch.Size) -> torch.Tensor:
    if form == "out_in":
        return weight.reshape(shape)
    if form == "in_out":
        return weight.reshape(-1, weight.shape[-1]).T.reshape(shape)
    if form == "in_heads_dim":
        return weight.permute(2, 0, 1)
    if form == "heads_dim_in":
        return weight
    return weight.transpose(1, 2)


@dataclass(frozen=True)
class ParameterProjections(WeightLayout):
    """q, k, v (and the output) as raw parameter tensors the forward uses directly (einsum,
    matmul), each with its :data:`ParameterForm`; no biases."""

    q: tuple[str, ParameterForm]
    k: tuple[str, ParameterForm]
    v: tuple[str, ParameterForm]
    o: tuple[str, OutputForm] | None = None

    @staticmethod
    def _parameter(module: nn.Module, path: str) -> torch.Tensor:
        try:
            return module.get_parameter(path)
        except AttributeError as error:
            raise WeightLayoutError(f"no parameter {path!r}") from error

    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        parts = {}
        w_q = _to_canonical(self._parameter(module, self.q[0]), self.q[1], num_heads)
        parts["w_q"] = w_q.clone()
        for role in ("k", "v"):
            path, form = getattr(self, role)
            raw = self._parameter(module, path)
            kv = num_kv_heads or (raw.numel() // (w_q.shape[1] * w_q.shape[2]))
            parts[f"w_{role}"] = _to_canonical(raw, form, kv).clone()
        for role in ("q", "k", "v"):
            w = parts[f"w_{role}"]
            parts[f"b_{role}"] = torch.zeros(w.shape[:2], dtype=w.dtype, device=w.device)
        if self.o is not None:
            path, form = self.o
            raw = self._parameter(module, path).detach()
            w_o = (raw if form == "out_in" else raw.T if form == "in_out"
                   else raw.reshape(-1, raw.shape[-1]).T)
            parts["w_o"] = w_o.clone()
            parts["b_o"] = torch.zeros(w_o.shape[0], dtype=w_o.dtype, device=w_o.device)
        return HeadWeights(**parts)

    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        for role in ("q", "k", "v"):
            path, form = getattr(self, role)
            raw = self._parameter(module, path)
            if bool(torch.any(getattr(weights, f"b_{role}") != 0)):
                raise WeightLayoutError(f"{path!r} has no bias, cannot set a non-zero one")
            copy_into(raw, _from_canonical(getattr(weights, f"w_{role}"), form, raw.shape), path)
        if self.o is not None:
            path, form = self.o
            raw = self._parameter(module, path)
            w_o = weights.w_o
            value = (w_o if form == "out_in" else w_o.T if form == "in_out"
                     else w_o.T.reshape(raw.shape))
            copy_into(raw, value, path)
            if weights.b_o is not None and bool(torch.any(weights.b_o != 0)):
                raise WeightLayoutError(f"{path!r} has no bias, cannot set a non-zero one")

    def describe(self) -> str:
        names = [self.q[0], self.k[0], self.v[0]] + ([self.o[0]] if self.o else [])
        return ("weights from the parameters " + named_together(names)
                + ("" if self.o else ", no output projection"))


@dataclass(frozen=True)
class RelabelledHeads(WeightLayout):
    """Grouped-query attention whose query head m reads key/value head m mod Hkv (``repeat``,
    tiling, as x-transformers does) instead of m // G: a relabelling of the query heads, read
    through ``inner`` with the query heads (and the output projection's column blocks) put in
    the canonical grouped order (canonical head g G + r is module head r Hkv + g)."""

    inner: WeightLayout

    @staticmethod
    def _order(heads: int, kv_heads: int) -> list[int]:
        """Canonical head c -> the module's head."""
        group = heads // kv_heads
        return [(c % group) * kv_heads + c // group for c in range(heads)]

    def read(self, module: nn.Module, num_heads: int,
             num_kv_heads: int | None = None) -> HeadWeights:
        weights = self.inner.read(module, num_heads, num_kv_heads)
        return _permute_queries(weights, self._order(weights.num_heads, weights.num_kv_heads))

    def write(self, module: nn.Module, weights: HeadWeights) -> None:
        order = self._order(weights.num_heads, weights.num_kv_heads)
        inverse = [order.index(m) for m in range(len(order))]
        self.inner.write(module, _permute_queries(weights, inverse))

    def describe(self) -> str:
        return (self.inner.describe() + "; query head m reads key/value head m mod Hkv "
                "(tiled), read as the canonical grouping")


def _permute_queries(weights: HeadWeights, order: list[int]) -> HeadWeights:
    """New query head i is old head ``order[i]``; ``w_o``'s column blocks follow."""
    index = torch.as_tensor(order, device=weights.w_q.device)
    w_o = weights.w_o
    if w_o is not None:
        blocks = w_o.reshape(w_o.shape[0], weights.num_heads, weights.value_dim)
        w_o = blocks[:, index].reshape(w_o.shape[0], -1)
    return replace(weights, w_q=weights.w_q[index], b_q=weights.b_q[index], w_o=w_o)
