"""Constructor settings that claim to change attention beyond a position encoding's, found by
name and followed by behaviour: each goes into ``Capabilities.configured``, where
``configuration`` builds the layer with other values and sees whether what it computes follows
(a setting that changes nothing, one hard-coded at the call site, fails there).

A softcap the float64 reference models, so the output is held to the reference of the other
value; a temperature, a window on a layer not checked as windowed, a RoPE base no rule models,
and a sink count are held to changing the output at all. A name only orders the search; a
setting another step already follows (the scale's, a causal window's, a chunk's, a RoPE modelled
by rule) is that step's.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from conformance.inference.inquiry import Inquiry
from conformance.inference.names.roles import WINDOW
from conformance.inference.weights.encoding_search import THETA_NAMES
from conformance.model.forms import Setting

SOFTCAP_NAMES = frozenset({"softcap", "logit_softcap", "logit_softcapping", "softcapping",
                           "attn_logit_softcapping", "attn_softcap", "attention_softcap"})
"""Names that say an argument caps the logits (Gemma 2's, FlashAttention's, FlexAttention
examples'), where its default is a number above 0: a cap the layer applies by default."""


@dataclass(frozen=True)
class Named:
    """Constructor arguments whose name says they set ``setting``."""

    setting: Setting
    names: frozenset[str]
    switches: tuple[str, ...]
    """Parts of the name of a boolean argument that turns the setting on: one off by default
    leaves the setting inert by design (Qwen2's ``use_sliding_window=False``), so it is not
    varied."""
    words: str


FOLLOWED = (
    Named(Setting.TEMPERATURE,
          frozenset({"temperature", "attn_temperature", "attention_temperature",
                     "softmax_temperature", "logit_temperature", "tau"}),
          ("temperature", "temp", "tau"), "a temperature of the logits"),
    Named(Setting.WINDOW, frozenset(WINDOW), ("window", "local", "sliding"),
          "a window of keys (the layer is not checked as causally windowed)"),
    Named(Setting.THETA, frozenset(THETA_NAMES) - {"base"}, ("rope", "rotary", "theta"),
          "RoPE's base (the RoPE found is measured per width, not modelled by a rule)"),
    Named(Setting.SINK,
          frozenset({"num_sinks", "n_sinks", "sink_tokens", "num_sink_tokens", "sink_size",
                     "attention_sinks", "num_attention_sinks", "n_sink_tokens", "sink_count"}),
          ("sink",), "a count of sink tokens"),
)
"""The settings held to changing the output, in the order they are looked for. ``base`` alone
is too common a word to say RoPE."""


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        return {}


def _number(default: object) -> bool:
    return isinstance(default, (int, float)) and not isinstance(default, bool)


def softcap_argument(cls: type) -> str | None:
    """The constructor argument of a softcap name with a positive number as default."""
    for name, parameter in _parameters(cls).items():
        if name in SOFTCAP_NAMES and _number(parameter.default) and parameter.default > 0:
            return name
    return None


def switched_off(parameters: dict[str, inspect.Parameter], named: Named) -> str | None:
    """A boolean argument, False by default, whose name says it turns ``named`` on."""
    return next((name for name, parameter in parameters.items()
                 if parameter.default is False and any(part in name.lower()
                                                       for part in named.switches)), None)


def followed_arguments(cls: type, taken: set[str]) -> list[tuple[Named, str, str | None]]:
    """(setting, argument, the switch that leaves it off by default) for each constructor
    argument of a followed setting's name whose default is a positive number or None, and that
    no other step took (``taken``)."""
    parameters = _parameters(cls)
    found = []
    for named in FOLLOWED:
        for name, parameter in parameters.items():
            default = parameter.default
            if name in named.names and name not in taken and (
                    default is None or (_number(default) and default > 0)):
                found.append((named, name, switched_off(parameters, named)))
                break
    return found


def _taken(inquiry: Inquiry) -> set[str]:
    """Arguments another step follows: the roles construction sets (a causal window, a chunk, a
    context), the settings already configured (RoPE's by rule, a softcap)."""
    plan, caps = inquiry.plan, inquiry.capabilities.caps
    roles = plan.roles
    taken = {name for _, name in caps.configured}
    if caps.window is not None or plan.length_window is not None:
        taken.add(roles.window)
    taken.update(name for name in (roles.chunk, roles.context, roles.width, roles.heads,
                                   roles.head_dim, roles.kv_heads) if name)
    return taken


def constructor_settings(inquiry: Inquiry) -> None:
    """The settings ``configuration`` varies (a class built from its arguments; an instance
    checked as it is is never rebuilt, and a config object's fields are its model's)."""
    plan = inquiry.plan
    if plan.instance is not None or plan.config_argument is not None:
        return
    capabilities, notes = inquiry.capabilities, inquiry.notes
    name = softcap_argument(plan.cls) if inquiry.layout is not None else None
    if name is not None:
        capabilities.set(configured=(*capabilities.caps.configured, (Setting.SOFTCAP, name)))
        notes.append(f"{name}: a logit softcap setting of its constructor; configuration "
                     "builds it with another value and checks that the logits follow")
    encoding = capabilities.caps.position.encoding
    rotary = encoding is not None and encoding.rotary is not None
    for named, argument, switch in followed_arguments(plan.cls, _taken(inquiry)):
        if named.setting is Setting.THETA and not rotary:
            continue  # no RoPE found: the position step says what a RoPE name suggests
        if switch is not None:
            notes.append(f"{argument}: {named.words}, left as built: {switch} is off by "
                         "default, so it is not varied")
            continue
        capabilities.set(configured=(*capabilities.caps.configured, (named.setting, argument)))
        notes.append(f"{argument}: {named.words}; configuration builds it with two other values "
                     "and checks that the output follows")
