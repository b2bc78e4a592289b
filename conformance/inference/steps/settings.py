"""Constructor settings of the logits beyond a position encoding's (a softcap), found by name
and followed by behaviour: each goes into ``Capabilities.configured``, where ``configuration``
builds the layer with another value and sees whether what it computes follows (a setting that
changes nothing, one hard-coded at the call site, fails there)."""

from __future__ import annotations

import inspect

from conformance.inference.inquiry import Inquiry
from conformance.model.forms import Setting

SOFTCAP_NAMES = frozenset({"softcap", "logit_softcap", "logit_softcapping", "softcapping",
                           "attn_logit_softcapping", "attn_softcap", "attention_softcap"})
"""Names that say an argument caps the logits (Gemma 2's, FlashAttention's, FlexAttention
examples'), where its default is a number above 0: a cap the layer applies by default."""


def softcap_argument(cls: type) -> str | None:
    """The constructor argument of a softcap name with a positive number as default."""
    try:
        parameters = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return None
    for name, parameter in parameters.items():
        default = parameter.default
        if (name in SOFTCAP_NAMES and isinstance(default, (int, float))
                and not isinstance(default, bool) and default > 0):
            return name
    return None


def logit_settings(inquiry: Inquiry) -> None:
    """A softcap argument, as a setting ``configuration`` varies (a class built from its
    arguments; an instance checked as it is is never rebuilt)."""
    plan = inquiry.plan
    if plan.instance is not None or plan.config_argument is not None or inquiry.layout is None:
        return
    name = softcap_argument(plan.cls)
    if name is None:
        return
    capabilities = inquiry.capabilities
    capabilities.set(configured=(*capabilities.caps.configured, (Setting.SOFTCAP, name)))
    inquiry.notes.append(f"{name}: a logit softcap setting of its constructor; configuration "
                         "builds it with another value and checks that the logits follow")
