"""The forms an implementation declares beside its call: a relative position encoding (RoPE, ALiBi),
a position input, a KV cache style, packed sequences, and its key-padding mask's convention. Plain
data, as :mod:`conformance.model.spec` is; :class:`~conformance.model.spec.Capabilities` holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

import torch

from conformance.model.normaliser import Normaliser

RelativeEncoding = Literal["rotary", "alibi", "bias"]
"""A relative position encoding inside: RoPE, ALiBi, or a learned bias of j − i measured at the
attention core (T5's buckets)."""

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
    reversed: bool = False
    """Turns pair i by ``-p * omega_i`` (a sign-flipped ``rotate_half``): still relative, the
    other way round from every published RoPE."""

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
        turned = ", turned by -p * theta^(-2i/r) (reversed)" if self.reversed else ""
        if self.table:
            widths = ", ".join(f"{2 * len(freqs)} of {width}" for width, freqs in self.table)
            return (f"RoPE on {pairs}{turned}, frequencies measured per head width (rotated "
                    f"dims: {widths})")
        share = (f"{self.dims} dims" if self.dims is not None else
                 "every dim" if self.fraction == 1.0 else f"{self.fraction:g} of the dims")
        return f"RoPE on {pairs}{turned}, {share}, theta {self.theta:g}"


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
    scaled: bool = False
    """The bias is added before the logits' 1/sqrt(head_dim) scaling (Falcon-RW's
    ``(q k^T + alibi) * inv_norm_factor``), so the slopes act divided by sqrt(head_dim)."""

    def describe(self) -> str:
        return ("ALiBi with the paper's slopes, " + ("-m |i - j|" if self.symmetric else
                                                     "-m (i - j)")
                + (", positions counting kept tokens only" if self.counts_kept else "")
                + (", added before the 1/sqrt(head_dim) scaling (the slopes act divided by "
                   "sqrt(head_dim))" if self.scaled else ""))


class ScaleRelation(str, Enum):
    """How a constructor setting sets the logits' scale s."""

    MULTIPLIER = "multiplier"
    """s = value (Granite's ``attention_multiplier``, a ``softmax_scale``)."""
    INVERSE_SQRT = "inverse_sqrt"
    """s = value ** -0.5 (Gemma's ``query_pre_attn_scalar``)."""

    def scale(self, value: float) -> float:
        return value if self is ScaleRelation.MULTIPLIER else value ** -0.5


@dataclass(frozen=True)
class LogitScale:
    """The scale of q·kᵀ in the logits where a layer's own design sets it: ``factor`` times
    w ** ``power`` at the width w where q and k meet (measured at two widths: 1/w is muP's and
    Granite's default), following the constructor setting ``argument`` by ``relation``; or, with
    ``followed`` False, a setting whose name says it sets the scale and that behaviour showed
    ignored (the scale is then the textbook one it computes)."""

    factor: float = 1.0
    power: float = -0.5
    argument: str | None = None
    relation: ScaleRelation | None = None
    followed: bool = True
    declared: bool = False
    """Stated by a declaration (``scale``): a measured scale that differs is a failure."""
    fixed_by_model: bool = False
    """A constant scale measured in a layer its model builds: the architecture's (T5's 1) or a
    missing 1/sqrt(w); intent decides, so ``scale`` warns."""

    def at(self, width: int) -> float:
        """The scale at width ``width``."""
        return self.factor * width ** self.power

    @property
    def textbook(self) -> bool:
        return self.power == -0.5 and abs(self.factor - 1.0) < 1e-9

    @property
    def ambiguous(self) -> bool:
        """1/w measured, neither stated nor set by an argument: muP's and Granite's design, and
        also 1/sqrt(w) applied twice; intent decides."""
        return (self.power == -1.0 and abs(self.factor - 1.0) < 1e-6 and not self.declared
                and self.argument is None)

    @property
    def intent_undeclared(self) -> bool:
        """A design and a known mistake give it alike, undeclared (1/w, or a model's constant)."""
        return self.ambiguous or (self.fixed_by_model and not self.declared)

    def law(self) -> str:
        """The scale as a function of the width w, in words: ``1/sqrt(w)``, ``1/w``, ``0.25``."""
        if self.power == 0:
            return f"{self.factor:.4g}"
        base = {-0.5: "sqrt(w)", -1.0: "w"}.get(self.power, f"w^{-self.power:g}")
        return f"1/{base}" if abs(self.factor - 1.0) < 1e-9 else f"{self.factor:.4g}/{base}"

    def describe(self) -> str:
        if self.argument is None:
            return f"a logit scale of {self.law()}" + (" (declared)" if self.declared else "")
        if not self.followed:
            return (f"the logit scale its {self.argument} names, which it ignores (built with "
                    f"another value, the scale stays {self.law()})")
        return (f"a logit scale set by {self.argument} (s = {self.argument}"
                + (" ** -0.5" if self.relation is ScaleRelation.INVERSE_SQRT else "")
                + f"; by default {self.law()})")


@dataclass(frozen=True)
class PositionEncoding:
    """What the float64 reference applies to the logits beyond q·kᵀ/sqrt(d): a relative position
    encoding (RoPE, ALiBi, or both), a logit softcap (Gemma 2's c·tanh(logits / c), applied
    to the scaled logits before the mask), and a logit scale the layer's design sets instead of
    1/sqrt(d) (see LogitScale)."""

    rotary: Rotary | None = None
    alibi: AlibiBias | None = None
    softcap: float | None = None
    scale: LogitScale | None = None
    normaliser: Normaliser | None = None
    """What turns the logits into weights where it is not a softmax over the keys (observed:
    :mod:`conformance.inference.steps.normaliser`)."""

    @property
    def positional(self) -> bool:
        """Whether it encodes positions (a softcap alone does not)."""
        return self.rotary is not None or self.alibi is not None

    def describe(self) -> str:
        parts = [part.describe() for part in (self.rotary, self.alibi) if part]
        if self.softcap is not None:
            parts.append(f"a logit softcap c·tanh(logits / c), c = {self.softcap:g}")
        # The scale is said once, in a note of its own (inference's), not with every encoding.
        return "; ".join(parts)


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


class CacheLayout(str, Enum):
    """The form of a returned KV cache a declaration holds a module to (``cache-layout``): a pair
    ``(k, v)``, each with these axes (``heads``: the key/value heads)."""

    BHLD = "bhld"
    """(batch, heads, length, head_dim): PyTorch's and HuggingFace's legacy cache."""
    BLHD = "blhd"
    """(batch, length, heads, head_dim): FlashAttention's ``k_cache``/``v_cache``."""
    BLD = "bld"
    """(batch, length, heads * head_dim): the heads merged."""

    def shape(self, batch: int, heads: int, length: int, head_dim: int) -> tuple[int, ...]:
        """The shape of each of ``k`` and ``v`` in this layout."""
        return {CacheLayout.BHLD: (batch, heads, length, head_dim),
                CacheLayout.BLHD: (batch, length, heads, head_dim),
                CacheLayout.BLD: (batch, length, heads * head_dim)}[self]


class PositionForm(str, Enum):
    """How a forward argument takes the positions of the tokens."""

    IDS = "ids"
    """(batch, length) int64, HuggingFace's ``position_ids``."""
    VECTOR = "vector"
    """(length,) int64, HuggingFace's ``cache_position``."""
    START = "start"
    """An int, the first token's position."""


class Setting(str, Enum):
    """A constructor setting whose effect on what the module computes is measurable, so that
    ``configuration`` can build it with another value and see the behaviour follow."""

    ROPE_THETA = "rope_theta"
    """RoPE's base: pair i of r rotated dimensions turns by ``p * theta^(-2i / r)``."""
    ROTARY_FRACTION = "rotary_fraction"
    """The share of each head's dimensions RoPE turns."""
    SOFTCAP = "softcap"
    """A logit softcap c: the logits are c·tanh(s / c) before the mask (0 or less: none)."""
    TEMPERATURE = "temperature"
    """A temperature of the logits (whether they are divided or multiplied by it is not
    assumed): another value changes what every row weights."""
    WINDOW = "window"
    """A window of keys around each row, on a layer not checked as causally windowed (an
    encoder's local attention): a narrower window changes what rows see."""
    THETA = "theta"
    """RoPE's base where no RoPE is modelled by a rule (a rotation measured per width, or none
    found): another base turns the positions otherwise."""
    SINK = "sink"
    """How many sink tokens every row keeps seeing (StreamingLLM's): it may act only where a
    window or a cache drops the other keys, so one that changes nothing is said, not failed."""

    @property
    def modelled(self) -> bool:
        """Whether the float64 reference computes with it (``configuration`` then holds the
        output to the reference of the other value); the others are held to changing the
        output at all."""
        return self in (Setting.ROPE_THETA, Setting.ROTARY_FRACTION, Setting.SOFTCAP)


class CausalAlignment(str, Enum):
    """Where a causal kernel puts the diagonal when queries are fewer than keys."""

    BOTTOM_RIGHT = "bottom_right"
    """Query i of Lq sees keys j <= i + Lk - Lq (FlashAttention >= 2.1, SDPA's lower-right):
    the queries are the last Lq tokens, as in decoding."""
    TOP_LEFT = "top_left"
    """Query i sees keys j <= i (FlashAttention < 2.1, ``torch.ones(Lq, Lk).tril()``)."""
    NEITHER = "neither"
    """Measured as neither: ``kernel`` checks it against bottom-right and fails with the rows
    that differ."""

    def offset(self, q_len: int, kv_len: int) -> int:
        """How many keys beyond its own index query i sees: j <= i + offset."""
        return 0 if self is CausalAlignment.TOP_LEFT else kv_len - q_len


LSE_OPTION = "_conformance_lse"
"""The keyword the suite's wrapper of a core function takes (and never passes on) to return the
function's log-sum-exp, as (batch, q_len, heads), in place of the output: its value is the
function's own keyword that asks for it ("" where every call returns it)."""


ALIBI_OPTION = "_conformance_alibi"
"""The keyword the suite's wrapper of a core function takes (and never passes on) to give the
function ALiBi slopes: its value is the function's own keyword for them (``alibi_slopes``),
which the wrapper hands the paper's slopes for its heads, (heads,) float32."""


@dataclass(frozen=True)
class KernelArguments:
    """What a core function takes beyond (q, k, v), as inference found it: the keywords that
    set the softmax scale (``softmax_scale``), a ``window_size=(left, right)`` and a logit
    ``softcap``; the keyword that makes it return ``(out, lse)`` ("" where it always does); and
    the alignment ``causal=True`` gives with fewer queries than keys (None where it is not
    causal on request); ``varlen``: it takes FlashAttention's packed tokens and cumulative
    lengths (``packed`` then gives it an empty sequence too); ``alibi_argument``: the keyword
    taking ALiBi slopes (heads,). ``kernel`` checks each."""

    scale_argument: str | None = None
    alignment: CausalAlignment | None = None
    window_argument: str | None = None
    softcap_argument: str | None = None
    lse_argument: str | None = None
    varlen: bool = False
    alibi_argument: str | None = None


class PackedForm(str, Enum):
    """How packed variable-length sequences are passed."""

    CU_SEQLENS = "cu_seqlens"
    """Tokens (1, total, D) with cumulative lengths (n + 1,) int32 [0, l_1, l_1 + l_2, ...]."""
    CU_SEQLENS_FLAT = "cu_seqlens_flat"
    """The same with the tokens flattened to (total, D), as FlashAttention's varlen functions."""
    MASK = "mask"
    """A block-diagonal mask through the declared (per-query) mask argument."""
