"""Configuration: a constructor setting the module takes changes what it computes as it says.

Property: for each constructor setting the module was found to have (``Capabilities.configured``)
that the float64 reference models (RoPE's base theta, the share of each head RoPE turns, a logit
softcap), the module built with another value of it (theta x 50, Llama 3's 500000 from 10000;
the rotated share 1/2 from 1, or 1 from anything less; a softcap of 0.5) agrees with the float64
reference computed with that value (the tolerance rule, from its own weights), on a case where
the references of the two values differ beyond that tolerance. A module that ignores the value
still agrees with the reference of the value it always uses: that is said.

For each other setting that claims to change attention (a temperature, a window on a layer not
checked as causally windowed, a RoPE base measured per width, a sink count), the module built
with two values of it (same weights' seed, same inputs) gives outputs that differ in at least one
element, in some way of calling it the module takes (causal and not, where it takes both). Two
values with bit-identical outputs are a setting that changes nothing: FAIL, except a sink count,
which may act only where a window or a cache drops the other keys (WARN).

Settings the other checks already generate through the configuration are theirs: the window
(``sliding_window`` builds every window it checks), the key/value heads (``kv_groups`` and the
gate read them from the weights of each configuration built).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import agree_with_reference, fmt, reference_applies
from conformance.checks.invariants.violation import (
    CheckFailed,
    Finding,
    Lacking,
    NotApplicable,
    Violation,
)
from conformance.generation.base_case import base_case, base_pair
from conformance.generation.cases import dtype_name
from conformance.generation.strategies import wide_dtypes
from conformance.model.forms import PositionEncoding, Setting
from conformance.model.spec import Capabilities
from conformance.subject.boundary import ImplementationError

THETA_FACTOR = 50.0
"""The other theta, as a multiple of the module's: 10000 becomes 500000 (Llama 3's base)."""

SOFTCAP_TRIED = 0.5
"""The softcap a layer is built with: far under a case's logits (about 1), so capped logits
differ from uncapped ones, or from those of its default cap, beyond any tolerance."""

LENGTH = 16
"""Tokens of the case: with 16 positions the last pairs' angles of theta 1e4 and 5e5 differ by
well over the float32 tolerance."""

HEAD_WIDTHS = (16, 32)
"""The head widths a setting held to changing the output is tried at (or the buildable ones
nearest), the second only where the first showed no change: wide enough that a partial RoPE
turns some dimensions (a quarter of 16 is 4), where the gate's 4 may leave it none."""

WORDS = {Setting.ROPE_THETA: "RoPE's theta", Setting.ROTARY_FRACTION: "the share RoPE turns",
         Setting.SOFTCAP: "the logit softcap", Setting.TEMPERATURE: "the temperature",
         Setting.WINDOW: "the window", Setting.THETA: "RoPE's base",
         Setting.SINK: "the sink count"}

TRIED = {Setting.TEMPERATURE: (0.25, 4.0), Setting.WINDOW: (2, 6), Setting.THETA: (100.0, 1e6),
         Setting.SINK: (1, 4)}
"""The two values a setting held to changing the output is built with. Each pair changes a
16-token case wherever the setting acts: a temperature 16 times another reweights every row;
windows of 2 and 6 keys both cut rows of 16 keys, differently; bases of 100 and 1e6 turn
position 15 by angles far apart; 1 and 4 sinks keep different keys."""

WARNED = frozenset({Setting.SINK})
"""Settings that may act only where a window or a cache drops keys (a StreamingLLM sink count
keeps tokens an eviction would drop): one that changes a full forward nothing is said, not
failed."""
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
                          "hard-coded where the logits are computed)?",
         Setting.TEMPERATURE: "is {argument} stored and never applied to the logits (a "
                              "temperature of 1 hard-coded)?",
         Setting.WINDOW: "is {argument} stored and never used to build the mask (a window "
                         "applied only on another path, or not at all)?",
         Setting.THETA: "is {argument} stored and never read (a base hard-coded where the "
                        "frequencies are computed)?",
         Setting.SINK: "does {argument} act only where a window or a cache drops keys? If the "
                       "sinks are meant to change a full forward, they are not applied"}
"""Why a setting is ignored, where RoPE's hint (below) does not say it."""
ROTARY_HINT = ("is {argument} stored and never read (a value hard-coded where the frequencies "
               "or the rotated dimensions are computed)?")


def _pairs(caps: Capabilities) -> list[tuple[int, int]]:
    """(heads, head width) of the buildable configurations nearest each of HEAD_WIDTHS."""
    heads = base_pair(caps)[0]
    if caps.shapes is None:
        return [(heads, width) for width in HEAD_WIDTHS]
    pairs = [min(caps.shapes, key=lambda p, w=width: (abs(p[1] - w), abs(p[0] - heads), p))
             for width in HEAD_WIDTHS]
    return list(dict.fromkeys(pairs))


class Configuration(Check):
    """Built with another value of a constructor setting, it computes with that value."""

    name = "configuration"
    order = 250
    applies = ("a constructor setting to vary (a RoPE theta or rotated share, a logit softcap, a "
               "temperature, a window, a sink count)")
    title = ("constructor settings are honoured: built with another RoPE theta or share, "
             "softcap, temperature, window or sink count, it computes so")

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if not capabilities.configured:
            return Lacking("no constructor setting to vary (a RoPE theta or rotated share, a "
                           "softcap, a temperature, a window, a sink count)")
        if any(not setting.modelled for setting, _ in capabilities.configured):
            return None
        return self.unmodelled(capabilities)

    @staticmethod
    def unmodelled(capabilities: Capabilities) -> str | None:
        """Why the settings the reference models can't be held to it, or None."""
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
        why = self.unmodelled(context.capabilities)
        unjudged = []
        for setting, argument in context.capabilities.configured:
            if not setting.modelled:
                refused = self.followed(context, setting, argument)
                if refused is not None:
                    unjudged.append(refused)
            elif why is None:
                self.verify(context, setting, argument)
            else:
                unjudged.append(f"{argument}: not held to the reference ({why})")
        for words in unjudged:
            context.observe(words)
        if len(unjudged) == len(context.capabilities.configured):
            raise NotApplicable("; ".join(unjudged))  # nothing was varied: no verdict

    def followed(self, context: CheckContext, setting: Setting, argument: str) -> str | None:
        """Two values of ``setting`` give outputs that differ somewhere, in some way of calling
        the module it takes; bit-identical outputs in every one fail (warn, for a sink). What
        kept it from being varied (a value refused), or None."""
        caps = context.capabilities
        supported = caps.floats.supported
        dtype = next((d for d in (torch.float64, torch.float32) if d in supported),
                     next(iter(supported)))
        length = caps.length_near(LENGTH)
        modes = {"never": (False,), "always": (True,)}.get(caps.causality.kind, (False, True))
        first, second = TRIED[setting]
        pairs = _pairs(caps)
        case = None
        for heads, head_dim in pairs:
            for causal in modes:
                case = base_case(caps, dtype, context.device, q_len=length, kv_len=length,
                                 causal=causal, num_heads=heads, head_dim=head_dim)
                inputs = case.inputs(caps.call)
                outputs = []
                for value in (first, second):
                    if context.on_example is not None:
                        context.on_example()
                    try:
                        instance = context.subject.instantiate(
                            replace(case.config, settings=((argument, value),)), case.seed)
                        outputs.append(context.run(instance, inputs, case))
                    except ImplementationError as error:
                        return (f"{argument}={value:g}: refused ({str(error)[:120]}); "
                                f"{WORDS[setting]} not varied")
                if not torch.equal(outputs[0], outputs[1]):
                    difference = (outputs[0].double() - outputs[1].double()).abs().max().item()
                    context.observe(f"{argument}={first:g} and {second:g}: outputs differ by up "
                                    f"to {fmt(difference)} ({'causal, ' if causal else ''}"
                                    f"{case.q_len} tokens, heads {head_dim} wide): followed")
                    return None
        ways = " and ".join("causal" if causal else "not causal" for causal in modes)
        widths = " and ".join(str(head_dim) for _, head_dim in pairs)
        violation = Violation(
            f"built with {argument}={first:g} and with {argument}={second:g}, its outputs are "
            f"identical, bit for bit ({ways}, {case.q_len} tokens, heads {widths} wide, "
            f"{dtype_name(dtype)}): "
            f"{WORDS[setting]} changes nothing it computes",
            severity="warn" if setting in WARNED else "fail",
            hint=HINTS[setting].format(argument=argument))
        if setting in WARNED:
            context.warnings.append(Finding(violation, case))
            return None
        raise CheckFailed(violation, case)

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
