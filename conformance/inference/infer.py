"""Infer an implementation's declaration from the class itself, stating every inference."""

from __future__ import annotations

import contextlib
import inspect
import io
from dataclasses import dataclass, replace

import torch
from torch import nn

from conformance.adapter import ImplementationError, InProcessSubject
from conformance.cases import dtype_name
from conformance.constraints import Constraint, discover
from conformance.inference.convention import ForwardConvention, mask_family, read_forward
from conformance.inference.declarations import DeclarationError, Declarations
from conformance.inference.positional import position_encoding
from conformance.inference.probing import (
    BOOLEAN_POLARITY,
    infer_mask,
    is_causal,
    probe_case,
    sequence_first,
)
from conformance.inference.projections import fits, infer_layout
from conformance.inference.roles import CONTEXT_LENGTH, ConstructorRoles, read_roles
from conformance.spec import Capabilities, Config, Implementation

ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
ASSUMED_DTYPES = (torch.float16, torch.bfloat16)
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
                is_causal: bool = False) -> torch.Tensor:
        convention = self.convention
        kwargs: dict[str, object] = {}
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
        if self.tuple_output and isinstance(output, tuple):
            output = output[0]
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
        kwargs.update(self.init)
        return kwargs

    def construct(self, config: Config) -> nn.Module:
        return InferredModule(self.cls(**self.arguments(config)), self.convention,
                              self.tuple_output)

    def builds(self, heads: int, head_dim: int) -> bool:
        """Whether the constructor accepts ``heads`` heads of ``head_dim``."""
        config = Config(batch=2, q_len=5, kv_len=5, d_model=heads * head_dim, num_heads=heads)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                self.cls(**self.arguments(config))
        except Exception:  # the constructor's own validation, whatever it raises
            return False
        return True

    def implementation(self, name: str, **capabilities: object) -> Implementation:
        declared = dict(call=self.convention.call, heads=None if self.roles.heads else 1,
                        max_len=CONTEXT_LENGTH if self.roles.context else None,
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
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        return module(**kwargs) if kwargs else module(*inputs)


def _roles(cls: type, declared: Declarations, label: str) -> ConstructorRoles:
    roles = read_roles(cls)
    for role, argument in (("width", declared.width_arg), ("heads", declared.heads_arg),
                           ("head_dim", declared.head_dim_arg)):
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
    try:
        constraint = discover(plan.builds, heads=None if plan.roles.heads else 1)
    except ValueError:
        config = Config(batch=2, q_len=5, kv_len=5, d_model=8, num_heads=2 if plan.roles.heads
                        else 1)
        try:
            plan.cls(**plan.arguments(config))
        except Exception as error:
            raise InferenceError(f"{label}: constructing it raised {type(error).__name__}: "
                                 f"{error} for every generated configuration") from error
        raise InferenceError(f"{label}: constructing it failed for every generated "
                             "configuration") from None
    if constraint is not None:
        notes.append(f"{constraint.describe()} (probed)")
    return constraint


def _probe_pair(plan: _Plan, constraint: Constraint | None) -> tuple[int, int]:
    """The probes' (num_heads, head_dim): 2 heads of 4 (1 of 4 single-head), or the buildable
    pair nearest to it."""
    preferred = (2 if plan.roles.heads else 1, 4)
    if constraint is None or preferred in constraint.pairs:
        return preferred
    return min(constraint.pairs, key=lambda p: (abs(p[0] - preferred[0]) + abs(p[1] - 4), p))


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
    plan = _Plan(cls, roles, convention, init=tuple(init.items()))
    notes = [plan.convention.describe() + ("; cross-attention assumed from its separate q, k, v"
                                           if plan.convention.call == "qkv" else ""),
             roles.describe() + ("" if roles.heads else "; single head (no head-count argument)")]
    if plan.init:
        notes.append("constructed with " + ", ".join(f"{k}={v!r}" for k, v in plan.init)
                     + " (declared)")
    constraint = _constraint(plan, label, notes)
    heads, head_dim = _probe_pair(plan, constraint)
    config = Config(batch=2, q_len=6, kv_len=6, d_model=heads * head_dim, num_heads=heads)
    _read_output(plan, config, notes)
    capabilities: dict[str, object] = {"shapes": constraint.pairs if constraint else None}

    def build(**changes: object):
        implementation = plan.implementation(label, **{**capabilities, **changes})
        return InProcessSubject(implementation).instantiate(config, seed=0)

    _sequence_first(plan, declared, build, heads, head_dim, notes)
    probe = build()
    layout = _weights(plan, declared, probe, constraint, heads, notes)
    found = position_encoding(probe.module.inner, plan.convention.positions)
    if found is not None:
        kind, evidence = found
        capabilities["positional"] = f"{POSITION_WORDS[kind]} (inferred from {evidence})"
        notes.append(f"{POSITION_WORDS[kind]} inside (inferred from {evidence}): the checks that "
                     "assume position-free attention skip")
    _causality(plan, declared, capabilities, build, heads, head_dim, notes)
    _dropout(plan, capabilities, probe, heads, head_dim, notes)
    _mask(plan, declared, capabilities, build, heads, head_dim, notes)
    _dtypes(declared, capabilities, notes)
    implementation = replace(plan.implementation(label, **capabilities), weight_layout=layout,
                             notes=tuple(notes))
    return Inferred(implementation, tuple(notes))


POSITION_WORDS = {"rotary": "rotary position embeddings (RoPE)", "alibi": "ALiBi position biases",
                  "positions": "a position input"}


def _read_output(plan: _Plan, config: Config, notes: list[str]) -> None:
    """Whether forward returns a tuple, and whether an output-width argument is per head."""
    try:
        first = _first_call(plan, config)
    except Exception as error:  # the gate reports a broken basic call; inference goes on
        notes.append(f"calling it as {plan.convention.describe()} without a mask raised "
                     f"{type(error).__name__}: the output's form is not inferred")
        return
    if isinstance(first, tuple):
        plan.tuple_output = True
        first = first[0]
        notes.append("forward returns a tuple: its first element is taken as the output")
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


def _weights(plan: _Plan, declared: Declarations, probe, constraint: Constraint | None,
             heads: int, notes: list[str]):
    """The weight layout: declared, or found by names and shapes that fit at two head counts."""
    if declared.weights:
        try:
            layout = declared.weight_layout("inner")
        except DeclarationError as error:
            raise InferenceError(str(error)) from error
        notes.append((layout.describe() if layout else "no weight access") + " (declared)")
        return layout
    d_model = probe.config.d_model
    layout = infer_layout(probe.module, "inner", heads, d_model, d_model)
    if layout is None:
        notes.append("no recognisable projections: the checks that need weights are skipped "
                     "(declare them with --weights q,k,v[,o])")
        return None
    other = _other_pair(plan, constraint, heads)
    if other is not None:
        config = Config(batch=2, q_len=6, kv_len=6, d_model=other[0] * other[1],
                        num_heads=other[0])
        module = InProcessSubject(plan.implementation("probe")).instantiate(config, 0).module
        if not fits(layout, module, other[0], config.d_model, config.d_model):
            notes.append(f"projections {layout.describe().removeprefix('weights from ')} fit "
                         f"{heads} heads but not {other[0]} (key/value heads of their own?): the "
                         "checks that need weights are skipped (declare them with --weights)")
            return None
    notes.append(layout.describe())
    return layout


def _other_pair(plan: _Plan, constraint: Constraint | None,
                heads: int) -> tuple[int, int] | None:
    """A buildable configuration with another head count, to confirm a layout on."""
    if not plan.roles.heads:
        return None
    pairs = constraint.pairs if constraint else [(h, 4) for h in (4, 3, 6, 8)]
    others = [p for p in pairs if p[0] != heads]
    return max(others, key=lambda p: (p[0], -abs(p[1] - 4))) if others else None


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
        search = infer_mask(build(), probe_case(heads, head_dim), plan.convention.call,
                            plan.convention.mask_family, argument,
                            name_settles=plan.convention.mask_name_settles)
        if search.convention is None:
            capabilities["mask_problem"] = search.problem
            notes.append(f"{argument}: no mask convention inferred (see padding)")
        else:
            capabilities["mask"] = search.convention
            stated = replace(search.convention, argument=argument).spec()
            text = f"{argument}: {search.convention.describe()} (probed"
            if search.doubt:
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


class CoreFunctionModule(nn.Module):
    """A core attention function over per-head tensors (B, H, L, Dh), inside the suite's own
    q/k/v/out projections: the projections are correct by construction, so every check applies
    to the function, and any failure is the function's."""

    function = staticmethod(lambda q, k, v, **options: q)

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)

    def forward(self, query, key, value, *args, **options):
        out = self.function(self._heads(self.q_proj(query)), self._heads(self.k_proj(key)),
                            self._heads(self.v_proj(value)), *args, **options)
        return self.out_proj(out.transpose(1, 2).flatten(2))


def core_function_class(function) -> type[CoreFunctionModule]:
    """A CoreFunctionModule subclass calling ``function``, whose forward carries the function's
    own parameter names (so its mask and causal arguments are read as for any class)."""
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    if len([p for p in parameters if p.default is p.empty]) < 3:
        raise InferenceError(f"{getattr(function, '__name__', function)}: a core function takes "
                             "(q, k, v[, mask][, is_causal]) over (batch, heads, length, dim)")

    def forward(self, query, key, value, *args, **options):
        return CoreFunctionModule.forward(self, query, key, value, *args, **options)

    forward.__signature__ = signature.replace(parameters=[
        inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *parameters])
    return type(getattr(function, "__name__", "core_function"), (CoreFunctionModule,),
                {"function": staticmethod(function), "forward": forward,
                 "__module__": getattr(function, "__module__", __name__)})


def infer_function(function, *, name: str | None = None,
                   declared: Declarations | None = None) -> Inferred:
    """Declaration for a core function ``f(q, k, v[, mask][, is_causal])`` over (B, H, L, Dh)."""
    label = name or getattr(function, "__name__", "core_function")
    inferred = infer(core_function_class(function), name=label, declared=declared)
    note = ("core function over (batch, heads, length, head_dim), wrapped in the suite's own "
            "q/k/v/out projections: every check applies to the function")
    notes = (note, *inferred.notes[2:])  # the wrapper's constructor and forward say nothing
    return Inferred(replace(inferred.implementation, notes=notes), notes)
