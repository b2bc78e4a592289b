"""What a module keeps between calls, by behaviour: state its plain calls read (it can't be
checked as a function of its inputs), and a position argument that addresses a cache.

Names order nothing here. The same call on one instance, before and after a call with other
tokens, must give the same output; where it doesn't, the module keeps what a call writes. Where
that happens only through a position argument (``input_pos``: the keys and values written at
those positions, and read back), the argument is a KV cache API; where plain calls do it too, no
check can call the module as a function, and inference says so in one line.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.generation.cases import Case
from conformance.inference.calls.kv_cache import CacheProtocol, confirm
from conformance.inference.found import CapabilitiesFound
from conformance.inference.inquiry import Inquiry
from conformance.inference.observing.probing import probe_case
from conformance.inference.plan import InferenceError, Plan
from conformance.model.forms import CacheStyle
from conformance.model.remedies import Remedy
from conformance.numerics.tolerance import abs_error, reordering_tolerance
from conformance.subject.boundary import ImplementationError, Inputs, Instance

SEED = 7
"""The randomness of every probe call: a module whose eval-mode output is random (dropout left
on) gives the same output twice with the same seed, so only state makes them differ."""


def _moved(instance: Instance, call: Inputs, between: Inputs) -> float | None:
    """How far the output of ``call`` moves when ``between`` is called after it and ``call``
    again, relative to the output (None where a call fails: the checks report it)."""
    try:
        first = instance.forward(call, seed=SEED)
        instance.forward(between, seed=SEED)
        again = instance.forward(call, seed=SEED)
    except ImplementationError:
        return None
    change = float(abs_error(again, first, nan_equal=True).max())
    return None if change <= reordering_tolerance(first.dtype, first) else change


def _probe(plan: Plan, capabilities: CapabilitiesFound, heads: int,
           head_dim: int) -> tuple[Case, Inputs, Inputs]:
    """The probes' case, its inputs, and the same call with other tokens everywhere."""
    case = probe_case(heads, head_dim, kept=None, causal=capabilities.caps.causality.kind == "always")
    inputs = case.inputs(plan.convention.call)
    everywhere = torch.ones(case.batch, case.q_len, dtype=torch.bool)
    return case, inputs, case.replace_positions(inputs, everywhere, stream=17, scale=1.0,
                                                query_too=True)


def plain_state(inquiry: Inquiry) -> None:
    """InferenceError where plain calls (no cache, no positions) read what earlier calls wrote:
    the same call gives another output after a call with other tokens."""
    _, inputs, other = _probe(inquiry.plan, inquiry.capabilities, inquiry.heads, inquiry.head_dim)
    change = _moved(inquiry.build(position={"argument": None, "form": None}), inputs, other)
    if change is not None:
        raise InferenceError(
            f"{inquiry.label}: keeps state between calls: the same call gave outputs {change:.2g} apart "
            "before and after a call with other tokens (a cache that every call writes and "
            "reads?); the checks call it as a function of its inputs: reset its state in a "
            "wrapper", Remedy.to("kv_cache", None, "have it checked as a cache"))


STATE_SHIFT = 2
"""How far the state probe shifts the positions: the shifted call's keys then sit where an
earlier call of the probe's length wrote its own."""


def position_state(inquiry: Inquiry) -> None:
    """Whether the position argument reads state the module keeps between calls: the same
    call with shifted positions, before and after a call that writes other tokens at positions
    0..L-1, gives different outputs (a preallocated KV cache written at the given positions and
    attended over, gpt-fast's and torchtune's ``input_pos``). Such an argument is no position
    input, whatever its name: it is a cache API, checked by ``kv_cache`` where the module is
    causal (its buffers, the positions in the argument's form), else left alone."""
    plan, capabilities, notes = inquiry.plan, inquiry.capabilities, inquiry.notes
    argument = capabilities.caps.position.argument
    if argument is None or capabilities.caps.cache.style is not None:
        return
    case, inputs, other = _probe(plan, capabilities, inquiry.heads, inquiry.head_dim)
    change = _moved(inquiry.build(), replace(inputs, position=STATE_SHIFT), other)
    if change is None:
        return
    evidence = (f"probed: the same call with positions {STATE_SHIFT}..{STATE_SHIFT + case.q_len - 1}"
                f" gave outputs {change:.2g} apart before and after a call with other tokens "
                f"at positions 0..{case.q_len - 1}: the module keeps what a call writes at its "
                "positions")
    if not case.causal:
        capabilities.set(position={"argument": None, "form": None})
        notes.append(f"{argument}: not a position input alone but a cache API ({evidence}); "
                     "the module is not causal, so the cache is not checked, and the argument "
                     "is left to its default")
        return
    found = CacheProtocol(CacheStyle.BUFFERS, argument)
    problem = confirm(inquiry.build, found, case, plan.convention.call)
    if problem is not None:
        capabilities.set(position={"argument": None, "form": None})
        notes.append(f"{argument}: not a position input alone but a cache API ({evidence}); a "
                     f"prefill through it failed ({problem}): the cache is not checked, and the "
                     "argument is left to its default")
        return
    capabilities.set(**found.capabilities())
    notes.append(f"{argument}: not a position input alone but a KV cache API: buffers it keeps, "
                 f"written at the positions passed ({evidence}); kv_cache checks decoding "
                 "through it against the full forward, and position_shift does not shift "
                 "through it (it would read what the cache holds before the shift)")
