"""A role a name suggested, confirmed by behaviour or said to be unconfirmed.

The width a name gives is confirmed where, built with 8 and with 16, the module takes inputs
that wide (what width it returns is the output's role); the head count, where built with 1, 2 and 4 its
attention core (observed inside its forward) computes that many maps. Confirmed, nothing more is
said; contradicted, the note says what behaviour showed (a core not seen confirms nothing and
contradicts nothing).

A context length (``block_size``, ``max_seq_len``, ...) is confirmed where built with 4 a call
of 4 tokens runs and one of 6 raises, and built with 512 the call of 6 runs. Where instead it
changes what 8 tokens compute (built with 4 and with 512, the same parameters and inputs give
different outputs), it is no length the module takes but a size that shapes what each row sees
(a block-sparse layer's blocks, a chunk): built at 4, so that its structure shows inside the
generated lengths rather than one block covering them all. Where neither shows, the name's role
is kept and said to be unconfirmed.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import torch

from conformance.inference.construction.trial import HEAD_TRIALS, WIDTHS, core_maps, output_width
from conformance.inference.names.roles import ConstructorRoles
from conformance.inference.plan import InferenceError, Plan, output_of
from conformance.model.remedies import Remedy
from conformance.model.spec import Config
from conformance.numerics.tolerance import abs_error, reordering_tolerance

SMALL, LARGE = 4, 512
"""The values a context argument is tried with: below the probes' lengths, and the longest."""

STRUCTURE_LENGTH = 8
"""The length at which a structural size of SMALL shows (two blocks of 4)."""


def _built(plan: Plan, argument: str, value: int, heads: int) -> torch.nn.Module:
    config = Config(batch=2, q_len=STRUCTURE_LENGTH, kv_len=STRUCTURE_LENGTH, d_model=heads * 4,
                    num_heads=heads)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return replace(plan, init=(*plan.init, (argument, value))).instantiate(config)


def _output(plan: Plan, argument: str, value: int, length: int, heads: int) -> torch.Tensor | None:
    """The output of a build with ``argument`` = ``value`` on ``length`` tokens (seeded: two
    values compare on the same parameters and inputs), None where it raises."""
    config = Config(batch=2, q_len=length, kv_len=length, d_model=heads * 4, num_heads=heads)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return output_of(replace(plan, init=(*plan.init, (argument, value))), config)


def _same_parameters(plan: Plan, argument: str, heads: int) -> bool:
    """Whether builds with SMALL and LARGE have parameters of the same shapes (so the seeded
    builds hold the same values, and their outputs compare)."""
    try:
        small, large = (_built(plan, argument, value, heads) for value in (SMALL, LARGE))
    except Exception:  # a value the constructor refuses: nothing to compare
        return False
    return [tuple(p.shape) for p in small.parameters()] == [tuple(p.shape)
                                                            for p in large.parameters()]


def confirm_context(plan: Plan) -> tuple[Plan, list[str]]:
    """``plan`` with its name-suggested context argument confirmed, turned into a structural
    size built small, or kept unconfirmed; a note for each."""
    argument = plan.roles.context
    if argument is None or plan.instance is not None:
        return plan, []
    heads = 2 if plan.roles.heads else plan.fixed_heads
    if plan.fixed_width is not None and plan.fixed_width % heads:
        heads = 1
    if plan.fixed_width is not None and plan.fixed_width != heads * 4:
        return plan, []  # its width is its own: the trial's sizes don't build it

    def runs(value: int, length: int) -> bool:
        return _output(plan, argument, value, length, heads) is not None

    if runs(SMALL, SMALL) and not runs(SMALL, 6) and runs(LARGE, 6):
        return plan, [f"{argument}: context length (confirmed: built with {SMALL}, {SMALL} tokens "
                      f"run and 6 raise; built with {LARGE}, 6 run)"]
    small = _output(plan, argument, SMALL, STRUCTURE_LENGTH, heads)
    large = _output(plan, argument, LARGE, STRUCTURE_LENGTH, heads)
    if (small is not None and large is not None and small.shape == large.shape
            and _same_parameters(plan, argument, heads)
            and float(abs_error(small, large).max()) > reordering_tolerance(small.dtype, small)):
        roles = replace(plan.roles, context=None)
        plan = replace(plan, roles=roles, init=(*plan.init, (argument, SMALL)))
        return plan, [f"{argument} shapes what each row sees, not a length it takes (built with "
                      f"{SMALL} and with {LARGE}, {STRUCTURE_LENGTH} tokens run and give different "
                      f"outputs): built at {SMALL}, so that its structure shows in the generated "
                      "lengths"]
    return plan, [f"{argument}: context length by its name, unconfirmed (no length it refuses, "
                  "nothing measured depends on it)"]


def confirm_sizes(plan: Plan, named: ConstructorRoles, declared_width: str | None = None,
                  label: str = "") -> list[str]:
    """Notes where the width or head count ``named`` gives (by names, not by trial) is not what
    the module does (see the module's docstring); none where it is. A ``declared_width`` that
    the constructor takes only through ``**kwargs`` and that sets no width it takes is a
    declaration that does not fit: InferenceError, in one line."""
    if plan.instance is not None:
        return []
    notes = []
    width, heads = named.width, named.heads
    if width and plan.roles.width == width:
        if width == declared_width and swallowed(plan.cls, width):
            outputs = [output_width(plan, {}, w) for w in SWALLOWED_WIDTHS]
            ignored = _ignored(outputs)
            if ignored:
                raise InferenceError(
                    f"{label}: the width argument declared, {width!r}, sets no width: the "
                    f"constructor has no argument {width!r}, only **kwargs, which takes it and "
                    f"ignores it (built with {width}={', '.join(map(str, SWALLOWED_WIDTHS))}, "
                    f"{ignored}); its arguments: {', '.join(named_parameters(plan.cls))}",
                    Remedy.to("width_arg", None, "name the argument that sets the width"))
        refused = [w for w in WIDTHS if output_width(plan, {}, w) is None]
        if refused:
            notes.append(f"{width}: the model width by its name, unconfirmed (built with "
                         f"{' and '.join(map(str, refused))}, inputs that wide raise)")
    if heads and plan.roles.heads == heads and width:
        counts = [core_maps(plan, {heads: h}, WIDTHS[0]) for h in HEAD_TRIALS]
        if None not in counts and counts != list(HEAD_TRIALS):
            notes.append(f"{heads}: the head count by its name, unconfirmed (built with "
                         f"{', '.join(map(str, HEAD_TRIALS))}, its attention core computes "
                         f"{', '.join(map(str, counts))} maps per sequence)")
    return notes


SWALLOWED_WIDTHS = (8, 16, 32)
"""The widths a declared width argument that only ``**kwargs`` takes is built with: one that
sets the width runs at each (a module refuses some widths, but not all of three doublings)."""


def _ignored(outputs: list[int | None]) -> str | None:
    """How the outputs at each of SWALLOWED_WIDTHS show that the width was not set, in words:
    no build runs, or those that run all give one width; None where the outputs follow it."""
    ran = [(width, out) for width, out in zip(SWALLOWED_WIDTHS, outputs, strict=True)
           if out is not None]
    if not ran:
        return "inputs that wide raise"
    if len({out for _, out in ran}) > 1:
        return None
    if len(ran) == 1:
        return f"it runs at {ran[0][0]} only"
    return f"its output is {ran[0][1]} wide at each"


def named_parameters(cls: type) -> list[str]:
    """The constructor's named parameters (not ``*args`` nor ``**kwargs``)."""
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def swallowed(cls: type, argument: str) -> bool:
    """Whether the constructor takes ``argument`` only through ``**kwargs``."""
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return False
    return (argument not in named_parameters(cls)
            and any(p.kind is p.VAR_KEYWORD for p in parameters))
