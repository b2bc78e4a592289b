"""Configuration: a constructor setting the module takes changes what it computes as it says.

Property: for each constructor setting the module was found to have (``Capabilities.configured``:
RoPE's base theta, the share of each head RoPE turns, a logit softcap), the module built with
another value of it (theta x 50, Llama 3's 500000 from 10000; the rotated share 1/2 from 1, or 1
from anything less; a softcap of 0.5) agrees with the float64 reference computed with that value
(the tolerance rule, from its own weights), on a case where the references of the two values
differ beyond that tolerance. A module that ignores the value still agrees with the reference of
the value it always uses: that is said.

Settings the other checks already generate through the configuration are theirs: the window
(``sliding_window`` builds every window it checks), the key/value heads (``kv_groups`` and the
gate read them from the weights of each configuration built).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import agree_with_reference, fmt, reference_applies
from conformance.checks.invariants.violation import CheckFailed, Lacking, Violation
from conformance.generation.base_case import base_case
from conformance.generation.cases import dtype_name
from conformance.generation.strategies import wide_dtypes
from conformance.model.forms import PositionEncoding, Setting
from conformance.model.spec import Capabilities

THETA_FACTOR = 50.0
"""The other theta, as a multiple of the module's: 10000 becomes 500000 (Llama 3's base)."""

SOFTCAP_TRIED = 0.5
"""The softcap a layer is built with: far under a case's logits (about 1), so capped logits
differ from uncapped ones, or from those of its default cap, beyond any tolerance."""

LENGTH = 16
"""Tokens of the case: with 16 positions the last pairs' angles of theta 1e4 and 5e5 differ by
well over the float32 tolerance."""

WORDS = {Setting.ROPE_THETA: "RoPE's theta", Setting.ROTARY_FRACTION: "the share RoPE turns",
         Setting.SOFTCAP: "the logit softcap"}
ROTARY_SETTINGS = (Setting.ROPE_THETA, Setting.ROTARY_FRACTION)


def other_value(setting: Setting, encoding: PositionEncoding) -> float:
    """The value the module is built with instead of its default."""
    if setting is Setting.SOFTCAP:
        return SOFTCAP_TRIED if encoding.softcap != SOFTCAP_TRIED else 2 * SOFTCAP_TRIED
    rotary = encoding.rotary
    if setting is Setting.ROPE_THETA:
        return rotary.theta * THETA_FACTOR
    return 0.5 if rotary.fraction == 1.0 else 1.0


def with_value(setting: Setting, encoding: PositionEncoding, value: float) -> PositionEncoding:
    """``encoding`` as the module computes with ``value`` of ``setting``."""
    if setting is Setting.SOFTCAP:
        return replace(encoding, softcap=value if value > 0 else None)
    rotary = encoding.rotary
    if setting is Setting.ROPE_THETA:
        return replace(encoding, rotary=replace(rotary, theta=value))
    return replace(encoding, rotary=replace(rotary, fraction=value, dims=None))


def default_value(setting: Setting, encoding: PositionEncoding) -> str:
    """The value it computes with by default, in words."""
    if setting is Setting.SOFTCAP:
        return "none applied" if encoding.softcap is None else f"{encoding.softcap:g}"
    rotary = encoding.rotary
    return f"{rotary.theta if setting is Setting.ROPE_THETA else rotary.fraction:g}"


HINTS = {Setting.SOFTCAP: "is {argument} stored and never passed on (a cap of 0 or None "
                          "hard-coded where the logits are computed)?"}
"""Why a setting is ignored, where RoPE's hint (below) does not say it."""
ROTARY_HINT = ("is {argument} stored and never read (a value hard-coded where the frequencies "
               "or the rotated dimensions are computed)?")


class Configuration(Check):
    """Built with another value of a constructor setting, it computes with that value."""

    name = "configuration"
    applies = "a constructor setting to vary (a RoPE theta or rotated share, a logit softcap)"
    title = ("constructor settings are honoured: built with another RoPE theta or share, or "
             "softcap, it computes so")

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if not capabilities.configured:
            return Lacking("no constructor setting to vary (a RoPE theta or rotated share, a "
                           "softcap)")
        encoding = capabilities.position.encoding
        if not reference_applies(capabilities):
            return "needs weight access and a computation the reference models"
        rotary = any(setting in ROTARY_SETTINGS for setting, _ in capabilities.configured)
        if rotary and (encoding is None or encoding.rotary is None):
            return "needs weight access and the RoPE the reference models"
        if not wide_dtypes(capabilities):
            return "run in float32 or float64, and it declares neither"
        return None

    def run(self, context: CheckContext) -> None:
        for setting, argument in context.capabilities.configured:
            self.verify(context, setting, argument)

    def verify(self, context: CheckContext, setting: Setting, argument: str) -> None:
        caps = context.capabilities
        dtype = torch.float64 if torch.float64 in caps.floats.supported else torch.float32
        length = caps.length_near(LENGTH)
        case = base_case(caps, dtype, context.device, q_len=length, kv_len=length,
                         causal=caps.causality.kind == "always")
        encoding = caps.position.encoding or PositionEncoding()
        value = other_value(setting, encoding)
        if context.on_example is not None:
            context.on_example()
        instance = context.subject.instantiate(
            replace(case.config, settings=((argument, value),)), case.seed)
        inputs = case.inputs(caps.call)
        output = context.run(instance, inputs, case)
        weights = instance.read_weights()
        judged = context.judged(case.config.dtype)
        rows = context.rows(case)

        def seen(computed: PositionEncoding):
            return agree_with_reference(output, weights, inputs, case, rows, judged=judged,
                                        encoding=computed)[0]

        asked, default = seen(with_value(setting, encoding, value)), seen(encoding)
        if asked.ok:
            if default.ok:  # the case can't tell the two values apart: nothing was shown
                context.observe(f"{argument}={value:g}: its output agrees with the reference "
                                f"of both values on a {case.q_len}-token case")
            return
        built = f"built with {argument}={value:g} (default {default_value(setting, encoding)})"
        if default.ok:
            violation = Violation(
                f"{built}, its output still agrees with the float64 reference of the default "
                f"(max error {fmt(default.max_error)}), not with {WORDS[setting]} = {value:g} "
                f"({asked.describe()}): the configured value is ignored",
                hint=HINTS.get(setting, ROTARY_HINT).format(argument=argument))
        else:
            violation = Violation(
                f"{built}, its output agrees with the float64 reference of neither value "
                f"(with {WORDS[setting]} = {value:g}: {asked.describe()}; with the default: "
                f"{default.describe()})",
                details=[f"measured in {dtype_name(dtype)} on {case.q_len} tokens"],
                hint=f"does {argument} change something other than {WORDS[setting]}?")
        raise CheckFailed(violation, case)
