"""What inference knows so far about building and calling a class (:class:`Plan`), and what it
hands back (:class:`Inferred`): the class wrapped to take the suite's canonical call."""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from conformance.errors import ConformanceError
from conformance.inference.names.convention import FILLABLE_POSITIONS, ForwardConvention
from conformance.inference.names.roles import (
    CONTEXT_LENGTH,
    MAX_BATCH_SIZE,
    ConstructorRoles,
    context_length,
)
from conformance.inference.observing.probe_length import probe_length
from conformance.model.capability_groups import CacheForm, Dtypes, laid_over
from conformance.model.declarations import DeclarationError
from conformance.model.remedies import Note, Option, Remedy
from conformance.model.spec import Capabilities, Config, Implementation
from conformance.subject import in_flight
from conformance.subject.call_arguments import positions_argument
from conformance.subject.core_trace import CoreTracer

ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
ASSUMED_DTYPES = (torch.float16, torch.bfloat16)
"""What an undeclared module is assumed to run in besides float32/float64: an nn.Module casts to
them, but nobody said it works there, so what breaks there is a warning."""
WIDE_WINDOW = 1024
"""The window a window argument is given where the configuration has none (probes, and modules
not checked as windowed): wider than any generated sequence, so it never applies."""


class InferenceError(ConformanceError):
    """What can't be inferred, in one line, and the declaration that settles it (``remedy``,
    said by each front end in its own words)."""

    def __init__(self, message: str, remedy: Remedy | None = None) -> None:
        super().__init__(message)
        self.remedy = remedy


@contextlib.contextmanager
def declarations_read() -> Iterator[None]:
    """Where declarations are read: a declaration that says nothing valid (a
    :class:`DeclarationError`) is what can't be inferred, an InferenceError with its words."""
    try:
        yield
    except DeclarationError as error:
        raise InferenceError(str(error)) from error


CALL_REMEDY = Remedy((Option("call", "self", "call it as f(x[, mask])"),
                      Option("call", "qkv", "call it as f(q, k, v[, mask])"),
                      Option("call", "cross", "call it as f(x, context[, mask])")))
"""Where behaviour finds no way to call it: the call conventions."""

INSTANCE_ROUTE = ("; or build one yourself and check that instance (layer = Name(...) in a file, "
                  "then FILE.py::layer as the target)")
"""Where a class can't be built by the suite: the route that needs no constructor inferred."""

SIZES_REMEDY = Remedy((Option("width_arg", None, "name the model width's argument"),
                       Option("heads_arg", None, "name the head count's"),
                       Option("head_dim_arg", None, "name each head's width's")))
"""Where no constructor argument is found to set a size: the arguments that set them."""


PREFIX = "config."
"""How a field reads among the constructor's roles (``config.n_embd``), apart from arguments."""

class ConfigKind(str, Enum):
    """How the config for a build is made."""

    KEYWORDS = "keywords"
    """The layer's own class, called with the fields as keyword arguments (a dataclass, a
    ``CfgNode``, a ``PretrainedConfig``)."""
    NAMESPACE = "namespace"
    """A ``types.SimpleNamespace`` with the fields as attributes."""
    DICT = "dict"
    """A dict of the fields (the layer subscripts its config)."""


@dataclass(frozen=True)
class ConfigArgument:
    """The constructor parameter that takes a config object, the fields the layer reads from
    it, and how one is made (``kind``, of class ``cls``); ``base`` holds the value of each field
    that no role sets (its class's default, or the value it was recorded with)."""

    argument: str
    kind: ConfigKind
    cls: type | None
    fields: tuple[str, ...]
    base: tuple[tuple[str, object], ...]

    def build(self, values: dict[str, object]) -> object:
        """A config with ``values`` (field: value) over ``base``."""
        merged = {**dict(self.base), **values}
        if self.kind is ConfigKind.DICT:
            return merged
        if self.kind is ConfigKind.NAMESPACE or self.cls is None:
            return SimpleNamespace(**merged)
        return self.cls(**merged)

    def describe(self) -> str:
        made = (f"a {self.cls.__name__}" if self.kind is ConfigKind.KEYWORDS and self.cls
                else "a dict" if self.kind is ConfigKind.DICT else "a namespace")
        return (f"{self.argument} is a config object: it reads {', '.join(self.fields)}; built "
                f"as {made} of those fields (observed)")


@dataclass(frozen=True)
class Inferred:
    """The inferred declaration, and every inference in words (the report opens with them)."""

    implementation: Implementation
    notes: tuple[Note, ...]


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
        if mask is not None or convention.mask_required:
            kwargs[convention.mask] = mask
        if is_causal:
            kwargs[convention.causal] = True
        if convention.need_weights:
            kwargs.setdefault("need_weights", False)  # another path where one asks for it
        if convention.sequence_first:
            tensors = tuple(t.transpose(0, 1) for t in tensors)
        if convention.by_keyword:
            kwargs.update(zip(convention.inputs, tensors, strict=True))
            tensors = ()
        if convention.packed_only and convention.packed not in kwargs:
            output = self._packed(tensors[0], kwargs)
        else:
            output = self.inner(*tensors, **kwargs)
        cached = convention.cache is not None and convention.cache in options
        # A path that returns more (the weights beside the output): its output comes first.
        switched = any(switch[0] in options for switch in convention.switches)
        if isinstance(output, tuple) and (cached or self.tuple_output or switched):
            if convention.sequence_first and isinstance(output[0], torch.Tensor):
                output = (output[0].transpose(0, 1), *output[1:])
            return output if cached else output[0]
        if convention.sequence_first and isinstance(output, torch.Tensor):
            output = output.transpose(0, 1)
        return output


    def _packed(self, x: torch.Tensor, kwargs: dict[str, object]) -> object:
        """A batch (B, L, D) through a packed-only forward: the B sequences packed (B * L, D)
        with offsets 0, L, 2L, ..., and the output (or a tuple's first element) unpacked."""
        batch, length, _ = x.shape
        kwargs[self.convention.packed] = torch.arange(0, (batch + 1) * length, length,
                                                      dtype=torch.int32, device=x.device)
        if self.convention.max_seqlen:
            kwargs[self.convention.max_seqlen] = length
        output = self.inner(x.reshape(batch * length, -1), **kwargs)

        def unpacked(tensor: object) -> object:
            if isinstance(tensor, torch.Tensor) and tensor.dim() == 2:
                return tensor.reshape(batch, length, -1)
            return tensor

        if isinstance(output, tuple) and output:
            return (unpacked(output[0]), *output[1:])
        return unpacked(output)


@dataclass
class Plan:
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
    fixed_heads: int = 1
    """The head count of a module no argument gives one: 1 until its weights say otherwise
    (see :mod:`conformance.inference.construction.fixed_sizes`)."""
    fixed_width: int | None = None
    """The width of a module built with no arguments (no constructor argument sets one), or of
    the instance checked as it is."""
    instance: nn.Module | None = None
    """An instance checked as it is: every build is a deep copy of it (its configuration and
    weights), never a new one, and the instance itself is never changed."""
    length: int | None = None
    """The one input length the module takes (found by trial, see
    :mod:`conformance.inference.construction.fixed_length`); None for any."""
    length_window: int | None = None
    """The window argument's value it is built with where that argument sets its one length
    (Swin's ``window_size``), in place of a window wider than any sequence."""
    queries: int | None = None
    """Queries the module holds itself (its output's rows for inputs of any length): found by
    behaviour, see :mod:`conformance.inference.steps.latent`."""
    config_argument: ConfigArgument | None = None
    """The constructor argument that takes a config object, where one does: the roles naming
    its fields (``config.n_embd``) are set on a config made for each build."""

    def head_count(self) -> int | None:
        """The head count every configuration has, None where an argument sets it."""
        return None if self.roles.heads else self.fixed_heads

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
            kwargs[roles.context] = context_length(config.q_len, config.kv_len)
        if roles.batch_first:
            kwargs[roles.batch_first] = True
        if roles.kv_heads:
            kwargs[roles.kv_heads] = config.kv_heads
        if roles.kv_group:
            kwargs[roles.kv_group] = config.num_heads // config.kv_heads
        if roles.window:
            kwargs[roles.window] = (config.window + self.window_offset
                                    if config.window is not None
                                    else self.length_window or WIDE_WINDOW)
        if roles.chunk:
            kwargs[roles.chunk] = WIDE_WINDOW if config.chunk is None else config.chunk
        if roles.max_batch:
            kwargs[roles.max_batch] = MAX_BATCH_SIZE
        kwargs.update(self.init)
        kwargs.update(config.settings)  # another value of a setting, asked for by a check
        if self.config_argument is not None:
            fields = {name.removeprefix(PREFIX): kwargs.pop(name) for name in list(kwargs)
                      if name.startswith(PREFIX)}
            kwargs[self.config_argument.argument] = self.config_argument.build(fields)
        return kwargs

    def instantiate(self, config: Config) -> nn.Module:
        """The class itself, built for ``config`` as declared (by keyword, or positionally)."""
        if self.instance is not None:
            return copy.deepcopy(self.instance)
        kwargs = self.arguments(config)
        args = [kwargs.pop(name) for name in self.positional]
        # What its constructor prints (nanoGPT's "using slow attention") is no forward's print,
        # and the suite builds it hundreds of times: kept off every output, here for every build.
        with contextlib.redirect_stdout(io.StringIO()):
            module = self.cls(*args, **kwargs)
        return materialised(self, module, config)

    def construct(self, config: Config) -> nn.Module:
        return InferredModule(self.instantiate(config), self.convention, self.tuple_output)

    def constructs(self, heads: int, head_dim: int) -> bool:
        """Whether the constructor accepts ``heads`` heads of ``head_dim``."""
        length = probe_length(3)
        config = Config(batch=2, q_len=length, kv_len=length, d_model=heads * head_dim,
                        num_heads=heads)
        try:
            self.instantiate(config)
        except Exception:  # the constructor's own validation, whatever it raises
            return False
        return True

    def builds(self, heads: int, head_dim: int) -> bool:
        """Whether the constructor accepts ``heads`` heads of ``head_dim``, and the forward
        then runs (RoPE's even head_dim is often the forward's to find out)."""
        length = probe_length(3)
        return runs(self, Config(batch=2, q_len=length, kv_len=length,
                                 d_model=heads * head_dim, num_heads=heads))

    def implementation(self, name: str, **capabilities: object) -> Implementation:
        declared = dict(call=self.convention.call, heads=self.head_count(),
                        max_len=CONTEXT_LENGTH if self.roles.context else None,
                        length=self.length,
                        cache=CacheForm(max_batch=MAX_BATCH_SIZE if self.roles.max_batch else None),
                        cross_attention=self.convention.call != "self",
                        floats=Dtypes(supported=ALL_DTYPES, assumed=ASSUMED_DTYPES))
        return Implementation(name, self.construct, Capabilities(**laid_over(declared, capabilities)))


def first_call(plan: Plan, config: Config,
               tracer: CoreTracer | None = None) -> torch.Tensor | tuple:
    """The class built for ``config`` and called once without a mask (its attention core
    recorded by ``tracer``, where one is given)."""
    wrapper = plan.construct(config).eval()
    # A packed-only forward is called through the wrapper, which packs the batch.
    return _called(plan, wrapper if plan.convention.packed_only else wrapper.inner, config,
                   tracer)


def runs(plan: Plan, config: Config, tracer: CoreTracer | None = None) -> bool:
    """Whether the class builds for ``config`` and its first call returns: what the constructor
    or the forward raises, whatever it is, says it takes no such configuration."""
    try:
        first_call(plan, config, tracer)
    except Exception:  # its own validation, whatever it raises
        return False
    return True


def output_of(plan: Plan, config: Config) -> torch.Tensor | None:
    """The output of its first call at ``config`` (a tuple's first element); None where building
    or calling it raises, or no tensor comes back."""
    try:
        output = first_call(plan, config)
    except Exception:  # its own validation, whatever it raises
        return None
    if isinstance(output, tuple) and output:
        output = output[0]
    return output if isinstance(output, torch.Tensor) else None


def _called(plan: Plan, module: nn.Module, config: Config,
            tracer: CoreTracer | None = None) -> torch.Tensor | tuple:
    """``module`` (the class's own, or the wrapper of a packed-only one) called once without a
    mask on random inputs of ``config``'s sizes, in its own convention."""
    shape = (config.batch, config.q_len, config.d_model)
    if plan.convention.sequence_first:
        shape = (config.q_len, config.batch, config.d_model)
    count = {"self": 1, "latent": 1, "cross": 2}.get(plan.convention.call, 3)
    inputs = [torch.randn(shape) for _ in range(count)]
    kwargs = (dict(zip(plan.convention.inputs, inputs, strict=True)) if plan.convention.by_keyword
              else {})
    if plan.convention.mask_required and not plan.convention.packed_only:  # None: no mask
        kwargs[plan.convention.mask] = None
    argument = plan.convention.position_argument
    if argument and plan.convention.position_required:  # a call without it can't be made
        kwargs[argument] = positions_argument(FILLABLE_POSITIONS[argument], 0, config.batch,
                                              config.q_len, "cpu")
    if tracer is not None:
        tracer.taint(*inputs)
    call = (f"the forward with no mask, batch {config.batch}, {config.q_len} tokens, its first "
            f"call at width {config.d_model}")
    with in_flight.under_way(call), torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), \
            tracer or contextlib.nullcontext():
        return module(**kwargs) if plan.convention.by_keyword else module(*inputs, **kwargs)


def materialised(plan: Plan, module: nn.Module, config: Config) -> nn.Module:
    """``module`` with its lazy parameters (``nn.LazyLinear``: shapes read from a first call)
    made, by one call at ``config``'s sizes, so that its weights can be read and written; the
    random state is kept, so a build stays reproducible. A call that fails leaves them lazy:
    the checks report the failing call."""
    if not any(is_lazy(p) for p in module.parameters()):
        return module
    # In eval mode: a dropout before a lazy layer would draw from the random state its
    # initialisation then draws from, and builds at two rates would differ. Whatever the forward
    # raises is the checks' to report.
    training = module.training
    with torch.random.fork_rng(devices=[]), contextlib.suppress(Exception):
        _called(plan, module.eval(), replace(config, dtype=torch.float32))
    return module.train(training)
