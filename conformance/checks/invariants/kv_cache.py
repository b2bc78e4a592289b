"""KV-cache decoding: a prefill, then decoding token by token or in chunks, equals the full
causal forward at every position.

Property: for a causal implementation with a KV cache and a sequence x of length L, a prefill of
the first p tokens into a fresh cache, then the remaining tokens fed c at a time, each call
continuing the cache of everything before it, gives at every position t the output row t of the
full causal forward f(x) (within the reordering tolerance: the same values computed in another
order), for c = 1 (token by token) and for a chunk size c > 1. A decode call has fewer queries
than keys (Lq < Lk): its causal mask must be aligned bottom-right, row i of the call being
position p + i and seeing keys 0 .. p + i. Run in float32 and float64 (a kernel that runs in
half precision only, in its own dtypes), without padding masks.

Cross-attention with a cache of its context's keys and values (a decoder's over the encoder
states, HuggingFace's ``past_key_value``): the queries fed in the same steps, each call given the
context, its padding mask and the cache the calls before it returned, give the rows of one
uncached call over the whole context with that mask, whatever the module's causality.

Each decoding pass runs on a freshly built instance whose own state a plain call with other
tokens has filled first: a module that keeps its cache in buffers (written by every call) then
holds wrong keys and values wherever this pass did not write, so a step that reads a slot the
decode should have written (and did not) reads those, at every step after it, not the full
forward's keys left there by an earlier call.

Where the full forward is itself not causal (a row changes when later tokens are left out), no
decoding can equal it: the failure is named as the causal check names the module's mistake, with
the same kind of bug, so that one mistake is charged once.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from conformance.checks.diagnosis import Bug
from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.causal import causal_mistake
from conformance.checks.invariants.verify import fmt, reference_applies
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases, wide_or_own_dtypes
from conformance.model.results import Hint
from conformance.model.spec import Capabilities
from conformance.numerics.reference import reference_attention
from conformance.numerics.tolerance import abs_error, reordering_tolerance, worst_index
from conformance.subject.boundary import ImplementationError, Inputs
from conformance.subject.cache_session import NOT_AS_DECLARED

MAX_LEN = 12
"""Long enough for a prefill and several decode steps of each kind; each case costs L calls."""

UNWRITTEN_HINT = ("a cached call reads a slot of the cache that no call of this decoding wrote: "
                  "the same decoding is right where an earlier call of the whole sequence left "
                  "its keys and values there; does every call (a one-token decode step "
                  "included) write its new keys and values into the cache?")

STALE_STREAM = 23
"""The random stream of the other tokens a pass's instance is called with first."""

TOP_LEFT_HINT = ("the decode step attends to key 0 alone: the causal mask is aligned top-left "
                 "(query i sees keys <= i) where queries are fewer than keys; with a cache, query "
                 "i of Lq sees keys <= i + Lk - Lq (mask = ones(Lq, Lk).tril(Lk - Lq), a "
                 "hand-written triu(1) shifted by Lk - Lq); SDPA's is_causal=True does the same "
                 "(pytorch #144858): pass it only when Lq == Lk")
"""Said whether the mask is hand-written or SDPA's: both align it top-left, and the words name
the alignment, not a call the module may never make."""

GROWS_HINT = ("does the cache grow along the sequence axis (keys and values concatenated on the "
              "wrong axis)?")
"""For a decode call that raised what reads as a shape mismatch (see :func:`_shape_mismatch`)."""

LAYOUT_HINT = Hint("return the cache as the assignment states it: keys and values each with "
                   "their heads split, in the declared axis order (view and transpose them as "
                   "for the attention itself, before returning them)", Bug.CACHE_LAYOUT.value)
"""A cache in another form than declared (``cache-layout``)."""

_SHAPE_WORDS = re.compile(r"\b(sizes?|shapes?|dimensions?|dim)\b", re.IGNORECASE)
_SHAPE_ERRORS = ("RuntimeError", "ValueError", "IndexError")


def _shape_mismatch(message: str) -> bool:
    """Whether an error, ``Type: first line``, reads as a shape mismatch (torch's "Sizes of
    tensors must match", "shapes cannot be multiplied", "Dimension out of range"): only then is
    the cache's axis a likely cause; any other exception is the module's own to explain."""
    kind, _, text = message.partition(": ")
    return kind in _SHAPE_ERRORS and _SHAPE_WORDS.search(text) is not None


def _chunks(length: int, prefix: int, size: int) -> list[tuple[int, int]]:
    """[(start, end)]: the prefill 0..prefix, then chunks of ``size`` up to ``length``."""
    bounds = [(0, prefix)]
    start = prefix
    while start < length:
        bounds.append((start, min(length, start + size)))
        start += size
    return bounds


class KVCacheDecoding(Check):
    """Prefill then decode with the cache equals the full causal forward."""

    name = "kv_cache"
    order = 230
    applies = "a KV cache"
    title = "prefill + decoding with the KV cache (token by token, in chunks) = the full forward"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.cache.style is None:
            return Lacking("no KV cache")
        return capabilities.fixed_length_skip("a prefix of a sequence and its next tokens")

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        cross = caps.call == "cross"
        strategy = cases(caps, context.device, causal=not cross, min_len=2, max_len=MAX_LEN,
                         dtypes=wide_or_own_dtypes(caps), masks="auto" if cross else "none")
        context.explore(strategy, lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        x = case.tensor(case.batch, case.q_len, case.d_model)
        full = context.run(context.build(case), self._inputs(context, case, x, 0, cache=False),
                           case)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), full)
        # A prefill of two tokens or more where the length allows: it has a causal mask to keep.
        prefix = min(case.q_len - 1, 2 + case.seed % max(1, case.q_len - 2))
        sizes = [1] + ([2 + case.seed % 2] if case.q_len - prefix > 1 else [])
        other = case.tensor(case.batch, case.q_len, case.d_model, stream=STALE_STREAM)
        for size in sizes:
            instance = context.build(case)
            # Whatever state the module keeps now holds other tokens (see the module docstring).
            context.run(instance, self._inputs(context, case, other, 0, cache=False), case)
            try:
                self._decode(context, instance, case, x, full, prefix, size, tolerance)
            except Violation as violation:
                if context.hint(lambda size=size: self._reads_unwritten(
                        context, case, x, full, prefix, size, tolerance)):
                    violation.hint = UNWRITTEN_HINT
                raise

    def _reads_unwritten(self, context: CheckContext, case: Case, x: torch.Tensor,
                         full: torch.Tensor, prefix: int, size: int, tolerance: float) -> bool:
        """Whether the same pass agrees on an instance whose state holds this sequence's own
        keys and values (a plain call with ``x`` first): then the failing pass read slots no
        call of it wrote."""
        instance = context.build(case)
        context.run(instance, self._inputs(context, case, x, 0, cache=False), case)
        try:
            self._decode(context, instance, case, x, full, prefix, size, tolerance)
        except Violation:
            return False
        return True

    def _inputs(self, context: CheckContext, case: Case, x: torch.Tensor, position: int,
                cache: bool) -> Inputs:
        """A call of the tokens ``x`` at ``position``; in cross-attention, over the case's own
        context and mask, the same at every call (only the queries step)."""
        if context.capabilities.call == "cross":
            memory = case.inputs("cross")
            return Inputs(x, memory.key, memory.value, keep=memory.keep, position=position,
                          cache=cache)
        inputs = Inputs.self_attention(x, causal=True)
        if context.capabilities.call == "qkv":
            inputs = Inputs(x, x.clone(), x.clone(), causal=True)
        return Inputs(inputs.query, inputs.key, inputs.value, causal=True, position=position,
                      cache=cache) if cache else inputs

    def _decode(self, context: CheckContext, instance, case: Case, x: torch.Tensor,
                full: torch.Tensor, prefix: int, size: int, tolerance: float) -> None:
        how = "token by token" if size == 1 else f"in chunks of {size}"
        for call, (start, end) in enumerate(_chunks(case.q_len, prefix, size)):
            inputs = self._inputs(context, case, x[:, start:end], start, cache=True)
            span = f"position {start}" if end - start == 1 else f"positions {start}..{end - 1}"
            phase = (f"the prefill of positions 0..{end - 1}" if call == 0 else
                     f"the decode call for {span} ({how}, after a prefill of {prefix})")
            try:
                output = instance.forward(inputs)
            except ImplementationError as error:
                text = str(error)
                if not text.startswith("forward raised "):  # a cache not as declared
                    raise Violation(f"{phase}: {text}", hint=LAYOUT_HINT
                                    if text.startswith(NOT_AS_DECLARED) else None) from error
                raised = (text.removeprefix("forward raised ").strip().splitlines() or [""])[0]
                raise Violation(f"{phase} raised: {raised}",
                                hint=GROWS_HINT if call > 0 and _shape_mismatch(raised)
                                else None) from error
            expected_shape = (case.batch, end - start, case.d_model)
            if tuple(output.shape) != expected_shape:
                raise Violation(f"{phase} returned shape {tuple(output.shape)}, expected "
                                f"{expected_shape}")
            diff = abs_error(output, full[:, start:end])
            if float(diff.max()) <= tolerance:
                continue
            b, row, _ = worst_index(diff)
            position = start + row
            against = ("one uncached call's over the whole context" if
                       context.capabilities.call == "cross" else "the full causal forward's")
            if context.capabilities.call == "cross":
                hint = context.hint(lambda output=output, start=start, end=end: self._cross_hint(
                    context, case, output, x, start, end, tolerance))
            else:
                # A forward that is not causal first: no cache can match it.
                hint = context.hint(lambda end=end, position=position: self._leak_hint(
                    context, case, x, full, position, end, tolerance))
                if hint is None and call == 0:
                    hint = context.hint(lambda output=output, end=end: self._prefill_hint(
                        context, case, output, x[:, :end], tolerance))
                elif hint is None:
                    hint = self._hint(context, output, full, call, start, end, size, row)
            raise Violation(
                f"{phase}: output row {position} of batch {b} differs from {against} by "
                f"{fmt(float(diff[b, row].max()))} (allowed {fmt(tolerance)})",
                details=[f"sequence length {case.q_len}, prefill {prefix}, then {how}"],
                hint=hint)

    def _cross_hint(self, context: CheckContext, case: Case, output: torch.Tensor,
                    x: torch.Tensor, start: int, end: int, tolerance: float) -> str | None:
        """The context's mask dropped on cached calls, where the cached rows equal an uncached
        call over the context without it."""
        if case.kept is None:
            return None
        unmasked = replace(self._inputs(context, case, x, 0, cache=False), keep=None)
        expected = context.run(context.build(case), unmasked, case)[:, start:end]
        if float(abs_error(output, expected).max()) > tolerance:
            return None
        return ("a call with the cache attends to the context's masked keys: is the context's "
                "padding mask applied only when the keys and values are computed, not when they "
                "come from the cache?")

    def _leak_hint(self, context: CheckContext, case: Case, x: torch.Tensor, full: torch.Tensor,
                   position: int, end: int, tolerance: float) -> str | None:
        """Where the full forward, the property's own yardstick, is not causal: its row
        ``position`` changes when the tokens from ``end`` on (which the failing call has not
        been given) are left out, so no decoding can give it. The failure then follows from
        that, and is named as the causal check names it (the same kind of bug: see
        :func:`~conformance.checks.invariants.causal.causal_mistake`)."""
        if end >= case.q_len:
            return None
        uncached = self._inputs(context, case, x[:, :end], 0, cache=False)
        shorter = context.run(context.build(case), uncached, case)
        if float(abs_error(shorter[:, position], full[:, position]).max()) <= tolerance:
            return None
        leak = (f"its output row {position} changes when the tokens after position {end - 1} "
                "are left out, which no decoding can match before it is given them")
        mistake = causal_mistake(context, case)
        if mistake is None:  # measured, but no mistake named: the row may depend on the length
            return (f"the full forward's {leak}: does it depend on later tokens, or on the "
                    "sequence's length?")
        return Hint(f"the full forward is not causal ({leak}): {mistake}", mistake.kind)

    def _prefill_hint(self, context: CheckContext, case: Case, output: torch.Tensor,
                      prefix: torch.Tensor, tolerance: float) -> str | None:
        """The causal mask dropped with a cache attached, where measured: the prefill equals
        attention over the prefix without it (the module's own call without causality, where
        it is causal on request; else the float64 reference's, where weights are known), on a
        prefix where that differs from the module's own causal call."""
        caps = context.capabilities
        masked = self._inputs(context, case, prefix, 0, cache=False)
        unmasked = replace(masked, causal=False)
        instance = context.build(case)
        if caps.causality.kind == "optional":
            expected = context.run(instance, unmasked, case)
        elif reference_applies(caps):
            expected = reference_attention(instance.read_weights(), unmasked.query, unmasked.key,
                                           unmasked.value, encoding=caps.position.encoding).output
        else:
            return None
        # Told apart only where the causal mask changes this prefix (two tokens or more).
        told = float(abs_error(context.run(instance, masked, case), expected).max()) > tolerance
        if not told or float(abs_error(output, expected).max()) > tolerance:
            return None
        return ("with a cache attached, the prefill is attention over the prefix without the "
                "causal mask: is the causal mask dropped when a cache is passed?")

    @staticmethod
    def _hint(context: CheckContext, output: torch.Tensor, full: torch.Tensor, call: int,
              start: int, end: int, size: int, row: int) -> str | None:
        tolerance = reordering_tolerance(context.judged(full.dtype), full)
        if end - start == 1 and start > 0 and float(abs_error(output[:, 0], full[:, 0]).max()) \
                <= tolerance:
            return TOP_LEFT_HINT
        if size > 1:
            return ("a decode chunk's row i is position p + i and sees keys 0 .. p + i: is the "
                    "chunk's causal mask aligned top-left (row i seeing keys 0 .. i), or dropped "
                    "when a cache is attached?")
        if call > 1:
            return ("the first decode call agrees, a later one does not: is the cache returned "
                    "or written at every call (the present cache, with the new keys and "
                    "values)?")
        if context.capabilities.position.relative:
            return ("are the new tokens' positions offset by the cache length (RoPE / ALiBi at "
                    "positions p, p + 1, ..., not 0, 1, ...)?")
        return None
