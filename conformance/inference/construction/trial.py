"""Required constructor arguments that no role name explains, filled by trial and read by
behaviour.

A name orders nothing here: each such argument is given integer values until the class builds
and its forward runs, and what the argument does is then measured:

- **the model width**, where no argument is known to set it: built with 8 and with 16, it takes
  inputs that wide and returns outputs that wide (d2l's ``num_hiddens``, a ``model_width``);
- **heads**, where no argument is known to set the head count: built with 1, 2 and 4 at width
  8, its attention core (observed inside the forward) computes that many maps per sequence;
- **key/value heads**: with 4 query heads it builds for 1, 2 and 4 and for nothing that does not
  divide the head count, and the parameters grow with it (a count of key/value heads) or shrink
  with it (query heads per key/value head, a group size);
- **context**: built with 4, a call of 4 tokens runs and one of 6 fails, and built with 512 the
  call of 6 runs (a preallocated length: set to the longest sequence generated);
- anything else keeps the first value that builds and runs, and the report says so.

An argument no integer fills (a vocabulary object, a config) is left to a declaration, in one line.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import torch

from conformance.inference.names.roles import ConstructorRoles
from conformance.inference.plan import INSTANCE_ROUTE, SIZES_REMEDY, InferenceError, Plan, output_of, runs
from conformance.model.core import maps_per_sequence
from conformance.model.spec import Config
from conformance.subject.attention_core import sites
from conformance.subject.core_trace import CoreTracer

VALUES = (4, 1, 2, 8, 16, 64, 512)
"""Integers tried, in order: the probe's head count and its divisors first, then lengths."""

HEADS, HEAD_DIM = 4, 4
"""The probe configuration: 4 heads (divisors 1, 2, 4 tell key/value heads apart) of width 4."""

MAX_UNKNOWN = 2
"""Most unknown arguments filled jointly (7 values each: 49 builds at most)."""


@dataclass(frozen=True)
class Filled:
    """What trial found for one argument: its role ("kv_heads", "kv_group", "context", or
    None for unknown), the value it keeps where the role does not set it, and the evidence."""

    argument: str
    role: str | None
    value: int
    evidence: str


def _runs(plan: Plan, values: dict[str, int], heads: int = HEADS, length: int = 3) -> bool:
    config = Config(batch=2, q_len=length, kv_len=length, d_model=heads * HEAD_DIM,
                    num_heads=heads)
    return runs(replace(plan, init=(*plan.init, *values.items())), config)


def _parameters(plan: Plan, values: dict[str, int]) -> int | None:
    config = Config(batch=2, q_len=3, kv_len=3, d_model=HEADS * HEAD_DIM, num_heads=HEADS)
    try:
        module = replace(plan, init=(*plan.init, *values.items())).instantiate(config)
    except Exception:  # the constructor refuses these values
        return None
    return sum(p.numel() for p in module.parameters()) if isinstance(module, torch.nn.Module) \
        else None


WIDTHS = (8, 16)
"""The widths a width argument is tried at (both divisible by the probe's 4 heads)."""

HEAD_TRIALS = (1, 2, 4)
"""The head counts a head-count argument is tried at, at width 8."""


def output_width(plan: Plan, values: dict[str, int], width: int) -> int | None:
    """The output's width when built with ``values`` and called on inputs ``width`` wide (of
    the one length it takes, where it takes one)."""
    length = plan.length or 3
    config = Config(batch=2, q_len=length, kv_len=length, d_model=width, num_heads=HEADS)
    output = output_of(replace(plan, init=(*plan.init, *values.items())), config)
    return int(output.shape[-1]) if output is not None and output.dim() else None


def core_maps(plan: Plan, values: dict[str, int], width: int) -> int | None:
    """The attention maps per sequence its core computes, built with ``values`` at ``width``,
    over every core site (a loop over heads computes one map a site); None where none is
    seen."""
    length = plan.length or 3
    config = Config(batch=2, q_len=length, kv_len=length, d_model=width, num_heads=1)
    tracer = CoreTracer()
    if not runs(replace(plan, init=(*plan.init, *values.items())), config, tracer):
        return None
    return maps_per_sequence(sites(tracer, q_len=length, kv_len=length), config.batch)


def _sizes(plan: Plan, argument: str, others: dict[str, int], width: str | None) -> Filled | None:
    """``argument`` as the model width (where none is known) or the head count (where none is
    known, at the known width), by behaviour; None where it is neither."""
    if width is None and all(output_width(plan, {**others, argument: w}, w) == w
                             for w in WIDTHS):
        return Filled(argument, "width", WIDTHS[0],
                      f"built with {WIDTHS[0]} and {WIDTHS[1]}, it takes inputs that wide and "
                      "returns outputs that wide")
    if width is not None and not plan.roles.heads:
        at = {width: WIDTHS[0]} if width in others or width == argument else {}
        counts = [core_maps(plan, {**others, **at, argument: h}, WIDTHS[0]) for h in HEAD_TRIALS]
        if counts == list(HEAD_TRIALS):
            return Filled(argument, "heads", HEAD_TRIALS[-1],
                          f"built with {', '.join(map(str, HEAD_TRIALS))}, its attention core "
                          "computes that many maps per sequence")
    return None


def _classify(plan: Plan, argument: str, others: dict[str, int],
              heads: bool, width: str | None = None) -> Filled | None:
    """The role of ``argument`` (the other unknown ones at ``others``; ``width`` the argument
    known to set the width, if any), or None where no value tried builds and runs."""
    def runs(value: int, **kwargs) -> bool:
        return _runs(plan, {**others, argument: value}, **kwargs)

    working = [v for v in VALUES if runs(v)]
    if not working:
        return None
    sized = _sizes(plan, argument, others, width)
    if sized is not None:
        return sized
    divisors = {v for v in VALUES if HEADS % v == 0}
    if heads and set(working) == divisors and runs(3, heads=6) and not runs(4, heads=6):
        small, large = (_parameters(plan, {**others, argument: v}) for v in (1, 2))
        if small is not None and large is not None and small != large:
            role = "kv_heads" if small < large else "kv_group"
            what = ("a count of key/value heads: the parameters grow with it" if role ==
                    "kv_heads" else "query heads per key/value head: the parameters shrink "
                    "as it grows")
            return Filled(argument, role, working[0],
                          f"builds for {', '.join(map(str, sorted(divisors)))} of {HEADS} heads "
                          f"and only for divisors of the head count; {what}")
    if runs(4, length=4) and not runs(4, length=6) and runs(512, length=6):
        return Filled(argument, "context", 512,
                      "a call longer than the value fails and one as long runs (built with 4: "
                      "4 tokens run, 6 do not; built with 512, 6 run)")
    return Filled(argument, None, working[0],
                  f"builds and runs with {working[0]} (of {', '.join(map(str, VALUES))}); what "
                  "it does is not measured")


def fill_by_trial(plan: Plan, label: str) -> tuple[Plan, list[str]]:
    """``plan`` with its roles' ``unknown`` arguments filled (a role, or a fixed value in
    ``init``), and a note for each; InferenceError where some can't be filled."""
    unknown = list(plan.roles.unknown)
    if not unknown:
        return plan, []
    bare = replace(plan, roles=replace(plan.roles, unknown=[]))
    joint = None
    if len(unknown) <= MAX_UNKNOWN:
        joint = next((dict(zip(unknown, values, strict=True))
                      for values in itertools.product(VALUES, repeat=len(unknown))
                      if _runs(bare, dict(zip(unknown, values, strict=True)))), None)
    if joint is None:
        raise InferenceError(
            f"{label}: can't fill constructor argument(s) {', '.join(unknown)}: no integer "
            f"tried ({', '.join(map(str, VALUES))}) builds it and runs its forward: give them "
            f"defaults, or name the argument that sets a size{INSTANCE_ROUTE}", SIZES_REMEDY)
    roles: ConstructorRoles = bare.roles
    init = dict(bare.init)
    notes = []
    # The width first: the head count is measured at a width.
    width = None if roles.width else next(
        (found for found in (_sizes(bare, name, _others(joint, name), None) for name in unknown)
         if found is not None), None)
    ordered = [width.argument] if width else []
    ordered += [name for name in unknown if name not in ordered]
    for argument in ordered:
        others = _others(joint, argument)
        filled = (width if width is not None and argument == width.argument else
                  _classify(replace(bare, roles=roles), argument, others, bool(roles.heads),
                            roles.width)) or Filled(
            argument, None, joint[argument], f"builds and runs with {joint[argument]}")
        if filled.role is not None and getattr(roles, filled.role) is None:
            roles = replace(roles, **{filled.role: argument})
            words = {"kv_heads": "key/value heads", "kv_group": "query heads per key/value "
                     "head", "context": "context length", "width": "the model width",
                     "heads": "the head count"}[filled.role]
            notes.append(f"{argument}: {words} (filled by trial, no name says so: "
                         f"{filled.evidence})")
        else:
            init[argument] = filled.value
            notes.append(f"{argument} = {filled.value} (filled by trial, no name says what it "
                         f"is: {filled.evidence})")
    return replace(bare, roles=roles, init=tuple(init.items())), notes


def _others(joint: dict[str, int], argument: str) -> dict[str, int]:
    return {name: value for name, value in joint.items() if name != argument}

