"""What an implementation under test declares about itself, and the configuration it is built from.

These are plain data: they cross the boundary to an implementation unchanged, whether it runs in
this process or in another one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from conformance.weights import WeightLayout

CallConvention = Literal["self", "qkv"]
"""``"self"``: ``f(x[, mask])``; ``"qkv"``: ``f(query, key, value[, mask])``."""

Causality = Literal["never", "always", "optional"]
"""Whether the implementation masks the future: never, always, or when asked through an argument."""

DropoutKind = Literal["none", "config", "fixed"] | float
"""No dropout; the rate given by ``Config.dropout``; a rate the module hard-codes (its value, or
``"fixed"`` where unknown)."""

FullyMaskedPolicy = Literal["zeros", "nan", "uniform", "report"]
"""What a row with every key masked gives: zero weights (output = output bias), NaN, uniform
weights over all keys, or whatever it gives (``report``: only reported)."""


class MaskKind(str, Enum):
    """How mask values are read."""

    KEEP_INT = "keep_int"
    """Integer tensor, 1 = attend, 0 = masked (``masked_fill(mask == 0, ...)``)."""
    KEEP_BOOL = "keep_bool"
    """Boolean tensor, True = attend (``F.scaled_dot_product_attention``'s ``attn_mask``)."""
    IGNORE_BOOL = "ignore_bool"
    """Boolean tensor, True = masked (``nn.MultiheadAttention``'s ``key_padding_mask``)."""
    KEEP_FLOAT = "keep_float"
    """Float tensor in the input's dtype, 1.0 = attend, 0.0 = masked (HuggingFace's raw
    ``attention_mask``, turned into ``(1 - mask) * finfo.min`` inside)."""
    ADDITIVE = "additive"
    """Float tensor added to the logits: 0 = attend, -inf = masked."""
    ADDITIVE_MIN = "additive_min"
    """Float tensor added to the logits: 0 = attend, ``torch.finfo(dtype).min`` = masked."""


class MaskLayout(str, Enum):
    """The shape the mask argument is given in."""

    KEY_PADDING = "key_padding"
    """(batch, kv_len)."""
    BROADCAST = "broadcast"
    """(batch, 1, 1, kv_len), broadcast over heads and query rows."""
    PER_QUERY = "per_query"
    """(batch, q_len, kv_len)."""
    PER_QUERY_BROADCAST = "per_query_broadcast"
    """(batch, 1, q_len, kv_len), broadcast over heads (HuggingFace's 4-D masks)."""
    PER_HEAD = "per_head"
    """(batch, num_heads, q_len, kv_len)."""
    SHARED = "shared"
    """(q_len, kv_len), one mask for the whole batch (``nn.MultiheadAttention``'s 2-D
    ``attn_mask``): only masks that are the same for every batch element can be given."""


@dataclass(frozen=True)
class MaskConvention:
    """How the implementation takes a padding mask.

    ``argument`` names the keyword it is passed as; ``None`` passes it positionally after the
    inputs.
    """

    kind: MaskKind
    layout: MaskLayout
    argument: str | None = None

    def describe(self) -> str:
        return f"{KIND_WORDS[self.kind]}, shape {LAYOUT_SHAPES[self.layout]}"

    def spec(self) -> str:
        """The declaration that states this convention: ``KIND:LAYOUT[@ARGUMENT]``."""
        argument = f"@{self.argument}" if self.argument else ""
        return f"{self.kind.value}:{self.layout.value}{argument}"


KIND_WORDS = {
    MaskKind.KEEP_INT: "int mask, 0 = masked",
    MaskKind.KEEP_BOOL: "bool mask, True = attend",
    MaskKind.IGNORE_BOOL: "bool mask, True = ignore",
    MaskKind.KEEP_FLOAT: "float mask, 1.0 = attend, 0.0 = masked",
    MaskKind.ADDITIVE: "additive float mask, -inf = masked",
    MaskKind.ADDITIVE_MIN: "additive float mask, finfo.min = masked",
}
LAYOUT_SHAPES = {
    MaskLayout.KEY_PADDING: "(B, Lk)",
    MaskLayout.BROADCAST: "(B, 1, 1, Lk)",
    MaskLayout.PER_QUERY: "(B, Lq, Lk)",
    MaskLayout.PER_QUERY_BROADCAST: "(B, 1, Lq, Lk)",
    MaskLayout.PER_HEAD: "(B, H, Lq, Lk)",
    MaskLayout.SHARED: "(Lq, Lk)",
}


@dataclass(frozen=True)
class Config:
    """One generated configuration an implementation is built for and called with.

    ``d_model`` is both the input and the output width; ``head_dim = d_model // num_heads``.
    """

    batch: int
    q_len: int
    kv_len: int
    d_model: int
    num_heads: int
    dropout: float = 0.0
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


DEFAULT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)


@dataclass(frozen=True)
class Capabilities:
    """What an implementation declares it can do; checks needing more SKIP with the reason.

    Attributes:
        call: the call convention.
        mask: how it takes a padding mask, or ``None`` when it takes none.
        mask_problem: why a mask argument it has could not be given a convention (inference
            found none that makes masked keys invisible); ``padding`` fails with it once, the
            other mask checks skip.
        mask_doubt: what inference could not decide about the mask it accepted (a polarity the
            argument's name does not settle); ``padding`` gives it as a warning.
        causal: whether it masks the future.
        causal_argument: keyword that turns causality on, when ``causal == "optional"``.
        cross_attention: whether ``kv_len != q_len`` is supported (``"qkv"`` only).
        max_len: the longest sequence it accepts (a ``block_size`` buffer, say).
        heads: a fixed number of heads (1 for single-head modules), or ``None`` for any.
        shapes: the (num_heads, head_dim) pairs it can be built for, where its constructor
            rejects some (see :mod:`conformance.constraints`); ``None`` for any.
        dtypes: the floating dtypes it supports.
        assumed_dtypes: those of ``dtypes`` that inference assumed rather than anyone declared
            (float16 / bfloat16 for an undeclared module): what breaks there is a warning.
        positional: a position encoding inside the module ("rotary", "alibi", "positions"),
            with its evidence; checks that assume position-free attention skip.
        weights: whether its projections are readable and writable in the canonical form.
        fully_masked: what a row with every key masked gives (see FullyMaskedPolicy).
        dropout: ``"none"``; ``"config"`` when the factory honours ``Config.dropout``; or the
            fixed rate of a module that hard-codes one.
        mask_formats: other mask formats it accepts besides ``mask``; all must agree.
        paths: other ways to call it that must give the same output, as
            ``(name, ((keyword, value), ...))`` pairs, e.g. ``("need_weights", (("need_weights",
            True),))``.
    """

    call: CallConvention = "self"
    mask: MaskConvention | None = None
    mask_problem: str | None = None
    mask_doubt: str | None = None
    causal: Causality = "never"
    causal_argument: str | None = None
    cross_attention: bool = False
    max_len: int | None = None
    heads: int | None = None
    shapes: tuple[tuple[int, int], ...] | None = None
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES
    assumed_dtypes: tuple[torch.dtype, ...] = ()
    positional: str | None = None
    weights: bool = False
    fully_masked: FullyMaskedPolicy = "report"
    dropout: DropoutKind = "none"
    mask_formats: tuple[MaskConvention, ...] = ()
    paths: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()

    def describe(self) -> str:
        call = "self-attention f(x[, mask])" if self.call == "self" else "f(q, k, v[, mask])"
        parts = [call, self.mask.describe() if self.mask else "no mask"]
        parts.append({"never": "not causal", "always": "always causal",
                      "optional": f"causal when {self.causal_argument}=True"}[self.causal])
        if self.cross_attention:
            parts.append("cross-attention")
        if self.heads is not None:
            parts.append(f"{self.heads} head(s)")
        if self.max_len is not None:
            parts.append(f"max length {self.max_len}")
        parts.append("canonical weights" if self.weights else "no weight access")
        return "; ".join(parts)


@dataclass(frozen=True)
class Implementation:
    """An attention implementation under test: how to build it and what it declares.

    Attributes:
        name: unique name used in reports and test ids.
        factory: builds the module (or any callable) for a generated :class:`Config`.
        capabilities: what it declares; checks it cannot take part in SKIP.
        weight_layout: where its projections live, for access in the canonical per-head form.
        expected_failures: ``{check_name: reason}`` for known failures; they don't fail a run.
        expected_warnings: ``{check_name: reason}`` for known warnings (robustness findings);
            a warning never fails a run, except under ``strict``, where these are expected.
        description: one line shown in listings.
    """

    name: str
    factory: Callable[[Config], Callable[..., torch.Tensor]]
    capabilities: Capabilities = field(default_factory=Capabilities)
    weight_layout: WeightLayout | None = None
    expected_failures: Mapping[str, str] = field(default_factory=dict)
    expected_warnings: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    notes: tuple[str, ...] = ()
    """What was inferred rather than declared, in words (see conformance.inference)."""
    benchmark: bool = True
    """Whether ``attention-conformance bench`` includes it by default (mutants: no)."""

    def __post_init__(self) -> None:
        if self.capabilities.weights != (self.weight_layout is not None):
            # The declaration follows the layout: one source of truth for weight access.
            object.__setattr__(
                self, "capabilities",
                replace(self.capabilities, weights=self.weight_layout is not None),
            )
        if self.capabilities.call == "self" and self.capabilities.cross_attention:
            raise ValueError(f"{self.name}: cross-attention needs the 'qkv' call convention")
        if self.capabilities.causal == "optional" and not self.capabilities.causal_argument:
            raise ValueError(f"{self.name}: causal='optional' needs causal_argument")

