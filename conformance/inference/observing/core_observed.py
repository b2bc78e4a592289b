"""What inference reads from a layer's attention core (:mod:`conformance.model.core`), observed
inside its forward: whether it depends on positions through a bias in its logits (measured with
:mod:`conformance.numerics.core_fit`: a learned relative bias, T5's buckets, or any other bias
over (query, key) positions no RoPE or ALiBi hypothesis reproduced); the logit softcap it
applies; and how its core departs from textbook attention by design."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from conformance.generation.cases import dtype_name
from conformance.inference.observing.probing import probe_case
from conformance.model.check_names import THROUGH_THE_CORE
from conformance.model.core import AttentionSite
from conformance.model.forms import LogitScale, PositionEncoding
from conformance.model.remedies import Note, Remedy
from conformance.model.spec import Config
from conformance.numerics.core_fit import (
    LOGIT_RESIDUAL,
    BiasForm,
    bias_form,
    bias_tolerance,
    fitted_scale,
    logit_bias,
)
from conformance.subject.boundary import CapabilityError, ImplementationError, Inputs, Instance

ROUTED = ", ".join(THROUGH_THE_CORE[:-1]) + " and " + THROUGH_THE_CORE[-1]
"""The checks that judge a layer through its core, in words: "row_stochastic, reference and
scale"."""

WORDS = {
    BiasForm.RELATIVE: "a function of the distance j − i alone (relative, as T5's buckets)",
    BiasForm.ABSOLUTE: "a function of the positions (i, j) that is not of j − i alone "
                       "(absolute)",
}


def _two_forwards(instance: Instance, config: Config, call: str
                  ) -> list[tuple[AttentionSite, AttentionSite]]:
    """Each core of two plain forwards of other tokens at ``config``'s sizes, paired (none where
    a forward fails)."""
    case = probe_case(config.num_heads, config.d_model // config.num_heads, kept=None,
                      mask_seed=None, batch=config.batch, q_len=config.q_len,
                      kv_len=config.kv_len, dtype=dtype_name(config.dtype))
    try:
        first = instance.observe(case.inputs(call))
        second = instance.observe(replace(case, seed=4).inputs(call))
    except (ImplementationError, CapabilityError):
        return []
    return list(zip(first.sites, second.sites, strict=False))


def core_scale(instance: Instance, config: Config, call: str) -> tuple[float, tuple[int, ...]] | None:
    """(s, the widths where q and k meet) at the first core whose logits are one scale s of
    q·kᵀ plus what the tokens don't move, over two forwards; None where none is."""
    for site, other in _two_forwards(instance, config, call):
        scale, residual = fitted_scale(site, other)
        if scale == scale and residual <= LOGIT_RESIDUAL and site.scalars_known:
            return scale, site.widths
    return None


def position_bias(instance: Instance, config: Config, call: str) -> BiasForm | None:
    """How the bias the tokens don't move in ``instance``'s logits depends on positions, over
    two plain forwards of other tokens (the most position-dependent form any core shows; a
    causal mask it applies itself is no bias: masked keys are left out); None where no core
    could be measured."""
    forms = []
    for site, other in _two_forwards(instance, config, call):
        scale, residual = fitted_scale(site, other)
        if scale != scale or residual > LOGIT_RESIDUAL:
            continue
        forms.append(bias_form(logit_bias(site, other, scale), bias_tolerance(site)))
    if not forms:
        return None
    for form in (BiasForm.ABSOLUTE, BiasForm.RELATIVE):
        if form in forms:
            return form
    return BiasForm.NONE


def observed_sites(instance: Instance, inputs: Inputs) -> tuple[AttentionSite, ...]:
    """The attention cores one forward of ``inputs`` shows (none where it fails): what the weight
    step reads once, for the three uses below."""
    try:
        return instance.observe(inputs).sites
    except ImplementationError:
        return ()


def core_softcap(sites: tuple[AttentionSite, ...]) -> float | None:
    """The logit softcap c the cores apply (c·tanh(·) before the softmax, observed), or None."""
    return next((site.softcap for site in sites if site.softcap is not None), None)


def capped(encodings: Iterable[PositionEncoding | None], softcap: float | None,
           scale: LogitScale | None = None) -> Iterator[PositionEncoding | None]:
    """``encodings`` each with the logit ``softcap`` and the layer's own logit ``scale`` (the
    same where None)."""
    for encoding in encodings:
        if softcap is not None:
            encoding = replace(encoding or PositionEncoding(), softcap=softcap)
        if scale is not None:
            encoding = replace(encoding or PositionEncoding(), scale=scale)
        yield encoding


def core_departures(sites: tuple[AttentionSite, ...], tried: int, error: float) -> str | None:
    """Where the cores depart from textbook attention by design (two maps combined, sinks), why
    no weights are taken (``tried`` assignments came within ``error`` of its output at best):
    the checks that need weights then judge it through its core. None where none does."""
    departures = tuple(dict.fromkeys(words for site in sites for words in site.departures()))
    if not departures:
        return None
    return (f"weights: none taken (no assignment of {tried} tried reproduces its output, closest "
            f"relative error {error:.1e}, and its attention core is not one softmax of q·kᵀ: "
            f"{'; '.join(departures)}): {ROUTED} judge it through its "
            "core, the other checks that need weights are skipped")


def unmapped_note(sites: tuple[AttentionSite, ...], words: str, remedy: Remedy) -> Note:
    """``words`` (why no weights were found) and what follows: where an attention core shows,
    the checks that need weights judge it there (a weights declaration could name no q, k, v
    its core does not have); else they are skipped, and which weights to declare."""
    if sites:
        departures = tuple(dict.fromkeys(w for site in sites for w in site.departures()))
        design = (f" (a core of its own design: {'; '.join(departures)})" if departures else "")
        return Note(f"{words}; {ROUTED} judge it through its attention "
                    f"core, observed in its forward{design}; the other checks that need weights "
                    "are skipped")
    return Note(f"{words}; the checks that need weights are skipped", remedy)
