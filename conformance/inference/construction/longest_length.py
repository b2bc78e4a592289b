"""The longest sequence a module takes, where it takes fewer than the suite's longest case: a
causal buffer of a global ``block_size`` (the "Let's build GPT" lecture's ``tril``), measured by
calls, not read from a name.

What it refuses past is its contract: the cases stay within it and the report says so. But a
length that follows one of its sizes (a ``tril`` buffer of ``head_size`` squared, or of the
model width where the config's ``block_size`` was meant) is a bug: measured at two
configurations of different head widths, a longest length that differs is a doubt that
``contract`` fails with.
"""

from __future__ import annotations

from dataclasses import replace

from conformance.inference.inquiry import Inquiry
from conformance.inference.names.roles import CONTEXT_LENGTH
from conformance.inference.plan import Plan, runs
from conformance.model.spec import Config

SHORTEST = 2
"""A module that refuses two tokens is not measured here (the gate reports its basic call)."""


def _runs(plan: Plan, config: Config, length: int) -> bool:
    return runs(plan, replace(config, batch=1, q_len=length, kv_len=length))


def _longest(plan: Plan, config: Config) -> int | None:
    """The longest length at most CONTEXT_LENGTH that runs at ``config``'s sizes, where one
    does and CONTEXT_LENGTH does not (lengths that run are taken to be a prefix); else None."""
    if _runs(plan, config, CONTEXT_LENGTH) or not _runs(plan, config, SHORTEST):
        return None
    low, high = SHORTEST, CONTEXT_LENGTH  # low runs, high does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _runs(plan, config, middle) else (low, middle)
    return low


def _other(inquiry: Inquiry) -> Config | None:
    """A configuration of a wider head than the probes', where one builds: the probes' head
    count with heads twice as wide first (a buffer of either width then tells)."""
    config = inquiry.config
    heads, head_dim = config.num_heads, config.d_model // config.num_heads
    pairs = inquiry.constraint.pairs if inquiry.constraint else ((heads, 2 * head_dim),)
    wider = sorted((p for p in pairs if p[1] > head_dim),
                   key=lambda p: (p != (heads, 2 * head_dim), p[0] * p[1], p))
    if not wider:
        return None
    heads, head_dim = wider[0]
    return replace(config, num_heads=heads, d_model=heads * head_dim)


def longest_length(inquiry: Inquiry) -> None:
    """The module's longest length (``max_len``), where it takes fewer tokens than the long
    case; and, where that length follows its head width, the doubt ``contract`` fails with."""
    plan, caps = inquiry.plan, inquiry.capabilities.caps
    if plan.length is not None or plan.queries is not None or caps.max_len is not None:
        return
    longest = _longest(plan, inquiry.config)
    if longest is None:
        return
    inquiry.capabilities.set(max_len=longest)
    inquiry.notes.append(f"takes at most {longest} tokens (probed: {longest} run, {longest + 1} "
                         "raise): the cases stay within it")
    other = _other(inquiry)
    elsewhere = None if other is None else _longest(plan, other)
    if elsewhere is not None and elsewhere != longest:
        config = inquiry.config
        words = (f"the longest sequence it takes follows its sizes: {longest} tokens at "
                 f"{config.num_heads} head(s) of {config.d_model // config.num_heads}, "
                 f"{elsewhere} at {other.num_heads} of {other.d_model // other.num_heads} "
                 "(a buffer sized by a width where a context length belongs?)")
        inquiry.capabilities.doubt(length=words)
        inquiry.capabilities.set(max_len=min(longest, elsewhere))
        inquiry.notes.append(words + " (see contract)")
