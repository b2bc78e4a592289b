"""The logits' scale where a layer's design sets it: measured at its attention core at two widths,
then explained before any check judges it.

The scale s of q·kᵀ is fitted at the core (two forwards: Δlogits = s·Δ(q·kᵀ)) at two head widths
w; the law s = factor * w ** power follows (1/sqrt(w) the textbook's, 1/w muP's and Granite's
default, a constant a setting fixes). A constructor argument whose name says it sets the scale
(``attention_multiplier``, ``softmax_scale``, ``query_pre_attn_scalar``, ...) is built with
another value: where the fitted scale follows it (s = value, or value ** -0.5), the scale is
that setting's; where a name that settles it is ignored, that is recorded for ``scale`` to fail.
What the names only suggest (``scale``, ``scaling``) counts where behaviour shows it followed.
The float64 reference then computes with the layer's own scale (a design, not a mistake, where
it is explained), and the weight search tries it.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from conformance.inference.inquiry import Inquiry
from conformance.inference.observing.core_observed import core_scale
from conformance.inference.plan import declarations_read
from conformance.model.forms import LogitScale, PositionEncoding, ScaleRelation
from conformance.model.remedies import Note, Remedy
from conformance.model.spec import Config
from conformance.subject.boundary import ImplementationError
from conformance.subject.layer_in_model import LayerInModel

SETTLED = {"attention_multiplier": ScaleRelation.MULTIPLIER,
           "softmax_scale": ScaleRelation.MULTIPLIER, "sm_scale": ScaleRelation.MULTIPLIER,
           "qk_scale": ScaleRelation.MULTIPLIER,
           "query_pre_attn_scalar": ScaleRelation.INVERSE_SQRT}
"""Constructor arguments whose name settles that they set the logit scale, and how (Granite's,
FlashAttention's, timm's, Gemma's): one a layer ignores fails ``scale``."""
SUGGESTED = ("scale", "scaling", "attention_scale", "attn_logit_scale", "logit_scale")
"""Names that only suggest a scale setting: behaviour decides, and one ignored is no finding."""
TRIED = {ScaleRelation.MULTIPLIER: 0.3, ScaleRelation.INVERSE_SQRT: 2.0}
"""The value a setting is built with: far from every textbook scale at the widths measured."""
WIDTHS = (4, 9)
"""The head widths the law is measured at (2 heads each)."""
SECOND_WIDTHS = (9, 16)
"""The second width tried, in order: a layer that takes even head widths only (RoPE pairs the
dimensions) is measured at 16."""
TOLERANCE = 0.01
"""Relative agreement of a fitted scale with a law or a setting's value (the scale check's)."""
LAWS = (-0.5, -1.0, 0.0)
DECLARED = {"sqrt": -0.5, "head_dim": -1.0, "none": 0.0}
"""The scales the ``scale`` declaration states: 1/sqrt(w), 1/w, none (the power of w)."""


def _close(value: float, expected: float) -> bool:
    return abs(value - expected) <= TOLERANCE * abs(expected)


def _fitted(inquiry: Inquiry, head_dim: int,
            settings: tuple[tuple[str, float], ...] = ()) -> tuple[float, tuple[int, ...]] | None:
    """The scale at the first core of the layer built with 2 heads of ``head_dim`` (and
    ``settings``), with the widths where q and k meet; None where none is measured."""
    found = _fitted_and_declared(inquiry, head_dim, settings)
    return None if found is None else found[:2]


def _fitted_and_declared(inquiry: Inquiry, head_dim: int | None,
                         settings: tuple[tuple[str, float], ...] = ()
                         ) -> tuple[float, tuple[int, ...], float | None] | None:
    """:func:`_fitted`'s scale and widths, and the scale its layer declares (``scaling``, for
    a layer its model builds; None where it declares none); ``head_dim`` None: at the sizes the
    probes use (an instance's own)."""
    config = (replace(inquiry.config, batch=2, q_len=6, kv_len=6, dtype=torch.float64)
              if head_dim is None else
              Config(batch=2, q_len=6, kv_len=6, d_model=2 * head_dim, num_heads=2,
                     dtype=torch.float64, settings=settings))
    try:
        instance = inquiry.build(config)
        found = core_scale(instance, config, inquiry.plan.convention.call)
    except ImplementationError:
        return None
    return None if found is None else (*found, declared_scaling(instance.module))


def declared_scaling(module: torch.nn.Module) -> float | None:
    """The logit scale the attention layer a model builds declares: its ``scaling`` attribute
    (what ``transformers``' layers compute from their config, ``attention_multiplier``,
    ``query_pre_attn_scalar`` or 1/sqrt(head_dim), and pass their attention function); None
    where the module is no layer in a model or declares none."""
    layer = next((m.layer for m in module.modules() if isinstance(m, LayerInModel)), None)
    value = getattr(layer, "scaling", None)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return None
    return float(value)


def _law(measured: list[tuple[float, int]]) -> tuple[float, float] | None:
    """(factor, power) of s = factor * w ** power through both measurements, or None."""
    (s1, w1), (s2, w2) = measured
    for power in LAWS:
        factor = s1 / w1 ** power
        if _close(s2, factor * w2 ** power):
            return factor, power
    return None


def _arguments(cls: type) -> list[tuple[str, tuple[ScaleRelation, ...], bool]]:
    """The constructor's scale-setting arguments: (name, relations tried, settled by name)."""
    try:
        names = list(inspect.signature(cls.__init__).parameters)[1:]
    except (TypeError, ValueError):
        return []
    return [(name, (SETTLED[name],), True) if name in SETTLED else
            (name, tuple(ScaleRelation), False) for name in names
            if name in SETTLED or name in SUGGESTED]


def logit_scale(inquiry: Inquiry) -> None:
    """The layer's own logit scale (see the module docstring) into ``inquiry.logit_scale``, with
    a note; nothing where it is the textbook one and no setting names it, or where no core
    shows it (a fused kernel), or the layer can't be rebuilt at other widths."""
    plan, notes = inquiry.plan, inquiry.notes
    with declarations_read():
        stated = inquiry.declared.choice("scale", tuple(DECLARED))
    if stated is not None:
        inquiry.logit_scale = LogitScale(power=DECLARED[stated], declared=True)
        notes.append(f"{inquiry.logit_scale.describe()}: scale holds it to that")
        return
    if plan.instance is not None:  # never rebuilt: its one width, no setting to vary
        _instance_scale(inquiry)
        return
    measured, declared = [], []
    for head_dims in ((WIDTHS[0],), SECOND_WIDTHS):
        found = next(filter(None, (_fitted_and_declared(inquiry, head_dim)
                                   for head_dim in head_dims)), None)
        if found is None:
            return
        measured.append((found[0], found[1][0]))
        declared.append(found[2])
    law = _law(measured)
    if law is None:
        return
    factor, power = law
    if None not in declared and _by_its_model(inquiry, measured, declared):
        return
    scale = None
    for name, relations, settled in _arguments(plan.cls):
        for relation in relations:
            value = TRIED[relation]
            moved = _fitted(inquiry, WIDTHS[0], ((name, value),))
            if moved is not None and _close(moved[0], relation.scale(value)):
                scale = LogitScale(factor, power, name, relation)
                break
        if scale is not None:
            break
        if settled and moved is not None:
            # Measured with the other value and not followed; a build that raised or showed no
            # core there is no evidence of anything.
            scale = LogitScale(factor, power, name, relations[0], followed=False)
            break
    if scale is None and LogitScale(factor, power).ambiguous:
        scale = LogitScale(factor, power)  # 1/w: muP's and Granite's, or 1/sqrt(w) twice
    if scale is None and power == 0 and getattr(plan.cls, "built_by_its_model", False):
        scale = LogitScale(factor, power, fixed_by_model=True)  # T5's 1, or none by mistake
    if scale is None:
        return
    inquiry.logit_scale = scale
    measured_words = ", ".join(f"{s:.4g} at width {w}" for s, w in measured)
    if not scale.followed:
        notes.append(Note(f"{scale.argument}: by its name the logit scale's setting, but built "
                          f"with {scale.argument}={TRIED[scale.relation]:g} the scale its core "
                          f"measures stays {scale.law()} ({measured_words}): scale fails it",
                          None))
    elif scale.argument is not None:
        notes.append(Note(f"{scale.describe()}: measured at its attention core ({measured_words}; "
                          f"built with {scale.argument}={TRIED[scale.relation]:g} it follows); "
                          "the reference computes with it", None))
    elif scale.fixed_by_model:
        notes.append(Note(f"a logit scale of {scale.law()} at every width ({measured_words}, "
                          "measured at its attention core), not 1/sqrt(w): its model's "
                          "architecture fixes it (T5's design), or 1/sqrt(w) is missing; the "
                          "reference computes with it, scale warns",
                          Remedy.to("scale", "none", "make it part of its contract")))
    else:
        notes.append(Note(f"a logit scale of {scale.law()} ({measured_words}, measured at its "
                          "attention core), not 1/sqrt(w): muP's and Granite's default, or "
                          "1/sqrt(w) applied twice; the reference computes with it, scale warns",
                          Remedy.to("scale", "head_dim", "make it part of its contract")))


def _by_its_model(inquiry: Inquiry, measured: list[tuple[float, int]],
                  declared: list[float]) -> bool:
    """Where the layer's model declares its scale (its ``scaling`` at each width measured): the
    layer is held to that (the reference computes with it; measured otherwise, ``scale`` fails
    it, both values said); True where that was settled so."""
    law = (_law([(value, width) for value, (_, width) in zip(declared, measured, strict=True)])
           if len(measured) > 1 else (declared[0], 0.0))  # an instance: its one width
    if law is None:
        return False
    said = LogitScale(*law, declared=True)
    measured_words = ", ".join(f"{s:.4g} at width {w}" for s, w in measured)
    declared_words = ", ".join(f"{d:.4g}" for d in declared)
    agrees = all(_close(s, said.at(w)) for s, w in measured)
    if said.textbook and agrees:
        return True  # the textbook scale, declared and measured: nothing to say
    inquiry.logit_scale = said
    if agrees:
        inquiry.notes.append(Note(f"a logit scale of {said.law()}, as its layer's scaling "
                                  f"declares ({declared_words}; measured at its attention core: "
                                  f"{measured_words}): its model's setting, the reference "
                                  "computes with it", None))
    else:
        inquiry.notes.append(Note(f"its layer's scaling declares a logit scale of {said.law()} "
                                  f"({declared_words}), and its attention core measures "
                                  f"{measured_words}: scale fails it", None))
    return True


def _instance_scale(inquiry: Inquiry) -> None:
    """An instance's scale, at its one width: held to what its layer declares (its
    ``scaling``), where it declares one; otherwise, a layer its model builds whose scale is not
    1/sqrt(w) has its model's constant (GPT-Neo's 1: the architecture's, or a missing 1/sqrt(w);
    ``scale`` warns once and the reference computes with it)."""
    found = _fitted_and_declared(inquiry, None)
    if found is None:
        return
    scale, widths, declared = found
    width = widths[0]
    if declared is not None:
        _by_its_model(inquiry, [(scale, width)], [declared])
        return
    if _close(scale, width ** -0.5) or not getattr(inquiry.plan.cls, "built_by_its_model",
                                                   False):
        return
    inquiry.logit_scale = LogitScale(scale, 0.0, fixed_by_model=True)
    inquiry.notes.append(Note(
        f"a logit scale of {scale:.4g} at its width {width} (measured at its attention core), "
        f"not 1/sqrt({width}) = {width ** -0.5:.4g}: its model's architecture fixes it, or "
        "1/sqrt(w) is missing; the reference computes with it, scale warns",
        Remedy.to("scale", "none", "make it part of its contract")))


def keep_scale(inquiry: Inquiry) -> None:
    """The logit scale found into the capabilities' encoding, whatever the encoding steps set
    there (the reference computes with it, the scale check explains it)."""
    scale = inquiry.logit_scale
    if scale is None:
        return
    encoding = inquiry.capabilities.caps.position.encoding
    inquiry.capabilities.set(position={"encoding": replace(encoding or PositionEncoding(),
                                                           scale=scale)})
