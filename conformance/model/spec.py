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
    from conformance.model.weights import WeightLayout

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

KVHeads = int | Literal["config"] | None
"""Grouped-query attention: ``None``, one key/value head per query head; ``"config"``, the
factory honours ``Config.num_kv_heads`` (generated as divisors of the head count); an int, a
number of key/value heads the module fixes itself (head counts are generated as its
multiples)."""

Window = int | Literal["config"] | None
"""A causal sliding window, counted as the keys a row sees, itself included (row t sees
t - W + 1 .. t): ``"config"`` when the factory honours ``Config.window``, an int when fixed."""

RelativeEncoding = Literal["rotary", "alibi"]
"""A relative position encoding inside the module: logits depend on positions only through
i - j (RoPE rotates q and k by their positions; ALiBi adds -m_h (i - j))."""

AlibiSlopes = Literal["standard", "measured"]
"""ALiBi slopes: ``standard``, the paper's geometric sequence (2^(-8 (h + 1) / H) for H a power
of two, its interpolation otherwise); ``measured``, any positive per-head slopes (reported)."""


RotaryPairing = Literal["half", "interleaved"]
"""Which dimensions RoPE rotates together: ``half`` pairs i with i + r/2 (HuggingFace's
``rotate_half``, GPT-NeoX), ``interleaved`` pairs 2i with 2i + 1 (Meta Llama, GPT-J,
torchtune)."""


@dataclass(frozen=True)
class Rotary:
    """Rotary position embeddings as a module applies them (see :mod:`conformance.
    position_encoding`): the first ``rotated_dims(head_dim)`` dimensions of every query and key
    head turn in pairs (``pairing``), pair i by ``p * theta^(-2i / r)`` at position p."""

    pairing: RotaryPairing = "half"
    theta: float = 10000.0
    fraction: float = 1.0
    """The rotated share of each head's dimensions, rounded down to an even count
    (HuggingFace's ``partial_rotary_factor`` / ``rotary_pct``)."""
    dims: int | None = None
    """A fixed number of rotated dimensions (x-transformers' rotary dim), capped at head_dim;
    overrides ``fraction``."""
    table: tuple[tuple[int, tuple[float, ...]], ...] = ()
    """Frequencies measured per head width, where no one rule covers them all (x-transformers
    derives its rotated dimensions and theta from each width; Llama 3 scales some frequencies):
    (head_dim, the frequency of each rotated pair); overrides the rule for those widths."""

    def _entry(self, head_dim: int) -> tuple[float, ...] | None:
        return next((freqs for width, freqs in self.table if width == head_dim), None)

    def rotated_dims(self, head_dim: int) -> int:
        entry = self._entry(head_dim)
        if entry is not None:
            return 2 * len(entry)
        count = min(self.dims, head_dim) if self.dims is not None else int(head_dim * self.fraction)
        return count - count % 2

    def frequencies(self, head_dim: int) -> torch.Tensor:
        """(r / 2,) float64: theta^(-2i / r) for the r rotated dimensions (or as measured)."""
        entry = self._entry(head_dim)
        if entry is not None:
            return torch.tensor(entry, dtype=torch.float64)
        dims = self.rotated_dims(head_dim)
        return self.theta ** (-torch.arange(0, dims, 2, dtype=torch.float64) / max(dims, 1))

    def describe(self) -> str:
        pairs = {"half": "half-split pairs (i, i + r/2)",
                 "interleaved": "interleaved pairs (2i, 2i + 1)"}[self.pairing]
        if self.table:
            widths = ", ".join(f"{2 * len(freqs)} of {width}" for width, freqs in self.table)
            return (f"RoPE on {pairs}, frequencies measured per head width (rotated dims: "
                    f"{widths})")
        share = (f"{self.dims} dims" if self.dims is not None else
                 "every dim" if self.fraction == 1.0 else f"{self.fraction:g} of the dims")
        return f"RoPE on {pairs}, {share}, theta {self.theta:g}"


@dataclass(frozen=True)
class AlibiBias:
    """ALiBi as a module applies it: head h's logits get ``-m_h (i - j)`` (``-m_h |i - j|``
    where ``symmetric``), with the paper's slopes; ``counts_kept``: positions count the kept
    tokens only (BLOOM's ``cumsum(mask) - 1``)."""

    symmetric: bool = False
    counts_kept: bool = False
    tiled: bool = False
    """The slopes follow the module's own head order where its grouped query heads are read
    relabelled (tiled grouping, see ``conformance.model.layouts.RelabelledHeads``): canonical head
    c carries the slope of module head (c mod G) Hkv + c // G."""

    def describe(self) -> str:
        return ("ALiBi with the paper's slopes, " + ("-m |i - j|" if self.symmetric else
                                                     "-m (i - j)")
                + (", positions counting kept tokens only" if self.counts_kept else ""))


@dataclass(frozen=True)
class PositionEncoding:
    """The relative position encoding the float64 reference applies (RoPE, ALiBi, or both)."""

    rotary: Rotary | None = None
    alibi: AlibiBias | None = None

    def describe(self) -> str:
        return "; ".join(part.describe() for part in (self.rotary, self.alibi) if part)


PaddedQueries = Literal["zero", "self", "any"]
"""What a self-attention module outputs at a padded query position: zeros, attention to itself
alone, or attention like any other row (to the kept keys)."""


class CacheStyle(str, Enum):
    """How a KV cache is handed to the module between decoding calls."""

    RETURNED = "returned"
    """The past comes in through an argument and the present goes out in the output tuple
    (HuggingFace's legacy ``past_key_value`` + ``use_cache``, nanoGPT's ``layer_past``)."""
    BUFFERS = "buffers"
    """The module holds preallocated cache buffers; an integer argument says where the new
    tokens start (Meta Llama's ``start_pos``)."""
    OBJECT = "object"
    """A cache object passed in and updated in place (HuggingFace's ``Cache`` /
    ``DynamicCache``, or the module's own cache class)."""


class PositionForm(str, Enum):
    """How a forward argument takes the positions of the tokens."""

    IDS = "ids"
    """(batch, length) int64, HuggingFace's ``position_ids``."""
    VECTOR = "vector"
    """(length,) int64, HuggingFace's ``cache_position``."""
    START = "start"
    """An int, the first token's position."""


class PackedForm(str, Enum):
    """How packed variable-length sequences are passed."""

    CU_SEQLENS = "cu_seqlens"
    """Tokens (1, total, D) with cumulative lengths (n + 1,) int32 [0, l_1, l_1 + l_2, ...]."""
    CU_SEQLENS_FLAT = "cu_seqlens_flat"
    """The same with the tokens flattened to (total, D), as FlashAttention's varlen functions."""
    MASK = "mask"
    """A block-diagonal mask through the declared (per-query) mask argument."""


class MaskKind(str, Enum):
    """How mask values are read."""

    KEEP_INT = "keep_int"
    """Integer tensor (int64), 1 = attend, 0 = masked (``masked_fill(mask == 0, ...)``)."""
    KEEP_INT32 = "keep_int32"
    """Integer tensor of dtype int32, 1 = attend, 0 = masked (``mask.int()``: what many
    assignments and tokenizers hand out)."""
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


QUERY_AXIS_LAYOUTS = (MaskLayout.PER_QUERY, MaskLayout.PER_QUERY_BROADCAST,
                      MaskLayout.PER_HEAD, MaskLayout.SHARED)
"""Mask layouts with a query axis: those that can give rows different keys."""


@dataclass(frozen=True)
class MaskConvention:
    """How the implementation takes a padding mask.

    ``argument`` names the keyword it is passed as; ``None`` passes it positionally after the
    inputs.
    """

    kind: MaskKind
    layout: MaskLayout
    argument: str | None = None
    carries_causality: bool = False
    """The module takes the mask as the whole mask, causality included (HuggingFace's 4-D
    masks, torchtune's): for a causal call the suite folds the causal triangle (and a sliding
    window) into it. Only layouts with a query axis can."""

    def describe(self) -> str:
        return (f"{KIND_WORDS[self.kind]}, shape {LAYOUT_SHAPES[self.layout]}"
                + (", the causal triangle included (the mask is the whole mask)"
                   if self.carries_causality else ""))

    def spec(self) -> str:
        """The declaration that states this convention: ``KIND:LAYOUT[+causal][@ARGUMENT]``."""
        argument = f"@{self.argument}" if self.argument else ""
        causal = "+causal" if self.carries_causality else ""
        return f"{self.kind.value}:{self.layout.value}{causal}{argument}"


KIND_WORDS = {
    MaskKind.KEEP_INT: "int mask, 0 = masked",
    MaskKind.KEEP_INT32: "int32 mask, 0 = masked",
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
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention), None for one per query head."""
    window: int | None = None
    """Sliding window: the keys each row sees, itself included; None for none."""

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads (``num_heads`` unless grouped)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


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
        mask_assumed: why ``mask`` was assumed rather than confirmed (no convention makes
            masked keys invisible; this one runs and only leaks); ``padding`` says so beside
            the leak it finds.
        causal: whether it masks the future.
        causal_argument: keyword that turns causality on, when ``causal == "optional"``.
        cross_attention: whether ``kv_len != q_len`` is supported (``"qkv"`` only).
        max_len: the longest sequence it accepts (a ``block_size`` buffer, say).
        heads: a fixed number of heads (1 for single-head modules), or ``None`` for any.
        shapes: the (num_heads, head_dim) pairs it can be built for, where its constructor
            rejects some (see :mod:`conformance.generation.constraints`); ``None`` for any.
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
        kv_heads: grouped-query key/value heads (see KVHeads).
        relative: a relative position encoding inside ("rotary", "alibi"); ``position_shift``
            checks that shifting every position changes nothing.
        alibi: the ALiBi slopes it promises (see AlibiSlopes); ``alibi`` measures them.
        positions: the forward keyword that takes token positions, and ``position_form`` how.
        window: a causal sliding window (see Window).
        kv_cache: how a KV cache is handed over between decoding calls (see CacheStyle);
            ``cache_argument`` names the keyword (the start position for ``buffers``),
            ``cache_options`` are keywords a cached call adds (``use_cache=True``), and
            ``cache_factory`` ("module:Class") builds a fresh cache object for ``object``.
        packed: how packed variable-length sequences are passed (see PackedForm);
            ``packed_argument`` names the cu_seqlens keyword, ``max_seqlen_argument`` the
            longest sequence's.
        max_batch: the largest batch it takes (a preallocated cache's ``max_batch_size``).
        encoding: the relative position encoding the float64 reference applies for it (RoPE,
            ALiBi); where set, the checks that compare with the reference run (``positional``
            then only describes it).
        kv_doubt: what inference could not decide about grouped key/value heads: the module
            pairs query head h with key/value head h mod Hkv (tiled), a relabelling of the
            heads that is a bug only where HuggingFace's interleaved pairing (h // G) was
            meant; ``kv_groups`` gives it as a warning.
        weights_doubt: what behaviour can't settle about the weights it found: a layer the
            forward never calls with the shape of the projection the layout lacks (an output
            projection defined and skipped?); ``reference`` gives it as a warning.
        float32_parts: torch functions inference saw producing float32 tensors inside a
            float64 forward (HuggingFace's RoPE tables, a float32 softmax): float64 runs are
            then judged with float32 tolerances.
        encoding_doubt: head widths left out of generation because no position-encoding
            hypothesis reproduces the module's output there (RoPE at an odd or one-dimensional
            width); ``reference`` gives it as a warning.
        padded_queries: what a self-attention module promises at a padded query position
            (``zero``, ``self``, ``any``); None leaves those rows unjudged.
        returns_tensor: forward is declared to return one tensor: a tuple is a contract
            failure.
    """

    call: CallConvention = "self"
    mask: MaskConvention | None = None
    mask_problem: str | None = None
    mask_doubt: str | None = None
    mask_assumed: str | None = None
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
    kv_heads: KVHeads = None
    relative: RelativeEncoding | None = None
    alibi: AlibiSlopes | None = None
    positions: str | None = None
    position_form: PositionForm | None = None
    window: Window = None
    kv_cache: CacheStyle | None = None
    cache_argument: str | None = None
    cache_options: tuple[tuple[str, object], ...] = ()
    cache_factory: str | None = None
    packed: PackedForm | None = None
    packed_argument: str | None = None
    max_seqlen_argument: str | None = None
    max_batch: int | None = None
    encoding: PositionEncoding | None = None
    kv_doubt: str | None = None
    weights_doubt: str | None = None
    encoding_doubt: str | None = None
    float32_parts: tuple[str, ...] = ()
    padded_queries: PaddedQueries | None = None
    returns_tensor: bool = False

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
        if self.kv_heads is not None:
            parts.append("grouped key/value heads" + (
                f" ({self.kv_heads})" if isinstance(self.kv_heads, int) else ""))
        if self.relative:
            parts.append({"rotary": "rotary positions", "alibi": "ALiBi"}[self.relative])
        if self.window is not None:
            parts.append("sliding window" + (
                f" of {self.window}" if isinstance(self.window, int) else ""))
        if self.kv_cache is not None:
            parts.append(f"KV cache ({self.kv_cache.value} through {self.cache_argument})")
        if self.packed is not None:
            parts.append(f"packed sequences ({self.packed.value})")
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
        caps = self.capabilities
        if caps.causal == "optional" and not caps.causal_argument:
            raise ValueError(f"{self.name}: causal='optional' needs causal_argument")
        if caps.kv_cache is not None and (caps.causal == "never" or not caps.cache_argument):
            raise ValueError(f"{self.name}: a KV cache needs causal attention and cache_argument")
        if caps.kv_cache is CacheStyle.OBJECT and not caps.cache_factory:
            raise ValueError(f"{self.name}: an object cache needs cache_factory ('module:Class')")
        if caps.window is not None and caps.causal != "always":
            raise ValueError(f"{self.name}: a sliding window is declared for always-causal "
                             "attention")
        if caps.positions and caps.position_form is None:
            raise ValueError(f"{self.name}: positions needs position_form")
        if caps.packed in (PackedForm.CU_SEQLENS, PackedForm.CU_SEQLENS_FLAT) and not (
                caps.packed_argument):
            raise ValueError(f"{self.name}: cu_seqlens packing needs packed_argument")
        if caps.packed is PackedForm.MASK and caps.mask is None:
            raise ValueError(f"{self.name}: packing through a mask needs a declared mask")

