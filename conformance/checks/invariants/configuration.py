"""Configuration: a constructor setting the module takes changes what it computes as it says.

Property: for each constructor setting the module was found to have (``Capabilities.configured``:
RoPE's base theta, the share of each head RoPE turns), the module built with another value of it
(theta x 50, Llama 3's 500000 from 10000; the rotated share 1/2 from 1, or 1 from anything less)
agrees with the float64 reference whose RoPE has that value (the tolerance rule, from its own
weights), on a case where the references of the two values differ beyond that tolerance. A module
that ignores the value still agrees with the reference of the value it always uses: that is said.

Settings the other checks already generate through the configuration are theirs: the window
(``sliding_window`` builds every window it checks), the key/value heads (``kv_groups`` and the
gate read them from the weights of each configuration built).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import agree_with_reference, fmt, reference_applies
from conformance.checks.invariants.violation import CheckFailed, Violation
from conformance.generation.base_case import base_case
from conformance.generation.cases import dtype_name
from conformance.generation.strategies import wide_dtypes
from conformance.model.forms import Rotary, Setting
from conformance.model.spec import Capabilities

THETA_FACTOR = 50.0
"""The other theta, as a multiple of the module's: 10000 becomes 500000 (Llama 3's base)."""

LENGTH = 16
"""Tokens of the case: with 16 positions the last pairs' angles of theta 1e4 and 5e5 differ by
well over the float32 tolerance."""

WORDS = {Setting.ROPE_THETA: "RoPE's theta", Setting.ROTARY_FRACTION: "the share RoPE turns"}


def other_value(setting: Setting, rotary: Rotary) -> float:
    """The value the module is built with instead of its default."""
    if setting is Setting.ROPE_THETA:
        return rotary.theta * THETA_FACTOR
    return 0.5 if rotary.fraction == 1.0 else 1.0


def with_value(setting: Setting, rotary: Rotary, value: float) -> Rotary:
    """``rotary`` as the module turns with ``value`` of ``setting``."""
    if setting is Setting.ROPE_THETA:
        return replace(rotary, theta=value)
    return replace(rotary, fraction=value, dims=None)


class Configuration(Check):
    """Built with another value of a constructor setting, it computes with that value."""

    name = "configuration"
    applies = "a constructor setting to vary (a RoPE theta or rotated share)"
    title = "constructor settings are honoured: built with another RoPE theta or share, it turns so"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if not capabilities.configured:
            return "no constructor setting to vary (a RoPE theta or rotated share)"
        encoding = capabilities.position.encoding
        if not reference_applies(capabilities) or encoding is None or encoding.rotary is None:
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
        rotary = caps.position.encoding.rotary
        value = other_value(setting, rotary)
        if context.on_example is not None:
            context.on_example()
        instance = context.subject.instantiate(
            replace(case.config, settings=((argument, value),)), case.seed)
        inputs = case.inputs(caps.call)
        output = context.run(instance, inputs, case)
        weights = instance.read_weights()
        judged = context.judged(case.config.dtype)
        rows = context.rows(case)

        def seen(turning: Rotary):
            return agree_with_reference(output, weights, inputs, case, rows, judged=judged,
                                        encoding=replace(caps.position.encoding, rotary=turning))[0]

        asked, default = seen(with_value(setting, rotary, value)), seen(rotary)
        if asked.ok:
            if default.ok:  # the case can't tell the two values apart: nothing was shown
                context.observe(f"{argument}={value:g}: its output agrees with the reference "
                                f"of both values on a {case.q_len}-token case")
            return
        built = f"built with {argument}={value:g} (default {self._default(setting, rotary)})"
        if default.ok:
            violation = Violation(
                f"{built}, its output still agrees with the float64 reference of the default "
                f"(max error {fmt(default.max_error)}), not with {WORDS[setting]} = {value:g} "
                f"({asked.describe()}): the configured value is ignored",
                hint=f"is {argument} stored and never read (a value hard-coded where the "
                     "frequencies or the rotated dimensions are computed)?")
        else:
            violation = Violation(
                f"{built}, its output agrees with the float64 reference of neither value "
                f"(with {WORDS[setting]} = {value:g}: {asked.describe()}; with the default: "
                f"{default.describe()})",
                details=[f"measured in {dtype_name(dtype)} on {case.q_len} tokens"],
                hint=f"does {argument} change something other than {WORDS[setting]}?")
        raise CheckFailed(violation, case)

    @staticmethod
    def _default(setting: Setting, rotary: Rotary) -> str:
        return f"{rotary.theta if setting is Setting.ROPE_THETA else rotary.fraction:g}"
