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

import inspect
from collections import Counter
from dataclasses import replace

import torch

from conformance.generation.constraints import HEAD_COUNTS, HEAD_DIMS, Constraint, discover
from conformance.inference.inquiry import Inquiry
from conformance.inference.plan import SIZES_REMEDY, InferenceError, Plan, first_call
from conformance.inference.steps.behaviour import find_weights
from conformance.model.spec import Config

COMMON_FIRST = tuple(sorted(HEAD_COUNTS[1:], key=lambda h: (h not in (8, 4, 2), -h)))
"""The head counts tried, the common ones first (8, 4, 2, then 7, 6, 5, 3): an order only, the
weights decide; each count that does not reproduce the output costs a full weight search
(seconds), and most layers have 8, 4 or 2 heads."""

BATCH, LENGTH = 2, 5
"""The trial call's batch and length: distinct, so the output's shape says which is which."""


def needs_no_arguments(cls: type) -> bool:
    """Whether ``cls()`` is a call its constructor's signature accepts."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in parameters)


def fixed_width(plan: Plan, label: str) -> int:
    """The width of a module built with no arguments: the first of its parameters' dimensions
    (most frequent first) at which its forward returns (batch, length, width)."""
    try:
        module = plan.instantiate(Config(batch=BATCH, q_len=LENGTH, kv_len=LENGTH, d_model=1,
                                         num_heads=1))
    except Exception as error:  # its own constructor, whatever it raises
        raise InferenceError(f"{label}: no constructor argument names the model width, and "
                             f"built with no arguments it raised {type(error).__name__}: "
                             f"{error}") from error
    sizes = Counter(size for parameter in module.parameters() for size in parameter.shape)
    tried = [size for size, _ in sorted(sizes.items(), key=lambda item: (-item[1], item[0]))]
    for width in tried:
        config = Config(batch=BATCH, q_len=LENGTH, kv_len=LENGTH, d_model=width, num_heads=1)
        try:
            output = first_call(plan, config)
        except Exception:  # not this width: the forward's own error, whatever it raises
            continue
        if isinstance(output, tuple) and output:
            output = output[0]
        if isinstance(output, torch.Tensor) and tuple(output.shape) in (
                (BATCH, LENGTH, width), (LENGTH, BATCH, width)):
            return width
    sizes_words = ", ".join(str(size) for size in tried[:6]) or "none: it has no parameters"
    raise InferenceError(f"{label}: no constructor argument names the model width, and built "
                         f"with no arguments its forward takes none of its parameters' sizes "
                         f"({sizes_words})", SIZES_REMEDY)


def width_constraint(plan: Plan) -> Constraint:
    """The one configuration a module of fixed width builds for, at its head count."""
    heads = plan.fixed_heads
    return Constraint(((heads, plan.fixed_width // heads),),
                      f"d_model {plan.fixed_width}, fixed by the module")


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
