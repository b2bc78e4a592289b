"""Infer an implementation's declaration from the class itself, stating every inference."""

from __future__ import annotations

import contextlib
import inspect
import io
from dataclasses import dataclass, replace

import torch
from torch import nn

from conformance.adapter import ImplementationError, InProcessSubject
from conformance.inference.convention import ForwardConvention, read_forward
from conformance.inference.declarations import DeclarationError, Declarations
from conformance.inference.probing import infer_mask, is_causal, probe_case
from conformance.inference.projections import infer_layout
from conformance.inference.roles import CONTEXT_LENGTH, ConstructorRoles, read_roles
from conformance.spec import Capabilities, Config, Implementation, MaskConvention

ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class InferenceError(Exception):
    """What can't be inferred, and how to declare it; one line."""


@dataclass(frozen=True)
class Inferred:
    """The inferred declaration, and every inference in words (the report opens with them)."""

    implementation: Implementation
    notes: tuple[str, ...]


class InferredModule(nn.Module):
    """Calls the module under test in its own convention: the suite's canonical call in, the
    attention output (the first element of a tuple) out."""

    def __init__(self, inner: nn.Module, convention: ForwardConvention,
                 tuple_output: bool) -> None:
        super().__init__()
        self.inner = inner
        self.convention = convention
        self.tuple_output = tuple_output

    def forward(self, *tensors: torch.Tensor, mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        kwargs: dict[str, object] = {}
        if mask is not None:
            kwargs[self.convention.mask] = mask
        if is_causal:
            kwargs[self.convention.causal] = True
        if self.convention.need_weights:
            kwargs["need_weights"] = False
        output = self.inner(*tensors, **kwargs)
        return output[0] if self.tuple_output and isinstance(output, tuple) else output


@dataclass
class _Plan:
    """What is known so far about constructing and calling the class."""

    cls: type
    roles: ConstructorRoles
    convention: ForwardConvention
    per_head_output: bool = False
    tuple_output: bool = False
    init: tuple[tuple[str, object], ...] = ()

    def construct(self, config: Config) -> nn.Module:
        roles, kwargs = self.roles, {}
        if roles.width:
            kwargs[roles.width] = config.d_model
        if roles.heads:
            kwargs[roles.heads] = config.num_heads
        if roles.output:
            kwargs[roles.output] = config.head_dim if self.per_head_output else config.d_model
        if roles.dropout:
            kwargs[roles.dropout] = config.dropout
        if roles.context:
            kwargs[roles.context] = CONTEXT_LENGTH
        if roles.batch_first:
            kwargs[roles.batch_first] = True
        kwargs.update(self.init)
        return InferredModule(self.cls(**kwargs), self.convention, self.tuple_output)

    def implementation(self, name: str, **capabilities: object) -> Implementation:
        declared = dict(call=self.convention.call, heads=None if self.roles.heads else 1,
                        max_len=CONTEXT_LENGTH if self.roles.context else None,
                        cross_attention=self.convention.call == "qkv", dtypes=ALL_DTYPES)
        declared.update(capabilities)
        return Implementation(name, self.construct, Capabilities(**declared))


def _first_call(plan: _Plan, heads: int) -> torch.Tensor | tuple:
    config = Config(batch=2, q_len=5, kv_len=5, d_model=heads * 4, num_heads=heads)
    module = plan.construct(config).inner.eval()
    shape = (2, 5, config.d_model)
    inputs = [torch.randn(shape) for _ in range(1 if plan.convention.call == "self" else 3)]
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        return module(*inputs)


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
    roles = read_roles(cls)
    for role, argument in (("width", declared.width_arg), ("heads", declared.heads_arg)):
        if argument:
            if argument in roles.unknown:
                roles.unknown.remove(argument)
            setattr(roles, role, argument)
    if roles.unknown:
        raise InferenceError(
            f"{label}: can't fill constructor argument(s) {', '.join(roles.unknown)}: give them "
            "defaults, name the width/head-count one with --width-arg / --heads-arg, or declare "
            "it with conformance.implementation(...)")
    if roles.width is None:
        raise InferenceError(f"{label}: no constructor argument names the model width (d_model, "
                             "hidden_dim, embed_dim, ...): add --width-arg NAME")
    convention = read_forward(cls.forward)
    if not convention.inputs and not declared.call:
        raise InferenceError(f"{label}: forward takes no input tensor (none of x; q, k, v; query, "
                             "key, value): declare the call with --call self or --call qkv")
    if declared.call:
        convention.call = declared.call
        convention.inputs = (convention.inputs[:1] if declared.call == "self"
                             else (*convention.inputs, "k", "v")[:3])
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

    heads = 2 if roles.heads else 1
    try:
        first = _first_call(plan, heads)
    except Exception as error:  # the gate reports a broken basic call; inference goes on
        first = None
        notes.append(f"calling it as {plan.convention.describe()} without a mask raised "
                     f"{type(error).__name__}: the output's form is not inferred")
    if isinstance(first, tuple):
        plan.tuple_output = True
        first = first[0]
        notes.append("forward returns a tuple: its first element is taken as the output")
    width = heads * 4
    if (roles.output and isinstance(first, torch.Tensor) and first.shape[-1] == heads * width
            and heads > 1):
        plan.per_head_output = True
        notes.append(f"{roles.output} read as each head's width: the heads are concatenated")

    probe = InProcessSubject(plan.implementation(label)).instantiate(
        Config(batch=2, q_len=6, kv_len=6, d_model=heads * 4, num_heads=heads), seed=0)
    if declared.weights:
        try:
            layout = declared.weight_layout("inner")
        except DeclarationError as error:
            raise InferenceError(str(error)) from error
        notes.append((layout.describe() if layout else "no weight access") + " (declared)")
    else:
        layout = infer_layout(probe.module, "inner", heads, heads * 4, heads * 4)
        notes.append(layout.describe() if layout else
                     "no recognisable projections: the checks that need weights are skipped "
                     "(declare them with --weights q,k,v[,o])")

    capabilities: dict[str, object] = {}
    optional = None
    if declared.causal:
        if declared.causal not in ("never", "always", "optional"):
            raise InferenceError(f"causal {declared.causal!r}: use never, always or optional")
        if declared.causal == "optional" and not plan.convention.causal:
            raise InferenceError(f"{label}: causal=optional, but forward has no is_causal/causal "
                                 "argument")
        capabilities["causal"] = declared.causal
        if declared.causal == "optional":
            capabilities["causal_argument"] = "is_causal"
        notes.append(f"causal: {declared.causal} (declared)")
    elif plan.convention.causal:
        causal_probe = InProcessSubject(plan.implementation(
            label, causal="optional", causal_argument="is_causal")).instantiate(probe.config, 0)
        try:
            causal_probe.forward(probe_case(heads, kept=None, causal=True).inputs(
                plan.convention.call))
            optional = True
        except ImplementationError as error:
            notes.append(f"{plan.convention.causal}=True raises ({error}): a hint, as in "
                         "nn.MultiheadAttention; causality not checked through it")
    if declared.causal:
        pass  # declared: never probed
    elif optional:
        capabilities.update(causal="optional", causal_argument="is_causal")
        notes.append(f"causal when {plan.convention.causal}=True")
    else:
        try:
            causal = is_causal(probe, probe_case(heads), plan.convention.call)
        except ImplementationError:
            causal = None
            notes.append("causality not probed: the unmasked call fails")
        if causal:
            capabilities["causal"] = "always"
            notes.append("always causal (probed: rows ignore every later position)")
        elif causal is False:
            notes.append("not causal (probed: rows see later positions)")

    if roles.dropout:
        capabilities["dropout"] = "config"
    else:
        inputs = probe_case(heads, kept=None).inputs(plan.convention.call)
        try:
            changes = not torch.equal(probe.forward(inputs, training=True, seed=1),
                                      probe.forward(inputs, training=True, seed=2))
        except ImplementationError:
            changes = False
        if changes:
            capabilities["dropout"] = "fixed"
            notes.append("dropout at a rate it fixes itself (probed: train-mode calls differ)")

    declared_mask = None
    try:
        declared_mask = declared.mask_convention("mask")
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    if declared_mask is not None:
        if not plan.convention.mask:
            raise InferenceError(f"{label}: a mask is declared, but forward takes no mask argument")
        capabilities["mask"] = declared_mask
        notes.append(f"{plan.convention.mask}: {declared_mask.describe()} (declared)")
    elif plan.convention.mask:
        def build(convention: MaskConvention):
            implementation = plan.implementation(label, mask=convention, **capabilities)
            return InProcessSubject(replace(implementation, weight_layout=layout)).instantiate(
                probe.config, seed=0)

        mask, tried, problem = infer_mask(build, probe_case(heads), plan.convention.call,
                                          plan.convention.mask_family)
        capabilities["mask"] = mask
        text = f"{plan.convention.mask}: {mask.describe()}"
        text += " (probed" + (f"; tried first: {'; '.join(tried)})" if tried else ")")
        notes.append(text)
        if problem:
            notes.append(f"{plan.convention.mask}: {problem}")
    if declared.mask_formats:
        try:
            capabilities["mask_formats"] = declared.alternative_masks("mask")
        except DeclarationError as error:
            raise InferenceError(str(error)) from error
        notes.append(f"{plan.convention.mask} also takes "
                     + ", ".join(m.describe() for m in capabilities["mask_formats"])
                     + " (declared)")
    implementation = replace(plan.implementation(label, **capabilities), weight_layout=layout,
                             notes=tuple(notes))
    return Inferred(implementation, tuple(notes))


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
