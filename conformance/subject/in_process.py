"""The in-process implementation of the boundary: an implementation's module built and called in this
process, on copies of its inputs, what it prints or writes into them recorded, not propagated.

:class:`InProcessSubject` is what every check runs on unless the implementation is isolated
(:mod:`conformance.worker` runs this same code in the worker process).
"""

from __future__ import annotations

import contextlib
import io
import traceback
from dataclasses import replace

import torch
from torch import nn

from conformance.errors import one_line
from conformance.model.core import CoreObservation
from conformance.model.forms import PackedForm
from conformance.model.spec import Config, Implementation
from conformance.model.weights import HeadWeights, WeightLayoutError
from conformance.subject import in_flight
from conformance.subject.attention_core import sites
from conformance.subject.boundary import (
    NOT_A_PLAIN_TENSOR,
    NOT_A_TENSOR,
    CapabilityError,
    Gradients,
    ImplementationError,
    Inputs,
    Instance,
    Subject,
)
from conformance.subject.cache_session import CacheProtocolError, CacheSession
from conformance.subject.call_arguments import block_diagonal, cu_seqlens, positions_argument
from conformance.subject.core_trace import CoreTracer
from conformance.subject.masks import MaskEncodingError, encode_mask


class InProcessSubject(Subject):
    """A registered :class:`Implementation` run in this process."""

    def __init__(self, implementation: Implementation) -> None:
        self.implementation = implementation
        self.name = implementation.name
        self.capabilities = implementation.capabilities
        self.expected_failures = dict(implementation.expected_failures)
        self.expected_warnings = dict(implementation.expected_warnings)
        self.notes = implementation.notes

    def instantiate(self, config: Config, seed: int) -> Instance:
        return ModuleInstance(self.implementation, config, seed)

    def twin(self) -> InProcessSubject:
        """Itself: the fork copies it (its only state is its implementation's)."""
        return self

    def describe(self) -> str:
        text = self.capabilities.describe()
        if self.implementation.weight_layout is not None:
            text += f"; {self.implementation.weight_layout.describe()}"
        return text


def _where(error: BaseException) -> str:
    """`` (file.py:12)``: where the innermost frame of ``error`` was, for a user to look."""
    if error.__traceback__ is None:
        return ""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f" ({frame.filename}:{frame.lineno})"


def _written(given: torch.Tensor, original: torch.Tensor) -> bool:
    """Whether the copy ``given`` to the implementation no longer holds ``original``'s values
    (NaN where NaN was counts as held). Exact equality settles the common case in one
    comparison; only where it fails (a write, or a NaN) are NaNs compared as equal."""
    given, original = given.detach(), original.detach()
    if torch.equal(given, original):
        return False
    return not torch.equal(torch.nan_to_num(given), torch.nan_to_num(original))


class ModuleInstance(Instance):
    """An implementation built in this process; its module lives here."""

    def __init__(self, implementation: Implementation, config: Config, seed: int) -> None:
        self.config = config
        self._implementation = implementation
        self._capabilities = implementation.capabilities
        self._printed = io.StringIO()
        self._input_writes: list[str] = []
        self._cache = CacheSession(implementation.capabilities, config)
        try:
            with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(self._printed):
                seed_generators(seed, "cpu")
                module = implementation.factory(config)
        except Exception as error:
            raise ImplementationError(f"constructing it raised {one_line(error)}"
                                      f"{_where(error)}") from error
        if isinstance(module, nn.Module):
            module = module.to(device=config.device, dtype=config.dtype).eval()
        elif not callable(module):
            raise ImplementationError(
                f"its factory returned {type(module).__name__}, not an nn.Module or callable")
        self.module = module

    @property
    def stdout(self) -> str:
        return self._printed.getvalue()

    @property
    def input_writes(self) -> list[str]:
        return list(self._input_writes)

    def _call(self, inputs: Inputs, training: bool,
              tracer: CoreTracer | None = None) -> torch.Tensor:
        caps = self._capabilities
        # The implementation gets copies: an in-place write is recorded, never propagated.
        named = ({"x": inputs.query} if caps.call == "self" else
                 {"key": inputs.key} if caps.call == "latent" else  # its queries are its own
                 {"query": inputs.query, "key": inputs.key} if caps.call == "cross" else
                 {"query": inputs.query, "key": inputs.key, "value": inputs.value})
        copies = {name: tensor.clone() for name, tensor in named.items()}
        if tracer is not None:
            tracer.taint(*copies.values())
        args: list[object] = list(copies.values())
        kwargs: dict[str, object] = dict(inputs.options)
        batch, q_len = inputs.query.shape[:2]
        flat = inputs.segments is not None and caps.packing.form is PackedForm.CU_SEQLENS_FLAT
        keep = inputs.keep
        if inputs.segments is not None:
            keep = self._packed(inputs, kwargs, keep)
            if flat:
                args = [tensor[0] for tensor in args]
        if keep is not None:
            convention = inputs.mask_convention or caps.mask
            if convention is None:
                raise CapabilityError(f"{self._implementation.name} declares no mask")
            try:
                mask = encode_mask(keep, convention, num_heads=self.config.num_heads,
                                   q_len=q_len, dtype=inputs.query.dtype, causal=inputs.causal,
                                   window=self.config.window, chunk=self.config.chunk)
            except MaskEncodingError as error:
                raise CapabilityError(f"{self._implementation.name}: {error}") from error
            if convention.argument:
                kwargs[convention.argument] = mask
            else:
                args.append(mask)
        if inputs.causal:
            if caps.causality.kind == "never":
                raise CapabilityError(f"{self._implementation.name} is not causal")
            if caps.causality.kind == "optional":
                kwargs[caps.causality.argument] = True
        if caps.position.argument:
            kwargs[caps.position.argument] = positions_argument(caps.position.form, inputs.position,
                                                        batch, q_len, inputs.query.device)
        elif inputs.position and not inputs.cache:
            raise CapabilityError(f"{self._implementation.name} declares no position argument")
        if inputs.cache:
            if caps.cache.style is None:
                raise CapabilityError(f"{self._implementation.name} declares no KV cache")
            try:
                kwargs.update(self._cache.arguments(inputs.position, batch, q_len,
                                                    inputs.query.device))
            except ValueError as error:
                raise CapabilityError(f"{self._implementation.name}: {error}") from error
            except CacheProtocolError as error:
                raise ImplementationError(str(error)) from error
        if isinstance(self.module, nn.Module):
            self.module.train(training)
        try:
            with in_flight.under_way(in_flight.describe(inputs, training)), \
                    contextlib.redirect_stdout(self._printed), tracer or contextlib.nullcontext():
                output = self.module(*args, **kwargs)
        except Exception as error:
            raise ImplementationError(f"forward raised {one_line(error)}") from error
        if inputs.cache:
            try:
                output = self._cache.collect(output, q_len)
            except CacheProtocolError as error:
                raise ImplementationError(str(error)) from error
        for name, tensor in named.items():
            if name not in self._input_writes and _written(copies[name], tensor):
                self._input_writes.append(name)
        if not isinstance(output, torch.Tensor):
            raise ImplementationError(
                f"forward returned {type(output).__name__}, {NOT_A_TENSOR}")
        if caps.returns_tensor and type(output) not in (torch.Tensor, nn.Parameter):
            raise ImplementationError(f"forward returned {type(output).__name__} (a subclass "
                                      f"of torch.Tensor), {NOT_A_PLAIN_TENSOR}: it is declared "
                                      "to return one plain tensor")
        return output[None] if flat else output

    def _packed(self, inputs: Inputs, kwargs: dict[str, object],
                keep: torch.Tensor | None) -> torch.Tensor | None:
        """Add the declared packed form of ``inputs.segments`` to ``kwargs``; the mask to pass
        (a block-diagonal one where packing goes through the mask)."""
        caps = self._capabilities
        if caps.packing.form is None:
            raise CapabilityError(f"{self._implementation.name} declares no packed sequences")
        if sum(inputs.segments) != inputs.query.shape[1]:
            raise CapabilityError(f"segments {inputs.segments} don't cover "
                                  f"{inputs.query.shape[1]} tokens")
        if caps.packing.form is PackedForm.MASK:
            if keep is not None:
                raise CapabilityError("packed sequences through the mask take no other mask")
            return block_diagonal(inputs.segments, inputs.query.shape[0], False,
                                  inputs.query.device)
        if inputs.query.shape[0] != 1:
            raise CapabilityError("sequences packed with cu_seqlens come as one batch element")
        kwargs[caps.packing.argument] = cu_seqlens(inputs.segments, inputs.query.device)
        if caps.packing.max_seqlen_argument:
            kwargs[caps.packing.max_seqlen_argument] = max(inputs.segments)
        return keep

    def forward(self, inputs: Inputs, *, training: bool = False, seed: int | None = None,
                autograd: bool = False) -> torch.Tensor:
        if seed is None:  # free-running randomness: forking would replay it and hide it
            with torch.set_grad_enabled(autograd):
                return self._call(inputs, training).detach()
        with torch.random.fork_rng(devices=_rng_devices(self.config.device)), \
                torch.set_grad_enabled(autograd):
            seed_generators(seed, self.config.device)
            return self._call(inputs, training).detach()

    def observe(self, inputs: Inputs) -> CoreObservation:
        tracer = CoreTracer()
        with torch.no_grad():
            output = self._call(inputs, training=False, tracer=tracer).detach()
        found = sites(tracer, q_len=inputs.query.shape[1], kv_len=inputs.key.shape[1])
        return CoreObservation(found, output)

    def _leaves(self, inputs: Inputs) -> tuple[dict[str, torch.Tensor], Inputs]:
        """Fresh leaf tensors requiring grad, and the inputs rebuilt from them."""
        if self._capabilities.call == "self":
            leaves = {"x": inputs.query.detach().clone().requires_grad_(True)}
            return leaves, inputs.with_tensors(leaves["x"])
        if self._capabilities.call in ("cross", "latent"):
            names = ("key",) if self._capabilities.call == "latent" else ("query", "key")
            leaves = {name: getattr(inputs, name).detach().clone().requires_grad_(True)
                      for name in names}
            return leaves, replace(inputs, query=leaves.get("query", inputs.query),
                                   key=leaves["key"], value=leaves["key"])
        leaves = {name: getattr(inputs, name).detach().clone().requires_grad_(True)
                  for name in ("query", "key", "value")}
        return leaves, replace(inputs, query=leaves["query"], key=leaves["key"],
                               value=leaves["value"])

    def _parameters(self) -> dict[str, torch.Tensor]:
        if not isinstance(self.module, nn.Module):
            return {}
        return {name: p for name, p in self.module.named_parameters() if p.requires_grad}

    def gradients(self, inputs: Inputs, cotangent: torch.Tensor) -> Gradients:
        leaves, call_inputs = self._leaves(inputs)
        parameters = self._parameters()
        for parameter in parameters.values():
            parameter.grad = None
        with torch.enable_grad(), _calls_recorded(self.module) as called:
            output = self._call(call_inputs, training=False)
            if not output.requires_grad:
                raise ImplementationError("the output does not require grad: is autograd cut?")
            try:
                output.backward(cotangent)
            except Exception as error:
                raise ImplementationError(f"backward raised {one_line(error)}") from error
        grads = {name: leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
                 for name, leaf in leaves.items()}
        params = {name: None if p.grad is None else p.grad.detach().clone()
                  for name, p in parameters.items()}
        layout = self._implementation.weight_layout
        projections = layout.paths() if layout is not None else ()
        unused = tuple(name for name, grad in params.items()
                       if grad is None and name.rpartition(".")[0] not in called
                       and not any(name == path or name.startswith(f"{path}.") or not path
                                   for path in projections))
        return Gradients(output.detach(), grads, params, unused)

    def _layout(self):
        layout = self._implementation.weight_layout
        if layout is None or not isinstance(self.module, nn.Module):
            raise CapabilityError(f"{self._implementation.name} declares no weight access")
        return layout

    def read_weights(self) -> HeadWeights:
        try:
            return self._layout().read(self.module, self.config.num_heads,
                                       self.config.num_kv_heads)
        except WeightLayoutError as error:
            raise ImplementationError(f"reading its weights failed: {error}") from error

    def write_weights(self, weights: HeadWeights) -> None:
        try:
            self._layout().write(self.module, weights)
        except WeightLayoutError as error:
            raise ImplementationError(f"writing its weights failed: {error}") from error


@contextlib.contextmanager
def _calls_recorded(module: object):
    """While open, the paths of the submodules (of ``module``, itself as "") the forward
    calls collect in the yielded set."""
    called: set[str] = {""}
    if not isinstance(module, nn.Module):
        yield called
        return
    handles = [child.register_forward_pre_hook(lambda *_, path=path: called.add(path))
               for path, child in module.named_modules() if path]
    try:
        yield called
    finally:
        for handle in handles:
            handle.remove()


def seed_generators(seed: int, device: str) -> None:
    """Seed the default generator of the CPU and, for a CUDA device, of that device only.

    Not ``torch.manual_seed``: it also seeds every lazily initialised accelerator generator,
    and on a machine without them each call formats a stack trace (milliseconds a call).
    """
    torch.default_generator.manual_seed(seed)
    if device.startswith("cuda"):
        with torch.cuda.device(torch.device(device)):
            torch.cuda.manual_seed(seed)


def _rng_devices(device: str) -> list[int]:
    if device.startswith("cuda"):
        index = torch.device(device).index
        return [torch.cuda.current_device() if index is None else index]
    return []
