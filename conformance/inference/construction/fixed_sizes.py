"""Sizes a module fixes itself, found by behaviour rather than by argument names.

- **The width**, where no constructor argument sets it and the constructor needs none: the
  module is built with no arguments and called with inputs as wide as each dimension of its own
  parameters; the width whose call returns (batch, length, that width) is the module's.
- **The head count**, where no constructor argument sets it: one head until the weights say
  otherwise. Where the weights found by their roles do not reproduce the output with one head,
  each head count the module builds for is tried; the one whose weights reproduce it is the
  module's (heads split differently give a different output on generic inputs, so at most one
  fits).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import torch

from conformance.generation.constraints import HEAD_COUNTS, HEAD_DIMS, Constraint, discover
from conformance.inference.inquiry import Inquiry
from conformance.inference.observing.probing import probe_case
from conformance.inference.plan import INSTANCE_ROUTE, SIZES_REMEDY, InferenceError, Plan, output_of
from conformance.inference.steps.behaviour import find_weights
from conformance.model.core import maps_per_sequence
from conformance.model.spec import Config
from conformance.subject.boundary import CapabilityError, ImplementationError

COMMON_FIRST = tuple(sorted(HEAD_COUNTS[1:], key=lambda h: (h not in (8, 4, 2), -h)))
"""The head counts tried, the common ones first (8, 4, 2, then 7, 6, 5, 3): an order only, the
weights decide; each count that does not reproduce the output costs a full weight search
(seconds), and most layers have 8, 4 or 2 heads."""

BATCH, LENGTH = 2, 5
"""The trial call's batch and length: distinct, so the output's shape says which is which."""


def fixed_width(plan: Plan, label: str) -> int | None:
    """The width of a module no constructor argument sets one of: the first of its parameters'
    dimensions (most frequent first) at which, built for that width (its other size arguments,
    a head width, following it), its forward returns (batch, length, width). None for a module
    with no parameters that takes inputs of any width (d2l's ``DotProductAttention``)."""
    try:
        module = plan.instantiate(Config(batch=BATCH, q_len=LENGTH, kv_len=LENGTH, d_model=1,
                                         num_heads=1))
    except Exception as error:  # its own constructor, whatever it raises
        raise InferenceError(f"{label}: no constructor argument names the model width, and "
                             f"building it raised {type(error).__name__}: "
                             f"{error}{INSTANCE_ROUTE}", SIZES_REMEDY) from error
    if isinstance(module, torch.nn.Module) and not list(module.parameters()) and all(
            _returns_width(plan, width) for width in ANY_WIDTH):
        return None
    sizes = Counter(size for parameter in module.parameters() for size in parameter.shape)
    tried = [size for size, _ in sorted(sizes.items(), key=lambda item: (-item[1], item[0]))]
    for width in tried:
        if _returns_width(plan, width):
            return width
    sizes_words = ", ".join(str(size) for size in tried[:6]) or "none: it has no parameters"
    raise InferenceError(f"{label}: no constructor argument names the model width, and its "
                         f"forward takes none of its parameters' sizes "
                         f"({sizes_words}){INSTANCE_ROUTE}", SIZES_REMEDY)


ANY_WIDTH = (4, 6)
"""The widths a module with no parameters must take to take any width."""

def _returns_width(plan: Plan, width: int) -> bool:
    """Whether built for ``width`` (one head) its forward returns (batch, length, width) for
    inputs that wide."""
    output = output_of(plan, Config(batch=BATCH, q_len=LENGTH, kv_len=LENGTH, d_model=width,
                                    num_heads=1))
    return output is not None and tuple(output.shape) in ((BATCH, LENGTH, width),
                                                          (LENGTH, BATCH, width))


def width_constraint(plan: Plan) -> Constraint:
    """The configurations a module of fixed width builds for: at its head count, or at each
    count a head-count argument builds it for that divides the width."""
    width = plan.fixed_width
    if plan.roles.heads:
        pairs = tuple((h, width // h) for h in HEAD_COUNTS if width % h == 0
                      and plan.builds(h, width // h))
        if pairs:
            return Constraint(pairs, f"d_model {width}, fixed by the module, "
                                     f"{'/'.join(str(h) for h, _ in pairs)} heads")
    heads = plan.fixed_heads
    return Constraint(((heads, width // heads),), f"d_model {width}, fixed by the module")


def hidden_heads(inquiry: Inquiry) -> tuple[int, Inquiry] | None:
    """The head count a module with no head-count argument computes with, where its weights
    reproduce its output with that many heads (see the module's docstring): the count, and the
    weight step tried at it (its configurations, layout, outcome and notes; its capabilities,
    adopted by ``inquiry``'s); None where no count does.
    """
    plan = inquiry.plan
    for heads in COMMON_FIRST:
        if plan.fixed_width is not None:
            if plan.fixed_width % heads:
                continue
            plan.fixed_heads = heads
            candidate: Constraint | None = width_constraint(plan)
        else:
            try:
                candidate = discover(plan.builds, heads=heads)
            except ValueError:
                continue  # builds for no width at this count: not a count to try
            plan.fixed_heads = heads
            if candidate is None:  # every head width builds: the weight step reads the count here
                candidate = Constraint(tuple((heads, d) for d in HEAD_DIMS),
                                       f"{heads} heads, fixed by the module")
        tried = replace(inquiry, capabilities=inquiry.capabilities.fork(), notes=[],
                        constraint=candidate)
        find_weights(tried)
        if tried.layout is not None and tried.outcome.reproduced:
            inquiry.capabilities.adopt(tried.capabilities)
            return heads, tried
    plan.fixed_heads = 1
    return None


def core_heads(inquiry: Inquiry) -> int | None:
    """The attention maps per sequence the module's core computes on the probe (observed inside
    its forward): its head count, where no weights say it (a module whose output no assignment
    reproduces at any count, a scale bug's, still computes its heads); None where no core is
    seen."""
    case = probe_case(inquiry.heads, inquiry.head_dim, kept=None)
    try:
        seen = inquiry.probe.observe(case.inputs(inquiry.plan.convention.call))
    except (ImplementationError, CapabilityError):
        return None
    return maps_per_sequence(seen.sites, case.batch)
