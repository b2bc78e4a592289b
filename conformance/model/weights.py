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

from conformance.errors import ConformanceError

WRAPPER = "inner"
"""The attribute under which the suite's wrapper of an inferred class or kernel (and the bundled
wrappers of library layers) holds the module under test: the paths the suite reads begin with
it, and the user's own paths are what follows."""


def user_path(path: str | None) -> str:
    """``path`` as the user's module names it: without the wrapper's leading ``inner.``."""
    if path is None or path == WRAPPER:
        return ""
    return path.removeprefix(WRAPPER + ".")


def named_together(paths) -> str:
    """``paths`` as the user's module names them, joined by "/", their common parent said once:
    ``q_proj/k_proj/v_proj of model.layers.0.self_attn`` (a layer deep in a model)."""
    parts = [user_path(path).split(".") for path in paths]
    common = 0
    while len(parts) > 1 and all(len(p) > common + 1 for p in parts) and len(
            {p[common] for p in parts}) == 1:
        common += 1
    if common == 0:
        return "/".join(".".join(p) for p in parts)
    return "/".join(".".join(p[common:]) for p in parts) + " of " + ".".join(parts[0][:common])


class WeightLayoutError(ConformanceError):
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
