"""The normaliser step: what turns the layer's logits into its weights, measured, never assumed.

With its weights mapped, the attention-matrix probe reads the weights A the layer computes and
the products q·kᵀ behind them, at two lengths and two widths, in float64
(:mod:`conformance.numerics.normaliser_fit`). A softmax over the keys is the default and says
nothing. Another map (a sigmoid, a stick-breaking product, a ReLU; linear attention's feature
map of q and k, told from a softmax whose rows also sum to 1) goes into the encoding the
float64 reference applies, and the checks of softmax's own properties say what was observed
instead of judging it; a softmax over keys the data chooses (top-k, routing) is a part of the
computation the reference does not model. Where no map fits, the layer is judged as softmax
attention, said: a softmax gone wrong looks the same, and must not pass as a design.

The same reading shows causality by structure where no softmax is there to observe: every
weight on a later key exactly 0 while the output is not causal is a leak around the weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from conformance.inference.inquiry import Inquiry
from conformance.inference.observing.attention_probe import ProbeUnfit, probe
from conformance.inference.observing.probing import probe_case
from conformance.inference.steps.behaviour import NOT_CAUSAL, STRUCTURE_NOTE, STRUCTURE_OTHERWISE
from conformance.model.core import unweighted_future
from conformance.model.forms import PositionEncoding
from conformance.model.normaliser import Normaliser, NormaliserKind
from conformance.model.remedies import Note, Remedy
from conformance.model.spec import Config
from conformance.numerics.normaliser_fit import fit_normaliser, laws
from conformance.numerics.reference import allowed_keys
from conformance.subject.boundary import CapabilityError, ImplementationError

LENGTHS = (4, 6)
"""The key counts measured: two, so a bias that follows the length (-log n) is told from a
constant one."""
WIDER = 5
"""How much wider the second width the slope is measured at is (its law: 1/sqrt(w), 1/w)."""


@dataclass(frozen=True)
class Measured:
    """What the probe read at one size: the normaliser fitted (None: a softmax over the keys),
    and whether every weight on a later key was exactly 0."""

    normaliser: Normaliser | None
    future_unweighted: bool


def measured(inquiry: Inquiry, length: int, head_dim: int) -> Measured | None:
    """What the probe reads at ``length`` tokens with heads ``head_dim`` wide; None where it
    can't read the weights (no finding)."""
    heads = inquiry.heads
    config = Config(batch=2, q_len=length, kv_len=length, d_model=heads * head_dim,
                    num_heads=heads, dtype=torch.float64)
    case = probe_case(heads, head_dim, kept=None, mask_seed=None, batch=2, q_len=length,
                      kv_len=length, dtype="float64")
    causal = inquiry.capabilities.caps.causality.kind == "always"
    try:
        instance = inquiry.build(config, layout=inquiry.layout)
        seen = probe(instance, case, inquiry.plan.convention.call, causal=causal,
                     encoding=inquiry.capabilities.caps.position.encoding)
    except (ProbeUnfit, ImplementationError, CapabilityError, ValueError, RuntimeError):
        return None
    visible = allowed_keys(case.batch, length, length, None, causal)
    return Measured(fit_normaliser(seen.attention, seen.logits, visible, seen.q, seen.k),
                    unweighted_future(seen.attention))


def _one(first: Measured, second: Measured, wider: Measured | None,
         widths: tuple[int, int]) -> Normaliser | None:
    """The normaliser the fits at both lengths (and the second width) agree on: None where
    both are a softmax; where only one is not (a selection the shorter length leaves no room
    for), that one."""
    fits = [m.normaliser for m in (first, second)]
    if None in fits:
        found = fits[0] or fits[1]
        if found is None or not found.modelled:
            return found
        return Normaliser(NormaliserKind.UNKNOWN, evidence=found.evidence)  # a map at one length
    at_width = wider.normaliser if wider is not None else None
    return laws((fits[0], fits[1]), LENGTHS, at_width, widths) or Normaliser(
        NormaliserKind.UNKNOWN, evidence=fits[0].evidence)


def normaliser_form(inquiry: Inquiry) -> None:
    """The layer's normaliser, where its weights map and it is not a softmax over the keys; and
    causal by structure where the probe weighs no later key while the output is not causal."""
    if inquiry.layout is None or inquiry.plan.convention.call != "self":
        return
    # The probe's values carry one position a feature: heads at least as wide as the keys.
    widths = (max(inquiry.head_dim, *LENGTHS), max(inquiry.head_dim, *LENGTHS) + WIDER)
    first = measured(inquiry, LENGTHS[0], widths[0])
    second = measured(inquiry, LENGTHS[1], widths[0]) if first is not None else None
    if first is None or second is None:
        return
    capabilities = inquiry.capabilities
    if (first.future_unweighted and second.future_unweighted and not inquiry.declared.causal
            and capabilities.caps.causality.kind == "never"):
        capabilities.set(causality={"kind": "always"})
        inquiry.notes[:] = [note for note in inquiry.notes
                            if getattr(note, "text", note) != NOT_CAUSAL]
        inquiry.notes.append(Note(STRUCTURE_NOTE + " (read through its weights)",
                                  Remedy.to("causal", "never", STRUCTURE_OTHERWISE)))
        first, second = (measured(inquiry, n, widths[0]) for n in LENGTHS)  # fitted as causal
        if first is None or second is None:
            return
    modelled = any(m.normaliser is not None and m.normaliser.modelled for m in (first, second))
    wider = measured(inquiry, LENGTHS[0], widths[1]) if modelled else None
    found = _one(first, second, wider, widths)
    if found is None:
        return
    if found.kind is NormaliserKind.UNKNOWN:
        # No map fits: a design of its own or a softmax gone wrong (dropout left on, a mask
        # after the softmax) look alike here, and excusing the softmax checks would pass the
        # second silently: it is judged as softmax attention, and that is said.
        inquiry.notes.append(
            f"its weights are no softmax over the keys (observed: {found.evidence}), and no map "
            "tried (a sigmoid, a stick-breaking product, a ReLU, a selection by the data, a "
            "linear attention's feature map) "
            "reproduces them from q·k: judged as softmax attention")
        return
    encoding = capabilities.caps.position.encoding or PositionEncoding()
    capabilities.set(position={"encoding": replace(encoding, normaliser=found)})
    if not found.modelled and not capabilities.caps.unmodelled:
        capabilities.set(unmodelled=f"its weights are {found.describe()}")
    inquiry.notes.append(
        f"normaliser: {found.describe()} (observed: {found.evidence}): softmax's own properties "
        "(rows summing to 1, a logit shift, the scale as a temperature) are not asked of it"
        + ("; the float64 reference applies this map" if found.modelled else
           "; the float64 reference does not model it, so its comparisons skip"))
