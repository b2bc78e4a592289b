"""Infer an implementation's declaration from the class itself, stating every inference."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, replace

import torch
from torch import nn

from conformance.generation.cases import dtype_name
from conformance.generation.constraints import HEAD_COUNTS, HEAD_DIMS, Constraint, describe, discover
from conformance.inference import kv_cache, packing, weight_roles, window
from conformance.inference.convention import (
    FILLABLE_POSITIONS,
    START_NAMES,
    ForwardConvention,
    mask_family,
    read_forward,
)
from conformance.inference.positional import position_encoding
from conformance.inference.probing import (
    BOOLEAN_POLARITY,
    infer_mask,
    is_causal,
    probe_case,
    sequence_first,
)
from conformance.inference.roles import (
    CONTEXT_LENGTH,
    MAX_BATCH_SIZE,
    ConstructorRoles,
    read_roles,
)
from conformance.inference.weight_roles import WeightOutcome
from conformance.inference.weight_search import REPRODUCED_FLOAT32, relative_error
from conformance.model.declarations import DeclarationError, Declarations
from conformance.model.spec import (
    QUERY_AXIS_LAYOUTS,
    AlibiBias,
    Capabilities,
    Config,
    Implementation,
    PackedForm,
    PositionEncoding,
    PositionForm,
    Rotary,
)
from conformance.model.weights import WeightLayout, WeightLayoutError
from conformance.numerics.reference import reference_attention
from conformance.subject.boundary import ImplementationError, InProcessSubject, ModuleInstance
from conformance.subject.call_arguments import positions_argument

ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
ASSUMED_DTYPES = (torch.float16, torch.bfloat16)
WIDE_WINDOW = 1024
"""The window a window argument is given where the configuration has none (probes, and modules
not checked as windowed): wider than any generated sequence, so it never applies."""
"""What an undeclared module is assumed to run in besides float32/float64: an nn.Module casts to
them, but nobody said it works there, so what breaks there is a warning."""


class InferenceError(Exception):
    """What can't be inferred, and how to declare it; one line."""


@dataclass(frozen=True)
class Inferred:
    """The inferred declaration, and every inference in words (the report opens with them)."""

    implementation: Implementation
    notes: tuple[str, ...]


class InferredModule(nn.Module):
    """Calls the module under test in its own convention: the suite's canonical call in
    (batch-first tensors; q, k, v in that order), the attention output (the first element of a
    tuple) out."""

    def __init__(self, inner: nn.Module, convention: ForwardConvention,
                 tuple_output: bool) -> None:
        super().__init__()
        self.inner = inner
        self.convention = convention
        self.tuple_output = tuple_output

    def forward(self, *tensors: torch.Tensor, mask: torch.Tensor | None = None,
                is_causal: bool = False, **options: object) -> torch.Tensor | tuple:
        """``options`` (positions, a cache, cu_seqlens) go to the module by their own names; a
        call with the cache argument returns the module's whole output (the cache session takes
        the present from it)."""
        convention = self.convention
        kwargs: dict[str, object] = dict(options)
        if mask is not None:
            kwargs[convention.mask] = mask
        if is_causal:
            kwargs[convention.causal] = True
        if convention.need_weights:
            kwargs["need_weights"] = False
        if convention.sequence_first:
            tensors = tuple(t.transpose(0, 1) for t in tensors)
        if convention.by_keyword:
            kwargs.update(zip(convention.inputs, tensors, strict=True))
            tensors = ()
        output = self.inner(*tensors, **kwargs)
        cached = convention.cache is not None and convention.cache in options
        if isinstance(output, tuple) and (cached or self.tuple_output):
            if convention.sequence_first and isinstance(output[0], torch.Tensor):
                output = (output[0].transpose(0, 1), *output[1:])
            return output if cached else output[0]
        if convention.sequence_first and isinstance(output, torch.Tensor):
            output = output.transpose(0, 1)
        return output


@dataclass
class _Plan:
    """What is known so far about constructing and calling the class."""

    cls: type
    roles: ConstructorRoles
    convention: ForwardConvention
    per_head_output: bool = False
    tuple_output: bool = False
    init: tuple[tuple[str, object], ...] = ()
    positional: tuple[str, ...] = ()
    """Constructor arguments passed by position, in this order (a declared ``constructor =
    positional``: ``Class(d_model, num_heads)``); every other one goes by keyword."""
    window_offset: int = 0
    """The window argument is the window in keys plus this (-1 where it counts the keys before
    the row)."""

    def arguments(self, config: Config) -> dict[str, object]:
        roles, kwargs = self.roles, {}
        if roles.width:
            kwargs[roles.width] = config.d_model
        if roles.heads:
            kwargs[roles.heads] = config.num_heads
        if roles.head_dim:
            kwargs[roles.head_dim] = config.head_dim
        if roles.output:
            kwargs[roles.output] = config.head_dim if self.per_head_output else config.d_model
        if roles.dropout:
            kwargs[roles.dropout] = config.dropout
        if roles.context:
            kwargs[roles.context] = CONTEXT_LENGTH
        if roles.batch_first:
            kwargs[roles.batch_first] = True
        if roles.kv_heads:
            kwargs[roles.kv_heads] = config.kv_heads
        if roles.window:
            kwargs[roles.window] = (WIDE_WINDOW if config.window is None
                                    else config.window + self.window_offset)
        if roles.max_batch:
            kwargs[roles.max_batch] = MAX_BATCH_SIZE
        kwargs.update(self.init)
        return kwargs

    def instantiate(self, config: Config) -> nn.Module:
        """The class itself, built for ``config`` as declared (by keyword, or positionally)."""
        kwargs = self.arguments(config)
        args = [kwargs.pop(name) for name in self.positional]
        return self.cls(*args, **kwargs)

    def construct(self, config: Config) -> nn.Module:
        return InferredModule(self.instantiate(config), self.convention, self.tuple_output)

    def constructs(self, heads: int, head_dim: int) -> bool:
        """Whether the constructor accepts ``heads`` heads of ``head_dim``."""
        config = Config(batch=2, q_len=3, kv_len=3, d_model=heads * head_dim, num_heads=heads)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                self.instantiate(config)
        except Exception:  # the constructor's own validation, whatever it raises
            return False
        return True

    def builds(self, heads: int, head_dim: int) -> bool:
        """Whether the constructor accepts ``heads`` heads of ``head_dim``, and the forward
        then runs (RoPE's even head_dim is often the forward's to find out)."""
        config = Config(batch=2, q_len=3, kv_len=3, d_model=heads * head_dim, num_heads=heads)
        try:
            _first_call(self, config)
        except Exception:  # the constructor's or the forward's own validation, whatever it raises
            return False
        return True

    def implementation(self, name: str, **capabilities: object) -> Implementation:
        declared = dict(call=self.convention.call, heads=None if self.roles.heads else 1,
                        max_len=CONTEXT_LENGTH if self.roles.context else None,
                        max_batch=MAX_BATCH_SIZE if self.roles.max_batch else None,
                        cross_attention=self.convention.call == "qkv", dtypes=ALL_DTYPES,
                        assumed_dtypes=ASSUMED_DTYPES)
        declared.update(capabilities)
        return Implementation(name, self.construct, Capabilities(**declared))


def _first_call(plan: _Plan, config: Config) -> torch.Tensor | tuple:
    module = plan.construct(config).inner.eval()
    shape = (config.batch, config.q_len, config.d_model)
    if plan.convention.sequence_first:
        shape = (config.q_len, config.batch, config.d_model)
    inputs = [torch.randn(shape) for _ in range(1 if plan.convention.call == "self" else 3)]
    kwargs = (dict(zip(plan.convention.inputs, inputs, strict=True)) if plan.convention.by_keyword
              else {})
    argument = plan.convention.position_argument
    if argument and plan.convention.position_required:  # a call without it can't be made
        kwargs[argument] = positions_argument(FILLABLE_POSITIONS[argument], 0, config.batch,
                                              config.q_len, "cpu")
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        return module(**kwargs) if plan.convention.by_keyword else module(*inputs, **kwargs)


def _roles(cls: type, declared: Declarations, label: str) -> ConstructorRoles:
    roles = read_roles(cls)
    try:
        stated_window = declared.window()
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    for role, argument in (("width", declared.width_arg), ("heads", declared.heads_arg),
                           ("head_dim", declared.head_dim_arg),
                           ("kv_heads", declared.kv_heads_arg),
                           ("window", stated_window[0] if stated_window else None)):
        if argument:
            if argument in roles.unknown:
                roles.unknown.remove(argument)
            setattr(roles, role, argument)
    if roles.unknown:
        raise InferenceError(
            f"{label}: can't fill constructor argument(s) {', '.join(roles.unknown)}: give them "
            "defaults, name the width/head-count/head-width one with --width-arg / --heads-arg / "
            "--head-dim-arg, or declare it with conformance.implementation(...)")
    if roles.width is None:
        raise InferenceError(f"{label}: no constructor argument names the model width (d_model, "
                             "hidden_dim, embed_dim, ...): add --width-arg NAME")
    return roles


def _convention(cls: type, declared: Declarations, label: str) -> ForwardConvention:
    convention = read_forward(cls.forward)
    if not convention.inputs and not declared.call:
        raise InferenceError(f"{label}: forward takes no input tensor (none of x; q, k, v; query, "
                             "key, value): declare the call with --call self or --call qkv")
    if declared.call:
        convention.call = declared.call
        convention.inputs = (convention.inputs[:1] if declared.call == "self"
                             else (*convention.inputs, "k", "v")[:3])
        convention.by_keyword = False
    try:
        argument = declared.mask_argument
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    if argument:
        convention.mask, convention.mask_family = argument, mask_family(argument)
    return convention


def _constraint(plan: _Plan, label: str, notes: list[str]) -> Constraint | None:
    """The configurations it builds and runs for; where the forward runs for none (a basic call
    that always fails: the gate's to report), those it builds for."""
    heads = None if plan.roles.heads else 1
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
                                 f"{error} for every generated configuration") from error
        raise InferenceError(f"{label}: constructing it failed for every generated "
                             "configuration") from None
    if constraint is not None:
        notes.append(f"{constraint.describe()} (probed)")
    return constraint


def _layout_constraint(plan: _Plan, layout: WeightLayout | None,
                       constraint: Constraint | None, notes: list[str]) -> Constraint | None:
    """The configurations where the weight layout also reads the module, heads of the right
    width: a layout that changes form at some head count (x-transformers has no output
    projection at one head) limits them as a constructor that refuses them would."""
    if layout is None:
        return constraint
    allowed = set(constraint.pairs) if constraint else None

    def reads(heads: int, head_dim: int) -> bool:
        if allowed is not None and (heads, head_dim) not in allowed:
            return False
        config = Config(batch=2, q_len=3, kv_len=3, d_model=heads * head_dim, num_heads=heads)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                weights = layout.read(plan.construct(config), heads)
        except Exception:  # the constructor, or the layout's reading: not this configuration
            return False
        return tuple(weights.w_q.shape[:2]) == (heads, head_dim)

    try:
        found = discover(reads, heads=None if plan.roles.heads else 1)
    except ValueError:
        return constraint  # nowhere: the gate reports the weights as broken
    if found is None or (constraint is not None and found.pairs == constraint.pairs):
        return constraint
    notes.append(f"its weights read as found only with {found.words}: generating those "
                 "configurations (probed)")
    return found


def _encoding_constraint(plan: _Plan, outcome: WeightOutcome, constraint: Constraint | None,
                         capabilities: dict, notes: list[str]) -> Constraint | None:
    """Without the head widths where no position-encoding hypothesis reproduces the output:
    RoPE is defined on pairs of dimensions, and a library that runs at head_dim 1 rotates
    nothing a reference can be held to; left out as a constructor that refused them would be,
    and said (a warning of ``reference``)."""
    widths = outcome.unexplained_widths
    if not widths:
        return constraint
    grid = [(h, d) for h in (HEAD_COUNTS if plan.roles.heads else (1,)) for d in HEAD_DIMS]
    allowed = {p for p in (constraint.pairs if constraint else grid) if p[1] not in widths}
    if not allowed:
        return constraint
    doubt = (f"at head width(s) {list(widths)} no RoPE hypothesis (half-split or interleaved "
             "pairs, any theta or rotated fraction) reproduces its output: RoPE is undefined "
             "there, so those widths are left out of generation")
    capabilities["encoding_doubt"] = doubt
    notes.append(doubt + " (see reference)")
    return Constraint(tuple(sorted(allowed)), describe(allowed, grid))


def _probe_pair(plan: _Plan, constraint: Constraint | None) -> tuple[int, int]:
    """The probes' (num_heads, head_dim): 2 heads of 4 (1 of 4 single-head), or the buildable
    pair nearest to it."""
    preferred = (2 if plan.roles.heads else 1, 4)
    if constraint is None or preferred in constraint.pairs:
        return preferred
    return min(constraint.pairs, key=lambda p: (abs(p[0] - preferred[0]) + abs(p[1] - 4), p))


def _positional(roles: ConstructorRoles, declared: Declarations, label: str) -> tuple[str, ...]:
    """The arguments a declared positional constructor takes by position: the width, then the
    head count (an assignment's ``MultiHeadAttention(d_model, num_heads)``)."""
    try:
        form = declared.choice("constructor", ("keyword", "positional"))
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    if form != "positional":
        return ()
    if roles.width is None:
        raise InferenceError(f"{label}: a positional constructor needs the width argument: "
                             "declare --width-arg")
    return tuple(name for name in (roles.width, roles.heads) if name)


def infer(cls: type, *, name: str | None = None,
          declared: Declarations | None = None) -> Inferred:
    """Declaration for an ``nn.Module`` subclass: what ``declared`` says, the rest inferred.

    Raises InferenceError naming what can't be inferred and the flag that declares it.
    """
    declared = declared or Declarations()
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise InferenceError(f"{getattr(cls, '__name__', cls)!r} is not an nn.Module class: "
                             "declare it with conformance.implementation(...)")
    label = name or cls.__name__
    roles = _roles(cls, declared, label)
    convention = _convention(cls, declared, label)
    init = dict(declared.init or ())
    if declared.causal in ("always", "never") and roles.causal and roles.causal not in init:
        init[roles.causal] = declared.causal == "always"  # declared causal: built causal
    plan = _Plan(cls, roles, convention, init=tuple(init.items()),
                 positional=_positional(roles, declared, label))
    notes = [plan.convention.describe() + ("; cross-attention assumed from its separate q, k, v"
                                           if plan.convention.call == "qkv" else ""),
             roles.describe() + ("" if roles.heads else "; single head (no head-count argument)")]
    if plan.positional:
        notes.append(f"constructed positionally: {cls.__name__}({', '.join(plan.positional)}) "
                     "(declared)")
    if plan.init:
        notes.append("constructed with " + ", ".join(f"{k}={v!r}" for k, v in plan.init)
                     + " (declared)")
    constraint = _constraint(plan, label, notes)
    heads, head_dim = _probe_pair(plan, constraint)
    config = Config(batch=2, q_len=6, kv_len=6, d_model=heads * head_dim, num_heads=heads)
    try:
        returns = declared.choice("returns", ("tensor", "tuple"))
        padded = declared.choice("padded_queries", ("zero", "self", "any"))
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    _read_output(plan, config, notes, returns)
    capabilities: dict[str, object] = {"shapes": constraint.pairs if constraint else None,
                                       "returns_tensor": returns == "tensor",
                                       "padded_queries": padded}
    if padded is not None:
        notes.append(f"padded queries: {padded} (declared; checked by padding)")
    try:
        _position_argument(plan, declared, capabilities, notes)
    except DeclarationError as error:
        raise InferenceError(str(error)) from error

    def build(**changes: object):
        implementation = plan.implementation(label, **{**capabilities, **changes})
        return InProcessSubject(implementation).instantiate(config, seed=0)

    _sequence_first(plan, declared, build, heads, head_dim, notes)
    probe = build()
    _causality(plan, declared, capabilities, build, heads, head_dim, notes)
    layout, outcome = _weights(plan, declared, label, constraint, notes, capabilities)
    constraint = _layout_constraint(plan, layout, constraint, notes)
    constraint = _encoding_constraint(plan, outcome, constraint, capabilities, notes)
    capabilities["shapes"] = constraint.pairs if constraint else None
    try:
        _position_encoding(plan, declared, capabilities, probe, outcome, notes)
        _window(plan, declared, capabilities, config, label, heads, head_dim, notes)
        _cache(plan, declared, capabilities, build, heads, head_dim, notes)
        _dropout(plan, capabilities, probe, heads, head_dim, notes)
        _mask(plan, declared, capabilities, build, heads, head_dim, notes)
        _alibi_counting(plan, capabilities, layout, label, heads, head_dim, notes)
        _packed(plan, declared, capabilities, build, heads, head_dim, notes)
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    _dtypes(declared, capabilities, notes)
    implementation = replace(plan.implementation(label, **capabilities), weight_layout=layout,
                             notes=tuple(notes))
    return Inferred(implementation, tuple(notes))


POSITION_WORDS = {"rotary": "rotary position embeddings (RoPE)", "alibi": "ALiBi position biases",
                  "positions": "a position input"}


def _read_output(plan: _Plan, config: Config, notes: list[str], returns: str | None) -> None:
    """Whether forward returns a tuple (its first element is then the output, unless it is
    declared to return one tensor), and whether an output-width argument is per head."""
    try:
        first = _first_call(plan, config)
    except Exception as error:  # the gate reports a broken basic call; inference goes on
        notes.append(f"calling it as {plan.convention.describe()} without a mask raised "
                     f"{type(error).__name__}: the output's form is not inferred")
        return
    if isinstance(first, tuple) and returns == "tensor":
        notes.append("forward returns a tuple, but it is declared to return one tensor: the "
                     "gate fails on it")
        return
    if isinstance(first, tuple):
        plan.tuple_output = True
        first = first[0]
        notes.append("forward returns a tuple: its first element is taken as the output"
                     + (" (declared)" if returns == "tuple" else
                        " (declare --returns tensor if it must return one tensor)"))
    roles = plan.roles
    if (roles.output and isinstance(first, torch.Tensor)
            and first.shape[-1] == config.num_heads * config.d_model and config.num_heads > 1):
        plan.per_head_output = True
        notes.append(f"{roles.output} read as each head's width: the heads are concatenated")


def _sequence_first(plan: _Plan, declared: Declarations, build, heads: int, head_dim: int,
                    notes: list[str]) -> None:
    stated = declared.declares_sequence_first()
    if stated is not None:
        plan.convention.sequence_first = stated
        if stated:
            notes.append("inputs are (length, batch, width) (declared)")
        return

    def flagged(first: bool):
        plan.convention.sequence_first = first
        return build()

    case = probe_case(heads, head_dim, kept=None)
    plan.convention.sequence_first = sequence_first(flagged, case, plan.convention.call)
    if plan.convention.sequence_first:
        notes.append("inputs are (length, batch, width) (probed: called batch-first it mixes "
                     "batch elements, transposed it keeps them apart; declare "
                     "--sequence-first to state it)")


def _weights(plan: _Plan, declared: Declarations, label: str, constraint: Constraint | None,
             notes: list[str], capabilities: dict) -> tuple[WeightLayout | None, WeightOutcome]:
    """The weight layout: declared, or found by behaviour (see
    :mod:`conformance.inference.weight_roles`); and the key/value heads."""
    if declared.weights:
        try:
            layout = declared.weight_layout("inner")
        except DeclarationError as error:
            raise InferenceError(str(error)) from error
        notes.append((layout.describe() if layout else "no weight access") + " (declared)")
        if plan.roles.kv_heads:
            capabilities["kv_heads"] = "config"
            notes.append(f"key/value heads = {plan.roles.kv_heads}: generated as divisors of "
                         "num_heads")
        return layout, WeightOutcome()

    def build_at(heads: int, head_dim: int, kv_heads: int | None) -> ModuleInstance:
        config = Config(batch=2, q_len=weight_roles.LENGTH, kv_len=weight_roles.LENGTH,
                        d_model=heads * head_dim, num_heads=heads, num_kv_heads=kv_heads,
                        dtype=torch.float64)
        implementation = plan.implementation(label, **capabilities)
        return InProcessSubject(implementation).instantiate(config, seed=0)

    try:
        grouping = declared.choice("kv_grouping", ("interleaved", "tiled"))
        rope = declared.rotary()
        output = declared.choice("output_projection", ("applied",))
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    outcome = weight_roles.find(
        build_at, plan.cls, plan.convention.call,
        causal=capabilities.get("causal") == "always", single_head=not plan.roles.heads,
        kv_argument=plan.roles.kv_heads, pairs=constraint.pairs if constraint else None,
        max_len=CONTEXT_LENGTH if plan.roles.context else None, notes=notes,
        grouping=grouping, rope=rope, output_applied=output == "applied")
    if outcome.kv_heads is not None:
        capabilities["kv_heads"] = outcome.kv_heads
    if outcome.kv_doubt is not None:
        capabilities["kv_doubt"] = outcome.kv_doubt
    if outcome.weights_doubt is not None:
        capabilities["weights_doubt"] = outcome.weights_doubt
    if outcome.float32_parts:
        capabilities["float32_parts"] = tuple(outcome.float32_parts)
    return outcome.layout, outcome


def _causality(plan: _Plan, declared: Declarations, capabilities: dict, build, heads: int,
               head_dim: int, notes: list[str]) -> None:
    if declared.causal:
        if declared.causal not in ("never", "always", "optional"):
            raise InferenceError(f"causal {declared.causal!r}: use never, always or optional")
        if declared.causal == "optional" and not plan.convention.causal:
            raise InferenceError("causal=optional, but forward has no is_causal/causal argument")
        capabilities["causal"] = declared.causal
        if declared.causal == "optional":
            capabilities["causal_argument"] = "is_causal"
        notes.append(f"causal: {declared.causal} (declared)")
        return
    if plan.convention.causal:
        try:
            build(causal="optional", causal_argument="is_causal").forward(
                probe_case(heads, head_dim, kept=None, causal=True).inputs(plan.convention.call))
        except ImplementationError as error:
            notes.append(f"{plan.convention.causal}=True raises ({error}): a hint, as in "
                         "nn.MultiheadAttention; causality not checked through it")
        else:
            capabilities.update(causal="optional", causal_argument="is_causal")
            notes.append(f"causal when {plan.convention.causal}=True")
            return
    try:
        causal = is_causal(build(), probe_case(heads, head_dim), plan.convention.call)
    except ImplementationError:
        notes.append("causality not probed: the unmasked call fails")
        return
    if causal:
        capabilities["causal"] = "always"
        notes.append("always causal (probed: rows ignore every later position; if it is meant "
                     "not to be, declare --causal never and it is checked as an encoder)")
    else:
        notes.append("not causal (probed: rows see later positions; if it is meant to be, "
                     "declare --causal always)")


def _position_encoding(plan: _Plan, declared: Declarations, capabilities: dict, probe,
                       outcome: WeightOutcome, notes: list[str]) -> None:
    """A position encoding inside: the RoPE or ALiBi that reproduced the module's output (the
    float64 reference then models it), else what names and a position argument suggest (the
    checks that need the reference skip), or nothing where the output is position-free."""
    stated = declared.declared_encoding()
    reproduced = outcome.encoding
    if reproduced is not None and stated in (None, "rotary" if reproduced.rotary else "alibi"):
        kind = "rotary" if reproduced.rotary else "alibi"
        capabilities.update(positional=f"{reproduced.describe()} (reproduced)", relative=kind,
                            encoding=reproduced)
        text = (f"{reproduced.describe()} inside (found by behaviour: its output depends on "
                "the tokens' positions, and the float64 reference with this encoding reproduces "
                "it; the reference checks apply it); position_shift checks that shifting every "
                "position changes nothing")
        if kind == "alibi":
            capabilities["alibi"] = declared.alibi or "standard"
            text += "; alibi holds the slopes to the paper's (they reproduced the output)"
        notes.append(text)
        return
    found = position_encoding(probe.module.inner, plan.convention.positions)
    if found is not None and not outcome.dependent and outcome.layout is not None:
        # Names suggest a position encoding, behaviour shows none (permuting the tokens
        # permutes the output): behaviour decides.
        notes.append(f"{found[1]} suggests a position encoding, but its output does not depend "
                     "on the tokens' positions (probed): checked as position-free (declare "
                     f"--position-encoding {found[0]} if it is meant to have one)")
        found = None
    if stated == "none":
        found = None
        notes.append("no position encoding (declared)")
    elif stated is not None:
        found = (stated, "declared")
    if found is not None:
        kind, evidence = found
        origin = "declared" if evidence == "declared" else f"inferred from {evidence}"
        capabilities["positional"] = f"{POSITION_WORDS[kind]} ({origin})"
        text = (f"{POSITION_WORDS[kind]} inside ({origin}"
                + ("" if evidence == "declared" else "; if not, declare --position-encoding none")
                + "): the checks that assume position-free attention skip")
        if kind in ("rotary", "alibi"):
            capabilities["relative"] = kind
            text += "; position_shift checks that shifting every position changes nothing"
        if kind == "alibi":
            capabilities["alibi"] = declared.alibi or "measured"
            text += ("; alibi measures the slopes" + (
                " against the paper's (declared)" if declared.alibi == "standard" else
                " (declare --alibi standard to hold them to the paper's)"))
        held = _declared_encoding(kind, declared)
        if held is not None:
            # Behaviour could not reproduce it, but what is meant is declared: the reference
            # holds the module to it.
            capabilities["encoding"] = held
            text += (f"; no encoding behaviour tried reproduces its output, so the reference "
                     f"checks hold it to the declared {held.describe()}")
        notes.append(text)


def _alibi_counting(plan: _Plan, capabilities: dict, layout: WeightLayout | None, label: str,
                    heads: int, head_dim: int, notes: list[str]) -> None:
    """Whether ALiBi's positions count every token or only the kept ones (BLOOM's
    ``build_alibi_tensor`` numbers the tokens by the mask's cumulative sum): decided by which
    reproduces its output under a mask with padding before kept keys, at the kept rows."""
    encoding = capabilities.get("encoding")
    if (not isinstance(encoding, PositionEncoding) or encoding.alibi is None
            or capabilities.get("mask") is None or layout is None):
        return
    config = Config(batch=2, q_len=6, kv_len=6, d_model=heads * head_dim, num_heads=heads,
                    num_kv_heads=None, dtype=torch.float64)
    implementation = replace(plan.implementation(label, **capabilities), weight_layout=layout)
    causal = capabilities.get("causal") == "always"
    try:
        instance = InProcessSubject(implementation).instantiate(config, seed=0)
        inputs = probe_case(heads, head_dim, causal=causal, dtype="float64").inputs(
            plan.convention.call)
        output = instance.forward(inputs)
        weights = instance.read_weights()
    except (ImplementationError, WeightLayoutError, RuntimeError):
        return
    rows = inputs.keep if inputs.is_self else torch.ones_like(inputs.keep)
    errors = {}
    for counts_kept in (False, True):
        candidate = replace(encoding, alibi=replace(encoding.alibi, counts_kept=counts_kept))
        expected = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                       keep=inputs.keep, causal=causal,
                                       encoding=candidate).output
        errors[counts_kept] = relative_error(output[rows], expected[rows])
    if errors[True] < REPRODUCED_FLOAT32 <= errors[False]:
        capabilities["encoding"] = replace(encoding, alibi=replace(encoding.alibi,
                                                                   counts_kept=True))
        notes.append("ALiBi positions count the kept tokens only (BLOOM's cumulative sum of "
                     f"the mask; probed: relative error {errors[True]:.1e} with it, "
                     f"{errors[False]:.1e} counting every token)")


def _declared_encoding(kind: str, declared: Declarations) -> PositionEncoding | None:
    """The encoding the declarations spell out in full, for a module of ``kind``: ALiBi with
    the paper's slopes, or RoPE with its pairing (and theta, fraction) declared."""
    if kind == "alibi" and declared.alibi == "standard":
        return PositionEncoding(alibi=AlibiBias())
    rope = declared.rotary()
    if kind == "rotary" and rope is not None:
        pairing, theta, fraction = rope
        return PositionEncoding(rotary=Rotary(pairing, theta or 10000.0, fraction or 1.0))
    return None


def _position_argument(plan: _Plan, declared: Declarations, capabilities: dict,
                       notes: list[str]) -> None:
    """A position argument the suite can fill (declared, or read from its name)."""
    stated_positions = declared.position_argument()
    if stated_positions is not None:
        argument, form = stated_positions
        how = "declared"
    elif plan.convention.position_argument:
        argument = plan.convention.position_argument
        form = FILLABLE_POSITIONS[argument]
        buffers_start = argument == plan.convention.cache and argument in START_NAMES
        if buffers_start and not plan.convention.position_required:
            return  # the cache's start position, passed only with the cache
        how = "its name says so"
    else:
        return
    capabilities.update(positions=argument, position_form=form)
    notes.append(f"{argument}: the tokens' positions, passed as {POSITION_FORM_WORDS[form]} "
                 f"({how})")


POSITION_FORM_WORDS = {PositionForm.IDS: "(B, L) int64", PositionForm.VECTOR: "(L,) int64",
                       PositionForm.START: "the first position, an int"}


def _window(plan: _Plan, declared: Declarations, capabilities: dict, config: Config,
            label: str, heads: int, head_dim: int, notes: list[str]) -> None:
    """A sliding-window argument: how it counts (declared, settled by its name, or probed)."""
    name = plan.roles.window
    if not name:
        return
    if capabilities.get("causal") != "always":
        notes.append(f"{name}: a window argument, but the module is not always causal: built "
                     f"with {name}={WIDE_WINDOW} (a window wider than any sequence), not checked "
                     "as windowed")
        return
    stated = declared.window()
    if stated is not None:
        convention, how = stated[1], "declared"
    elif name in window.SETTLED:
        convention = window.SETTLED[name]
        other = "left" if convention == "keys" else "keys"
        how = (f"its name says so; if it counts the other way, declare --window-arg "
               f"{name}:{other}")
    else:
        def built(width: int):
            implementation = plan.implementation(label, **capabilities)
            return InProcessSubject(implementation).instantiate(replace(config, window=width), 0)

        case = probe_case(heads, head_dim, kept=None, batch=1, q_len=window.LENGTH,
                          kv_len=window.LENGTH, causal=True)
        convention, seen = window.probe_convention(built, case, plan.convention.call)
        if convention is None:
            convention = "keys"
            how = (f"probed: built with {name}={window.PROBE_WINDOW}, the last row sees "
                   f"positions {seen}, neither convention; checked as W keys (see "
                   f"sliding_window; declare --window-arg {name}:left if that is meant)")
        else:
            other = "left" if convention == "keys" else "keys"
            how = (f"probed: built with {name}={window.PROBE_WINDOW}, the last row sees "
                   f"{len(seen)} positions; declare --window-arg {name}:{other} if the other "
                   "count was meant")
    plan.window_offset = -1 if convention == "left" else 0
    capabilities["window"] = "config"
    notes.append(f"{name}: a causal sliding window, {window.CONVENTION_WORDS[convention]} "
                 f"({how}); generated as 1 to 8 keys")


def _cache(plan: _Plan, declared: Declarations, capabilities: dict, build, heads: int,
           head_dim: int, notes: list[str]) -> None:
    """A KV cache argument: its style (declared, or read from the signature), confirmed by a
    prefill through it."""
    stated = declared.cache()
    if stated == "none":
        notes.append("no KV cache (declared)")
        return
    if stated is not None:
        style, argument, factory = stated
        options = (((plan.convention.use_cache, True),) if plan.convention.use_cache else ())
        found = kv_cache.CacheProtocol(style, argument, options, factory)
        how = "declared"
    elif plan.convention.cache:
        found, how = kv_cache.protocol(plan.convention, plan.cls.forward)
        if found is None:
            notes.append(f"{plan.convention.cache}: {how}: the KV cache is not checked (declare "
                         "it with --kv-cache object@ARG=module:Class)")
            return
    else:
        return
    if capabilities.get("causal", "never") == "never":
        notes.append(f"{found.argument}: a KV cache argument, but the module is not causal: "
                     "the cache is not checked")
        return
    case = probe_case(heads, head_dim, kept=None, causal=True)
    problem = kv_cache.confirm(build, found, case, plan.convention.call)
    if problem is not None:
        notes.append(f"{found.argument}: a prefill through the cache as {found.describe()} "
                     f"failed ({problem}): the KV cache is not checked (declare it with "
                     "--kv-cache STYLE@ARG)")
        return
    capabilities.update(found.capabilities())
    notes.append(f"KV cache: {found.describe()} ({how}; probed: a prefill through it works; "
                 "another style is declared with --kv-cache STYLE@ARG); kv_cache checks decoding "
                 "against the full forward")


def _packed(plan: _Plan, declared: Declarations, capabilities: dict, build, heads: int,
            head_dim: int, notes: list[str]) -> None:
    """Packed sequences: a cu_seqlens argument (its token layout probed), or declared."""
    stated = declared.packing()
    case = probe_case(heads, head_dim, kept=None, batch=1,
                      causal=capabilities.get("causal") == "always")
    if stated is not None and stated[0] is PackedForm.MASK:
        mask = capabilities.get("mask")
        if (mask is None or mask.layout not in QUERY_AXIS_LAYOUTS) and not _per_query_mask(
                plan, capabilities, build, heads, head_dim, notes):
            return
        capabilities["packed"] = PackedForm.MASK
        notes.append("packed sequences through a block-diagonal mask (declared)")
        return
    argument = stated[1] if stated is not None else plan.convention.packed
    if not argument:
        return
    max_seqlen = plan.convention.max_seqlen
    if stated is not None:
        form, how = stated[0], "declared"
    else:
        form = packing.probe_form(build, case, plan.convention.call, argument, max_seqlen)
        how = "probed"
        if form is None:
            notes.append(f"{argument}: a cu_seqlens argument, but no packed call works (tokens "
                         "(total, D) or (1, total, D)): packing is not checked (declare "
                         f"--packed cu_seqlens@{argument})")
            return
    capabilities.update(packed=form, packed_argument=argument, max_seqlen_argument=max_seqlen)
    tokens = "(total, D)" if form is PackedForm.CU_SEQLENS_FLAT else "(1, total, D)"
    notes.append(f"{argument}: packed sequences, tokens {tokens} ({how})"
                 + (f", with {max_seqlen}" if max_seqlen else ""))


def _per_query_mask(plan: _Plan, capabilities: dict, build, heads: int, head_dim: int,
                    notes: list[str]) -> bool:
    """For packing through the mask: a mask convention with a query axis, searched again among
    those layouts only."""
    argument = plan.convention.mask
    if not argument:
        raise InferenceError("packed=mask is declared, but forward takes no mask argument")
    search = infer_mask(build(mask=None, mask_problem=None), probe_case(heads, head_dim),
                        plan.convention.call, plan.convention.mask_family, argument,
                        name_settles=plan.convention.mask_name_settles,
                        layouts=QUERY_AXIS_LAYOUTS)
    if search.convention is None:
        notes.append(f"packed=mask is declared, but {argument} takes no mask with a query axis "
                     "((B, Lq, Lk), (B, 1, Lq, Lk), (B, H, Lq, Lk), (Lq, Lk)): packing is not "
                     "checked")
        return False
    capabilities["mask"] = search.convention
    notes.append(f"{argument}: {search.convention.describe()} (probed among the layouts with a "
                 "query axis, for packing)")
    return True


def _dropout(plan: _Plan, capabilities: dict, probe, heads: int, head_dim: int,
             notes: list[str]) -> None:
    if plan.roles.dropout:
        capabilities["dropout"] = "config"
        return
    inputs = probe_case(heads, head_dim, kept=None).inputs(plan.convention.call)
    try:
        changes = not torch.equal(probe.forward(inputs, training=True, seed=1),
                                  probe.forward(inputs, training=True, seed=2))
    except ImplementationError:
        changes = False
    if changes:
        capabilities["dropout"] = "fixed"
        notes.append("dropout at a rate it fixes itself (probed: train-mode calls differ)")


def _mask(plan: _Plan, declared: Declarations, capabilities: dict, build, heads: int,
          head_dim: int, notes: list[str]) -> None:
    argument = plan.convention.mask
    try:
        declared_mask = declared.mask_convention("mask")
        formats = declared.alternative_masks("mask") if declared.mask_formats else ()
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    if declared_mask is not None:
        if not argument:
            raise InferenceError("a mask is declared, but forward takes no mask argument: name "
                                 "it with --mask KIND:LAYOUT@ARGUMENT")
        capabilities["mask"] = declared_mask
        notes.append(f"{argument}: {declared_mask.describe()} (declared)")
    elif argument:
        causal = capabilities.get("causal") == "always"
        search = infer_mask(build(), probe_case(heads, head_dim, causal=causal),
                            plan.convention.call, plan.convention.mask_family, argument,
                            name_settles=plan.convention.mask_name_settles)
        if search.convention is None:
            capabilities["mask_problem"] = search.problem
            notes.append(f"{argument}: no mask convention inferred (see padding)")
        else:
            capabilities["mask"] = search.convention
            stated = replace(search.convention, argument=argument).spec()
            text = f"{argument}: {search.convention.describe()} (probed"
            if search.assumed:
                capabilities["mask_assumed"] = search.assumed
                text += (f"; assumed, no convention works: {search.assumed}; if it "
                         f"reads its mask another way, declare it: --mask {stated})")
            elif search.doubt:
                capabilities["mask_doubt"] = search.doubt
                text += f"; doubtful, see padding; to state it: --mask {stated})"
            elif plan.convention.mask_family == "either" and search.polarity_probed:
                text += (f"; the name allows either polarity and behaviour chose "
                         f"{BOOLEAN_POLARITY[search.convention.kind]}; if the other was meant, "
                         f"the module reads its mask inverted: declare the intended one, e.g. "
                         f"--mask {_opposite(stated)})")
            else:
                text += f"; to state it: --mask {stated})"
            notes.append(text)
    if formats:
        capabilities["mask_formats"] = formats
        notes.append(f"{argument} also takes " + ", ".join(m.describe() for m in formats)
                     + " (declared)")


def _opposite(spec: str) -> str:
    """The declaration with the other boolean polarity."""
    return (spec.replace("ignore_bool", "keep_bool") if spec.startswith("ignore_bool")
            else spec.replace("keep_bool", "ignore_bool"))


def _dtypes(declared: Declarations, capabilities: dict, notes: list[str]) -> None:
    try:
        dtypes = declared.dtype_list()
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    if dtypes is not None:
        capabilities.update(dtypes=dtypes, assumed_dtypes=())
        notes.append("dtypes " + ", ".join(dtype_name(d) for d in dtypes) + " (declared)")
    else:
        notes.append("float16 and bfloat16 assumed (an nn.Module can be cast to them, nobody "
                     "declared them): what breaks there is a warning; declare --dtypes to make "
                     "them part of its contract")
