"""Inference steps about building and calling the class: its constructor's roles, its forward's
convention, the configurations it builds for, the form of its output and of its inputs."""

from __future__ import annotations

import inspect

import torch

from conformance.generation.constraints import HEAD_COUNTS, HEAD_DIMS, Constraint, describe, discover
from conformance.inference.calls.variadic_call import variadic
from conformance.inference.construction.config_object import config_argument
from conformance.inference.construction.fixed_sizes import width_constraint
from conformance.inference.inquiry import Inquiry
from conformance.inference.names.convention import ForwardConvention, mask_family, read_forward
from conformance.inference.names.roles import ConstructorRoles, read_roles, roles_named
from conformance.inference.observing.probe_length import probe_length
from conformance.inference.observing.probing import probe_case, sequence_first
from conformance.inference.plan import (
    CALL_REMEDY,
    INSTANCE_ROUTE,
    PREFIX,
    SIZES_REMEDY,
    ConfigArgument,
    InferenceError,
    Plan,
    declarations_read,
    first_call,
)
from conformance.inference.steps.latent import own_query_count
from conformance.model.declarations import Declarations
from conformance.model.remedies import Note, Remedy
from conformance.model.spec import Config
from conformance.model.weights import WeightLayout
from conformance.subject.output_shape import output_problem


def _takes(cls: type, role: str, argument: str, label: str) -> None:
    """An InferenceError where ``argument``, declared for ``role``, is no argument of ``cls``'s
    constructor: said as such, never as the undeclared case's message again."""
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):  # a constructor without a signature: nothing to hold it to
        return
    names = [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if argument in names or any(p.kind is p.VAR_KEYWORD for p in parameters):
        return
    raise InferenceError(f"{label}: the {role.replace('_', ' ')} argument declared, "
                         f"{argument!r}, is not an argument of its constructor (it takes "
                         f"{', '.join(names) or 'none'})", SIZES_REMEDY)


def constructor_roles(cls: type, declared: Declarations,
                      label: str) -> tuple[ConstructorRoles, ConfigArgument | None]:
    """The roles of the constructor's arguments, and of the fields of a config object it takes
    (read by behaviour: see :mod:`conformance.inference.construction.config_object`)."""
    roles = read_roles(cls)
    with declarations_read():
        stated_window = declared.window()
    for role, argument in (("width", declared.width_arg), ("heads", declared.heads_arg),
                           ("head_dim", declared.head_dim_arg),
                           ("kv_heads", declared.kv_heads_arg),
                           ("window", stated_window[0] if stated_window else None),
                           ("chunk", declared.chunk_arg)):
        if argument:
            _takes(cls, role, argument, label)
            if argument in roles.unknown:
                roles.unknown.remove(argument)
            setattr(roles, role, argument)
    config = None
    if roles.width is None and roles.unknown:
        config = config_argument(cls)
        if config is not None:
            roles.unknown.remove(config.argument)
            roles = roles_named([(field, False) for field in config.fields], PREFIX, roles)
    return roles, config


def forward_convention(cls: type, declared: Declarations, label: str) -> ForwardConvention:
    convention = read_forward(cls.forward)
    if not convention.inputs and not declared.call and not variadic(cls.forward):
        raise InferenceError(f"{label}: forward takes no input tensor (none of x; q, k, v; query, "
                             "key, value)", CALL_REMEDY)
    if declared.call:
        convention.call = declared.call
        convention.call_guessed = False
        convention.inputs = (convention.inputs[:1] if declared.call in ("self", "latent") else
                             (*convention.inputs, "context")[:2] if declared.call == "cross"
                             else (*convention.inputs, "k", "v")[:3])
        convention.by_keyword = False
    with declarations_read():
        argument = declared.mask_argument
    if argument:
        convention.mask, convention.mask_family = argument, mask_family(argument)
    return convention


def positional_arguments(roles: ConstructorRoles, declared: Declarations, label: str) -> tuple[str, ...]:
    """The arguments a declared positional constructor takes by position: the width, then the
    head count (an assignment's ``MultiHeadAttention(d_model, num_heads)``)."""
    with declarations_read():
        form = declared.choice("constructor", ("keyword", "positional"))
    if form != "positional":
        return ()
    if roles.width is None:
        raise InferenceError(f"{label}: a positional constructor needs the width argument",
                             Remedy.to("width_arg", None, "name it"))
    return tuple(name for name in (roles.width, roles.heads) if name)


def build_constraint(inquiry: Inquiry) -> None:
    """The configurations it builds and runs for; where the forward runs for none (a basic call
    that always fails: the gate's to report), those it builds for."""
    inquiry.constraint = _built_for(inquiry.plan, inquiry.label, inquiry.notes)


def _built_for(plan: Plan, label: str, notes: list[str | Note]) -> Constraint | None:
    if plan.fixed_width is not None:
        constraint = width_constraint(plan)
        notes.append(f"{constraint.describe()} (probed)")
        return constraint
    heads = plan.head_count()
    try:
        constraint = discover(plan.builds, heads=heads)
    except ValueError:
        constraint = None
    else:
        if constraint is not None:
            notes.append(f"{constraint.describe()} (probed)")
        return constraint
    try:
        constraint = discover(plan.constructs, heads=heads)
    except ValueError:
        config = Config(batch=2, q_len=5, kv_len=5, d_model=8, num_heads=2 if plan.roles.heads
                        else 1)
        try:
            plan.instantiate(config)
        except Exception as error:
            raise InferenceError(f"{label}: constructing it raised {type(error).__name__}: "
                                 f"{error} for every generated configuration{INSTANCE_ROUTE}"
                                 ) from error
        raise InferenceError(f"{label}: constructing it failed for every generated "
                             f"configuration{INSTANCE_ROUTE}") from None
    if constraint is not None:
        notes.append(f"{constraint.describe()} (probed)")
    return constraint


def layout_constraint(inquiry: Inquiry) -> None:
    """The configurations where the weight layout also reads the module, heads of the right
    width: a layout that changes form at some head count (x-transformers has no output
    projection at one head) limits them as a constructor that refuses them would."""
    inquiry.constraint = _layout_reads(inquiry.plan, inquiry.layout, inquiry.constraint,
                                       inquiry.notes)


def _layout_reads(plan: Plan, layout: WeightLayout | None, constraint: Constraint | None,
                  notes: list[str | Note]) -> Constraint | None:
    if layout is None or plan.fixed_width is not None:
        return constraint
    allowed = set(constraint.pairs) if constraint else None

    def reads(heads: int, head_dim: int) -> bool:
        if allowed is not None and (heads, head_dim) not in allowed:
            return False
        config = Config(batch=2, q_len=3, kv_len=3, d_model=heads * head_dim, num_heads=heads)
        try:
            weights = layout.read(plan.construct(config), heads)
        except Exception:  # the constructor, or the layout's reading: not this configuration
            return False
        return tuple(weights.w_q.shape[:2]) == (heads, head_dim)

    try:
        found = discover(reads, heads=plan.head_count())
    except ValueError:
        return constraint  # nowhere: the gate reports the weights as broken
    if found is None or (constraint is not None and found.pairs == constraint.pairs):
        return constraint
    notes.append(f"its weights read as found only with {found.words}: generating those "
                 "configurations (probed)")
    return found


def encoding_constraint(inquiry: Inquiry) -> None:
    """Without the head widths where no position-encoding hypothesis reproduces the output:
    RoPE is defined on pairs of dimensions, and a library that runs at head_dim 1 rotates
    nothing a reference can be held to; left out as a constructor that refused them would be,
    and said (a warning of ``reference``)."""
    plan, constraint = inquiry.plan, inquiry.constraint
    widths = inquiry.outcome.unexplained_widths
    if not widths:
        return
    grid = [(h, d) for h in (HEAD_COUNTS if plan.roles.heads else (plan.fixed_heads,))
            for d in HEAD_DIMS]
    allowed = {p for p in (constraint.pairs if constraint else grid) if p[1] not in widths}
    if not allowed:
        return
    doubt = (f"at head width(s) {list(widths)} no RoPE hypothesis (half-split or interleaved "
             "pairs, any theta or rotated fraction) reproduces its output: RoPE is undefined "
             "there, so those widths are left out of generation")
    inquiry.capabilities.doubt(encoding=doubt)
    inquiry.notes.append(doubt + " (see reference)")
    inquiry.constraint = Constraint(tuple(sorted(allowed)), describe(allowed, grid))


def probe_sizes(inquiry: Inquiry) -> None:
    """The probes' sizes (:func:`probe_pair`) for the configurations found, and their
    configuration."""
    inquiry.heads, inquiry.head_dim = heads, head_dim = probe_pair(inquiry.plan, inquiry.constraint)
    length = probe_length(6)
    inquiry.config = Config(batch=2, q_len=length, kv_len=length, d_model=heads * head_dim,
                            num_heads=heads)


def probe_pair(plan: Plan, constraint: Constraint | None) -> tuple[int, int]:
    """The probes' (num_heads, head_dim): 2 heads of 4 (1 of 4 single-head), or the buildable
    pair nearest to it."""
    preferred = (2 if plan.roles.heads else plan.fixed_heads, 4)
    if constraint is None or preferred in constraint.pairs:
        return preferred
    return min(constraint.pairs, key=lambda p: (abs(p[0] - preferred[0]) + abs(p[1] - 4), p))


def output_form(inquiry: Inquiry) -> None:
    """Whether forward returns a tuple (its first element is then the output, unless it is
    declared to return one tensor), and whether an output-width argument is per head."""
    plan, config, notes = inquiry.plan, inquiry.config, inquiry.notes
    with declarations_read():  # read once already, where infer reads the declarations
        returns = inquiry.declared.choice("returns", ("tensor", "tuple"))
    try:
        first = first_call(plan, config)
    except Exception as error:  # the gate reports a broken basic call; inference goes on
        notes.append(f"calling it as {plan.convention.describe()} without a mask raised "
                     f"{type(error).__name__}: whether it returns one tensor or a tuple is not known "
                     "from it (the checks report the failing call)")
        return
    if isinstance(first, tuple) and returns == "tensor":
        notes.append("forward returns a tuple, but it is declared to return one tensor: the "
                     "gate fails on it")
        return
    if isinstance(first, tuple):
        plan.tuple_output = True
        first = first[0]
        notes.append(Note("forward returns a tuple: its first element is taken as the output"
                          + (" (declared)" if returns == "tuple" else ""),
                          None if returns == "tuple" else Remedy.to(
                              "returns", "tensor", "say it must return one tensor")))
    # Before anything reads it: an output that is no attention output is said as what it is.
    problem = output_problem(first, (config.batch, config.q_len, config.d_model),
                             heads=config.num_heads if plan.roles.heads else None,
                             kv_len=config.kv_len)
    if problem is not None:
        plan.queries = own_query_count(plan, config, first)
        if plan.queries is not None:  # queries of its own: see inference.steps.latent
            plan.convention.call = "latent"
            return
        raise InferenceError(str(problem))
    if plan.convention.call == "latent":
        raise InferenceError(f"call=latent is declared, but its output has a row per token "
                             f"({config.q_len} for {config.q_len}): its queries are the input's")
    roles = plan.roles
    if (roles.output and isinstance(first, torch.Tensor)
            and first.shape[-1] == config.num_heads * config.d_model and config.num_heads > 1):
        plan.per_head_output = True
        notes.append(f"{roles.output} read as each head's width: the heads are concatenated")


def sequence_order(inquiry: Inquiry) -> None:
    plan, notes = inquiry.plan, inquiry.notes
    stated = inquiry.declared.declares_sequence_first()
    if stated is not None:
        plan.convention.sequence_first = stated
        if stated:
            notes.append("inputs are (length, batch, width) (declared)")
        return

    def flagged(first: bool):
        plan.convention.sequence_first = first
        return inquiry.build()

    case = probe_case(inquiry.heads, inquiry.head_dim, kept=None)
    plan.convention.sequence_first = sequence_first(flagged, case, plan.convention.call)
    if plan.convention.sequence_first:
        notes.append(Note("inputs are (length, batch, width) (probed: called batch-first it "
                          "mixes batch elements, transposed it keeps them apart)",
                          Remedy.to("sequence_first", "true", "state it")))
