"""What an implementation under test declares about itself, and the configuration it is built from.

These are plain data: they cross the boundary to an implementation unchanged, whether it runs in
this process or in another one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

import torch

from conformance.model.capability_groups import (
    CacheForm,
    CausalForm,
    Dtypes,
    Packing,
    Positions,
    flat_keywords,
)
from conformance.model.forms import KernelArguments, Setting
from conformance.model.mask_forms import MaskConvention
from conformance.model.remedies import Note, as_notes

if TYPE_CHECKING:
    from conformance.model.weights import WeightLayout

CallConvention = Literal["self", "qkv", "cross", "latent"]
"""``"self"``: ``f(x[, mask])``; ``"qkv"``: ``f(query, key, value[, mask])``; ``"cross"``:
``f(x, context[, mask])``, queries from ``x``, keys and values from ``context`` (a decoder's
cross-attention over encoder states: one tensor for both, of its own length); ``"latent"``:
``f(x[, mask])`` whose queries are the module's own (Perceiver's learned latents): keys and
values from ``x``, one output row per query it holds, ``Capabilities.queries`` of them."""

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

Chunk = int | Literal["config"] | None
"""Causal chunked attention (Llama 4's): positions fall in chunks of C, and row t sees the keys
of its own chunk up to itself, C * (t // C) .. t; ``"config"`` when the factory honours
``Config.chunk``, an int when fixed."""

PaddedQueries = Literal["zero", "self", "any"]
"""What a self-attention module outputs at a padded query position: zeros, attention to itself
alone, or attention like any other row (to the kept keys)."""


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
    chunk: int | None = None
    """Causal chunks: the positions of each chunk (see Chunk); None for none."""
    settings: tuple[tuple[str, float], ...] = ()
    """Constructor keyword values to build with instead of the defaults (the configuration
    check's other values of a setting, see Capabilities.configured); a factory that has no such
    argument ignores them."""

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def kv_heads(self) -> int:
        """The number of key/value heads (``num_heads`` unless grouped)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads


@dataclass(frozen=True)
class Doubts:
    """What inference could not settle about what it found, each in words (the evidence), for
    the check that reports it; None where nothing is in doubt.

    Attributes:
        mask_problem: why a mask argument it has could not be given a convention (none found
            makes masked keys invisible); ``padding`` fails with it once, the other mask checks
            skip.
        mask_polarity: a mask accepted with the polarity opposite to its argument's name's
            usual one, and the declaration that states it; ``padding`` gives it as a warning.
        mask_assumed: why the mask convention was assumed rather than confirmed (none makes
            masked keys invisible; this one runs and only leaks); ``padding`` says so beside
            the leak it finds.
        kv_grouping: grouped key/value heads paired h mod Hkv (tiled), a relabelling that is a
            bug only where HuggingFace's interleaved pairing (h // G) was meant; ``kv_groups``
            gives it as a warning.
        weights: a layer the forward never calls with the shape of the projection the layout
            lacks (an output projection defined and skipped?); ``reference`` warns.
        encoding: head widths left out of generation because no position-encoding hypothesis
            reproduces the output there (RoPE at an odd or one-dimensional width);
            ``reference`` warns.
        variant: a variant of the published position encoding (a RoPE turned the other way
            round, ALiBi added before the logits' scaling), intent only its author knows;
            ``reference`` warns.
        window: a window argument whose value W lets each row see W + 1 keys (W before it and
            itself, FlashAttention's count), where nothing says which count its author meant
            (most layers' W keys is the other); ``sliding_window`` warns.
        length: the longest sequence it takes differs between two of its configurations (a
            buffer sized by a width where a context length belongs); ``contract`` fails with it.
    """

    mask_problem: str | None = None
    mask_polarity: Note | None = None
    mask_assumed: str | None = None
    kv_grouping: str | None = None
    weights: str | None = None
    encoding: str | None = None
    variant: str | None = None
    window: str | None = None
    length: str | None = None


@flat_keywords
@dataclass(frozen=True)
class Capabilities:
    """What an implementation declares it can do; checks needing more SKIP with the reason.

    Its families are records (causality, cache, packing, position, floats: see
    :mod:`conformance.model.capability_groups`); the flat keywords and names they replace
    (``causal_argument=``, ``caps.kv_cache``, ...) still build and read the same value, with a
    DeprecationWarning naming the new form.

    Attributes:
        call: the call convention.
        mask: how it takes a padding mask, or ``None`` when it takes none.
        causality: whether it masks the future, and the keyword that turns it on where it
            is optional (see CausalForm).
        cross_attention: whether ``kv_len != q_len`` is supported (``"qkv"`` only).
        queries: for the ``"latent"`` call, how many queries the module holds itself (its
            output's rows, whatever the input's length): every case has ``q_len`` this.
        max_len: the longest sequence it accepts (a ``block_size`` buffer, say).
        min_len: the shortest sequence it runs at on the device checked, where shorter ones
            raise (cuDNN's SDPA refuses a single key): found by the gate, never declared.
        length: the one input length it takes, queries and keys alike (Swin's window
            attention takes the Wh * Ww tokens of one window), or ``None`` for any: every case
            has this length, and checks that need another skip saying so.
        heads: a fixed number of heads (1 for single-head modules), or ``None`` for any.
        shapes: the (num_heads, head_dim) pairs it can be built for, where its constructor
            rejects some (see :mod:`conformance.generation.constraints`); ``None`` for any.
        floats: the floating dtypes it supports, and which of them were assumed or probed
            (see Dtypes).
        position: the position encoding inside, the forward keyword that takes the tokens'
            positions, and what the reference applies for it (see Positions).
        weights: whether its projections are readable and writable in the canonical form.
        fully_masked: what a row with every key masked gives (see FullyMaskedPolicy).
        dropout: ``"none"``; ``"config"`` when the factory honours ``Config.dropout``; or the
            fixed rate of a module that hard-codes one.
        mask_formats: other mask formats it accepts besides ``mask``; all must agree.
        paths: other ways to call it that must give the same output, as
            ``(name, ((keyword, value), ...))`` pairs, e.g. ``("need_weights", (("need_weights",
            True),))``.
        kv_heads: grouped-query key/value heads (see KVHeads).
        window: a causal sliding window (see Window).
        chunk: causal chunked attention (see Chunk).
        cache: how a KV cache is handed over between decoding calls, and the largest batch
            it takes (see CacheForm).
        packing: how packed variable-length sequences are passed (see Packing).
        float32_parts: torch functions inference saw producing float32 tensors inside a
            float64 forward (HuggingFace's RoPE tables, a float32 softmax): float64 runs are
            then judged with float32 tolerances.
        configured: the constructor settings the module's behaviour is measured to follow,
            as ``(Setting, argument)`` pairs (an inferred module's ``rope_theta=``, say):
            ``configuration`` builds each with another value and checks the behaviour follows.
        padded_queries: what a self-attention module promises at a padded query position
            (``zero``, ``self``, ``any``); None leaves those rows unjudged.
        returns_tensor: forward is declared to return one tensor: a tuple is a contract
            failure.
        kernel: for a core function (a kernel over per-head tensors), its own arguments as
            inference measured them; ``kernel`` calls it through them.
        refused_devices: devices it refuses, each with why (a kernel that runs on CUDA only,
            probed: every dtype raises on the CPU): its contract; every check there is skipped
            saying so, never failed.
        forward_only: a kernel function whose output carries no gradient (computed outside
            autograd, or a backward that raises NotImplementedError), probed: the checks'
            gradient parts skip, ``autograd`` skips; a backward that crashes otherwise is a bug
            and fails.
        contiguous_only: it is a layer whose model hands it contiguous inputs only (observed
            on the model's own forward): non-contiguous layouts are outside its domain, said and
            never judged.
        unmodelled: a part of its computation the float64 reference from its weights does not
            model (a per-head QK-norm), in words: the checks that need that reference judge it
            through its attention core or skip; those that only read or write its weights run.
        doubts: what inference could not settle about what it found (see Doubts).
    """

    call: CallConvention = "self"
    mask: MaskConvention | None = None
    causality: CausalForm = field(default_factory=CausalForm)
    cross_attention: bool = False
    queries: int | None = None
    max_len: int | None = None
    min_len: int | None = None
    length: int | None = None
    heads: int | None = None
    shapes: tuple[tuple[int, int], ...] | None = None
    floats: Dtypes = field(default_factory=Dtypes)
    position: Positions = field(default_factory=Positions)
    weights: bool = False
    fully_masked: FullyMaskedPolicy = "report"
    dropout: DropoutKind = "none"
    mask_formats: tuple[MaskConvention, ...] = ()
    paths: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()
    kv_heads: KVHeads = None
    window: Window = None
    chunk: Chunk = None
    cache: CacheForm = field(default_factory=CacheForm)
    packing: Packing = field(default_factory=Packing)
    float32_parts: tuple[str, ...] = ()
    configured: tuple[tuple[Setting, str], ...] = ()
    padded_queries: PaddedQueries | None = None
    returns_tensor: bool = False
    kernel: KernelArguments | None = None
    forward_only: bool = False
    refused_devices: tuple[tuple[str, str], ...] = ()
    contiguous_only: bool = False
    unmodelled: str | None = None
    doubts: Doubts = Doubts()

    def describe(self) -> str:
        call = {"self": "self-attention f(x[, mask])", "qkv": "f(q, k, v[, mask])",
                "cross": "cross-attention f(x, context[, mask])",
                "latent": f"attention from {self.queries} queries of its own to x: f(x[, mask])"
                }[self.call]
        parts = [call, self.mask.describe() if self.mask else "no mask"]
        parts.append({"never": "not causal", "always": "always causal",
                      "optional": f"causal when {self.causality.argument}=True"}[self.causality.kind])
        if self.cross_attention and self.call != "latent":
            parts.append("cross-attention")
        if self.heads is not None:
            parts.append(f"{self.heads} head(s)")
        if self.max_len is not None:
            parts.append(f"max length {self.max_len}")
        if self.length is not None:
            parts.append(f"{self.length} tokens only")
        if self.kv_heads is not None:
            parts.append("grouped key/value heads" + (
                f" ({self.kv_heads})" if isinstance(self.kv_heads, int) else ""))
        if self.position.relative:
            parts.append({"rotary": "rotary positions", "alibi": "ALiBi",
                          "bias": "a relative position bias"}[self.position.relative])
        if self.window is not None:
            parts.append("sliding window" + (
                f" of {self.window}" if isinstance(self.window, int) else ""))
        if self.chunk is not None:
            parts.append("causal chunks" + (
                f" of {self.chunk}" if isinstance(self.chunk, int) else ""))
        if self.cache.style is not None:
            held = f", (k, v) each {self.cache.layout.value}" if self.cache.layout else ""
            parts.append(f"KV cache ({self.cache.style.value} through {self.cache.argument}{held})")
        if self.packing.form is not None:
            parts.append(f"packed sequences ({self.packing.form.value})")
        parts.append("canonical weights" if self.weights else "no weight access")
        return "; ".join(parts)

    def length_near(self, preferred: int) -> int:
        """The length a check that prefers ``preferred`` tokens uses: its one length where it
        takes one, else ``preferred`` within ``min_len`` and ``max_len``."""
        if self.length is not None:
            return self.length
        return max(min(preferred, self.max_len or preferred), self.min_len or 1)

    def fixed_length_skip(self, needs: str) -> str | None:
        """Why a check that needs ``needs`` (other lengths, in words) skips, where the
        implementation takes one length only; else None."""
        if self.length is None:
            return None
        return f"it takes {self.length} tokens only: {needs} can't be made"


FIRST = "<first>"
"""The name that asks for the first implementation a spec names, alone where the others take
inferring: a model's other kinds of attention layer are then named, not inferred (each is inferred
where it is checked)."""


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
    notes: tuple[Note, ...] = ()
    """What was inferred rather than declared, in words, each with the declaration that states
    it otherwise (see conformance.inference); plain strings are taken as notes without one."""
    benchmark: bool = True
    """Whether ``attention-conformance bench`` includes it by default (mutants: no)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", as_notes(self.notes))
        if self.capabilities.weights != (self.weight_layout is not None):
            # The declaration follows the layout: one source of truth for weight access.
            object.__setattr__(
                self, "capabilities",
                replace(self.capabilities, weights=self.weight_layout is not None),
            )
        if self.capabilities.call == "self" and self.capabilities.cross_attention:
            raise ValueError(f"{self.name}: cross-attention needs the 'qkv' or 'cross' call "
                             "convention")
        caps = self.capabilities
        if (caps.call == "latent") != (caps.queries is not None):
            raise ValueError(f"{self.name}: the 'latent' call convention goes with queries (how "
                             "many it holds), and queries with it")
        if caps.call == "latent" and caps.causality.kind != "never":
            raise ValueError(f"{self.name}: queries of its own are no tokens: nothing is causal")
        caps.causality.check(self.name)
        caps.cache.check(self.name, caps.causality.kind, caps.call)
        if caps.window is not None and caps.causality.kind != "always":
            raise ValueError(f"{self.name}: a sliding window is declared for always-causal "
                             "attention")
        if caps.chunk is not None and caps.causality.kind != "always":
            raise ValueError(f"{self.name}: causal chunks are declared for always-causal "
                             "attention")
        caps.position.check(self.name)
        caps.packing.check(self.name, masked=caps.mask is not None)
