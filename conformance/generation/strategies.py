"""Hypothesis strategies for cases, shaped by what an implementation declares.

Shapes: batch 1..4; lengths 1..33 (capped by a declared ``max_len``; the one ``length`` a module
takes where it takes one), with ``q_len == batch`` drawn often because ``B == L`` hides no
transposition bug the way unequal sizes do, and ``kv_len != q_len`` only where cross-attention
is declared; heads 1..8 with more than one head the common case; head_dim 1..16. Masks keep at
least one key per batch element, or separately mask every key of some elements. Grouped-query
attention: key/value heads a divisor of the head count (a proper one first), or the head count
a multiple of a fixed number of key/value heads. Sliding windows: 1 to 8 keys. Causal chunks: 2 to
8 positions.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Literal

import torch
from hypothesis import reject
from hypothesis import strategies as st

from conformance.generation.cases import MAX_LEN, Case, dtype_name
from conformance.generation.replay_fit import Drawn
from conformance.model.mask_forms import MaskConvention, MaskLayout, right_padded
from conformance.model.spec import Capabilities

MAX_HEAD_DIM = 16
SEEDS = st.integers(0, 2**16 - 1)
# Shrinks towards 2 heads: a counterexample with several heads says more than one with one.
HEAD_COUNTS = (2, 3, 4, 1, 5, 6, 7, 8)
# Shrinks towards a window of 3 keys: shorter than most sequences, wider than one key.
WINDOWS = (3, 1, 2, 4, 5, 6, 8)
# Shrinks towards chunks of 3: a sequence of a few positions already holds two of them.
CHUNKS = (3, 2, 4, 5, 6, 8)

MaskStyle = Literal["none", "auto", "kept", "partly_masked", "fully_masked"]
"""``kept``: at least one kept key per batch element; ``auto``: ``kept`` where a mask is declared,
else none; ``partly_masked``: additionally at least one masked key in each; ``fully_masked``:
batch >= 2 and some elements with every key masked."""


def device_kind(device: str) -> str:
    """The kind of a device a run names: ``cuda:1`` is ``cuda``."""
    return device.partition(":")[0]


def available_devices() -> list[str]:
    """Every device this machine can run on: cpu, and cuda / mps when present."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    return devices


# Strategy objects are built once per distinct argument, not once per drawn case: hypothesis
# validates and labels every new strategy, which cost more than the draw itself.
_integers = cache(st.integers)
_sampled = cache(st.sampled_from)


@cache
def _just_or_integers(value: int, low: int, high: int) -> st.SearchStrategy[int]:
    return st.one_of(st.just(value), st.integers(low, high))


@cache
def _some_elements(batch: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, batch - 1), min_size=1, max_size=batch - 1, unique=True)


_MASK_SEEDS = st.one_of(st.none(), SEEDS)


def _heads(caps: Capabilities, min_heads: int, max_heads: int,
           grouped: bool = False) -> st.SearchStrategy[int]:
    fixed_kv = caps.kv_heads if isinstance(caps.kv_heads, int) else 1
    if grouped:  # at least two query heads per key/value head
        min_heads = max(min_heads, 2 * fixed_kv)
    return _head_counts(caps.heads, caps.shapes, min_heads, max_heads, fixed_kv)


@cache
def _head_counts(fixed: int | None, shapes: tuple[tuple[int, int], ...] | None, min_heads: int,
                 max_heads: int, multiple: int = 1) -> st.SearchStrategy[int]:
    if fixed is not None:
        return st.just(fixed)
    buildable = {h for h in HEAD_COUNTS if h % multiple == 0} if shapes is None else {
        h for h, _ in shapes if h % multiple == 0}
    options = [h for h in HEAD_COUNTS if min_heads <= h <= max_heads and h in buildable]
    # A constructor constraint can leave none in the range asked for: take what builds.
    return _sampled(tuple(options or [h for h in HEAD_COUNTS if h in buildable]))


@cache
def _kv_head_counts(num_heads: int, grouped: bool) -> st.SearchStrategy[int]:
    """Divisors of ``num_heads``: proper ones first, largest first (so a counterexample keeps
    several groups), the head count itself last (plain multi-head) unless ``grouped``."""
    proper = [k for k in range(num_heads - 1, 0, -1) if num_heads % k == 0]
    options = proper if grouped and proper else [*proper, num_heads]
    return _sampled(tuple(options))


def kv_heads(caps: Capabilities, num_heads: int, grouped: bool = False) -> st.SearchStrategy:
    """The key/value head counts a case with ``num_heads`` heads may have (None: not grouped)."""
    if caps.kv_heads is None:
        return st.none()
    if isinstance(caps.kv_heads, int):
        return st.just(caps.kv_heads)
    return _kv_head_counts(num_heads, grouped)


def windows(caps: Capabilities) -> st.SearchStrategy:
    """The sliding windows a case may have (None: no window)."""
    if caps.window is None:
        return st.none()
    if isinstance(caps.window, int):
        return st.just(caps.window)
    return _sampled(WINDOWS)


def chunks(caps: Capabilities) -> st.SearchStrategy:
    """The causal chunk sizes a case may have (None: not chunked)."""
    if caps.chunk is None:
        return st.none()
    if isinstance(caps.chunk, int):
        return st.just(caps.chunk)
    return _sampled(CHUNKS)


def _head_dims(caps: Capabilities, num_heads: int, low: int,
               high: int) -> st.SearchStrategy[int]:
    if caps.shapes is None:
        return _integers(low, max(low, high))
    options = sorted(d for h, d in caps.shapes if h == num_heads and d >= low)
    within = [d for d in options if d <= max(low, high)]
    if not (within or options):
        reject()  # no buildable head_dim fits this case's lengths: draw another
    return _sampled(tuple(within or options))


WIDE_DTYPES = (torch.float32, torch.float64)


def wide_dtypes(caps: Capabilities) -> tuple[torch.dtype, ...]:
    """The float32/float64 it runs in (empty where it runs in half precision only)."""
    return tuple(d for d in caps.floats.supported if d in WIDE_DTYPES)


def wide_or_own_dtypes(caps: Capabilities) -> tuple[torch.dtype, ...] | None:
    """The dtypes a check that means exact-ish arithmetic explores: float32/float64 where it
    runs in either, else (None) its own dtypes: a kernel that runs in half precision only is
    checked in half precision rather than not at all."""
    return wide_dtypes(caps) or None


def cases(caps: Capabilities, device: str, **wanted: object) -> st.SearchStrategy[Case]:
    """A case the implementation can take (:func:`_cases`, whose keywords ``wanted`` are); the
    strategy carries what it asks for (``drawn``), which a replayed case is held to."""
    strategy = _cases(caps, device, **wanted)
    strategy.drawn = Drawn.asked(wanted)
    return strategy


@st.composite
def _cases(draw, caps: Capabilities, device: str, *, masks: MaskStyle = "none",
          causal: bool = False, cross: bool = True, min_heads: int = 1, min_len: int = 1,
          probe: bool = False, min_batch: int = 1, dtypes: tuple[torch.dtype, ...] | None = None,
          max_len: int = MAX_LEN, max_batch: int = 4, max_heads: int = 8,
          max_head_dim: int = MAX_HEAD_DIM, grouped: bool = False) -> Case:
    """A case the implementation can take.

    ``probe``: shapes where the attention-matrix probe fits (``kv_len <= head_dim`` and
    ``d_model > kv_len``, see :mod:`conformance.inference.observing.attention_probe`).
    ``causal``: the case asks for causal attention, with ``q_len == kv_len``. ``dtypes`` narrows
    the declared dtypes. ``grouped``: fewer key/value heads than query heads (for grouped-query
    implementations).
    """
    causal = causal or caps.causality.kind == "always"  # the case must say what the implementation does
    if masks == "auto":
        masks = "kept" if caps.mask is not None else "none"
    max_len = min(max_len, caps.max_len or MAX_LEN)
    min_len = max(min_len, caps.min_len or 1)  # shorter ones it refuses on this device
    max_len = max(max_len, min_len)
    if probe:
        max_len = min(max_len, MAX_HEAD_DIM - 1)
    if masks == "partly_masked":
        min_len = max(min_len, 2)
    max_batch = min(max_batch, caps.cache.max_batch or max_batch)
    batch = draw(_integers(max(min_batch, 2 if masks == "fully_masked" else 1), max_batch))
    if caps.length is not None:  # one length it takes: every case has it, whatever is asked
        q_len = kv_len = caps.length
    elif caps.queries is not None:  # the module's own queries: their count is not drawn
        q_len = caps.queries
        kv_len = draw(_just_or_integers(max(min(batch, max_len), min_len), min_len, max_len))
    else:
        q_len = draw(_just_or_integers(max(min(batch, max_len), min_len), min_len, max_len))
        kv_len = q_len
        if cross and caps.cross_attention and not causal:
            kv_len = draw(_just_or_integers(q_len, min_len, max_len))
    num_heads = draw(_heads(caps, min_heads, max_heads, grouped))
    # Drawn only where declared: an implementation without these forms gets the very cases it
    # got before they existed.
    kv_head_count = None if caps.kv_heads is None else draw(kv_heads(caps, num_heads, grouped))
    window = None if caps.window is None else draw(windows(caps))
    chunk = None if caps.chunk is None else draw(chunks(caps))
    if probe:
        # One-hot values need head_dim >= kv_len; the content channel needs d_model > kv_len.
        low = max(kv_len, 1 if num_heads > 1 else kv_len + 1)
        head_dim = draw(_head_dims(caps, num_heads, low, max_head_dim))
    else:
        head_dim = draw(_head_dims(caps, num_heads, 1, max_head_dim))
    allowed = [d for d in caps.floats.supported if dtypes is None or d in dtypes]
    dtype = draw(_sampled(tuple(dtype_name(d) for d in allowed)))

    kept = None
    mask_seed = None
    shared = shared_masks(caps)
    if masks != "none":
        # Drawn as a count of masked keys, so examples shrink towards masking as little as possible.
        fewest = 1 if masks == "partly_masked" else 0
        counts = 1 if shared else batch
        kept_list = [kv_len - draw(_integers(fewest, kv_len - 1)) for _ in range(counts)]
        if masks == "fully_masked" and shared:
            kept_list = [0]  # one mask for the whole batch: every element is fully masked
        elif masks == "fully_masked":
            empty = draw(_some_elements(batch))
            for b in empty:
                kept_list[b] = 0
        kept = tuple(kept_list * batch if shared else kept_list)
        mask_seed = None if right_padding(caps) else draw(_MASK_SEEDS)
    case = Case(batch=batch, q_len=q_len, kv_len=kv_len, num_heads=num_heads,
                head_dim=head_dim, dtype=dtype, device=device, seed=draw(SEEDS), kept=kept,
                mask_seed=mask_seed, causal=causal, shared_mask=shared and kept is not None,
                kv_heads=kv_head_count, window=window, chunk=chunk)
    if causal and masks in ("kept", "partly_masked") and not bool(case.attendable_rows().all()):
        case = replace(case, mask_seed=None)  # right padding keeps key 0: every row sees a key
        if window is not None or chunk is not None:
            case = window_padding(case, masked=masks == "partly_masked")
    return case


def window_padding(case: Case, *, masked: bool = False) -> Case:
    """``case`` (right-padded) with no row left without a key in its window of ``case.window``
    keys or its chunk of ``case.chunk`` positions: at most ``window - 1`` keys padded at the
    end, none of the last chunk's first one (at least one where ``masked``). Rows with no key to
    attend to are the fully_masked check's; elsewhere every row sees one, windows and chunks
    too."""
    floor = 0
    if case.window is not None:
        floor = case.kv_len - case.window + 1
    if case.chunk is not None:
        floor = max(floor, case.chunk * ((case.kv_len - 1) // case.chunk) + 1)
    if masked and floor >= case.kv_len:
        reject()  # a one-key window and a masked key always leave that key's row empty
    return replace(case, kept=tuple(max(count, floor) for count in case.kept))


DEFAULT_WINDOW = 4
"""The window of a case built by hand for a module that takes its window from the
configuration."""


DEFAULT_CHUNK = 4
"""The chunk of a case built by hand for a module that takes its chunk from the
configuration."""


def fixed_features(caps: Capabilities) -> dict[str, int | None]:
    """``kv_heads``, ``window`` and ``chunk`` for a case built by hand (not drawn): what the
    module fixes itself; where the factory takes them from the configuration, one key/value head
    per query head, a window of DEFAULT_WINDOW keys and chunks of DEFAULT_CHUNK."""
    window = caps.window if isinstance(caps.window, int) else (
        DEFAULT_WINDOW if caps.window == "config" else None)
    chunk = caps.chunk if isinstance(caps.chunk, int) else (
        DEFAULT_CHUNK if caps.chunk == "config" else None)
    return {"kv_heads": caps.kv_heads if isinstance(caps.kv_heads, int) else None,
            "window": window, "chunk": chunk}


def _mask_formats(caps: Capabilities) -> tuple[MaskConvention, ...]:
    """Every mask format it takes: its mask's, and each other one it accepts."""
    return ((caps.mask,) if caps.mask else ()) + tuple(caps.mask_formats)


def shared_masks(caps: Capabilities) -> bool:
    """Whether the masks must be the same for every batch element (a shared (Lq, Lk) format)."""
    return any(f.layout is MaskLayout.SHARED for f in _mask_formats(caps))


def right_padding(caps: Capabilities) -> bool:
    """Whether the masks must keep the first keys of each row (valid lengths say no other)."""
    return any(right_padded(f) for f in _mask_formats(caps))


def distinct_sizes(case: Case, *, heads_apart: bool = True) -> bool:
    """Batch, lengths, heads and head_dim pairwise distinct: no shape coincidence hides a mix-up
    (heads and head_dim only where ``heads_apart``: see :func:`heads_apart`)."""
    sizes = [case.batch, case.q_len, case.num_heads]
    if heads_apart:
        sizes.append(case.head_dim)
    if case.kv_len != case.q_len:
        sizes.append(case.kv_len)
    return len(set(sizes)) == len(sizes) and (heads_apart or case.head_dim not in sizes[:2])


def heads_apart(caps: Capabilities) -> bool:
    """Whether the implementation builds for some head count other than its head width: a
    module fixed at 4 heads of 4 builds for no other, and a check that asks for the two apart
    would find no case at all."""
    return caps.shapes is None or any(heads != dim for heads, dim in caps.shapes)
