"""Step 1 of finding weights by behaviour (:mod:`conformance.inference.weights.weight_search`): a traced
float64 forward, the parameter-holding submodules it calls, which of them read a model input,
which one's output is the module's output, and which parameters the output depends on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from conformance.inference.observing.tracing import Called, record_calls, same_values
from conformance.model.declared_layouts import (
    is_conv1d,
)
from conformance.subject.boundary import Inputs
from conformance.subject.in_process import ModuleInstance


@dataclass(frozen=True)
class Source:
    """A called layer with a 2-D weight: where it is, what it reads and gives."""

    path: str
    rows: int
    cols: int
    reads: str | None
    """The model input it reads ("x", "query", "key", "value"), or None; for a layer that
    reads something of a model input's shape, that input with a ``~`` ("~x"); for a layer the
    forward never calls, "unused"."""
    gives_output: bool


@dataclass
class Trace:
    """What one float64 forward showed."""

    inputs: Inputs
    output: torch.Tensor
    calls: list[Called]
    sources: list[Source]
    packed: list[str]
    """Paths of called nn.MultiheadAttention-like modules (a packed ``in_proj_weight``)."""
    used: set[str]
    """Parameters (by name under the root) the output depends on."""
    rerun: Callable[[], torch.Tensor]
    """The same call again (with whatever interventions are open)."""


def same_shape(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``b`` has ``a``'s shape, or its first two axes swapped, or (packed) ``a``'s
    first two axes flattened."""
    return a.shape == b.shape or (a.dim() >= 2 and a.transpose(0, 1).shape == b.shape) or (
        a.dim() == 3 and a.reshape(-1, a.shape[-1]).shape == b.shape)


def weight_of(module: nn.Module) -> torch.Tensor | None:
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return weight
    return None


def trace(instance: ModuleInstance, inputs: Inputs) -> Trace:
    """Run ``instance`` once on ``inputs`` with every parameter-holding submodule hooked."""
    root = instance.module
    # A layer driven through its model (subject/layer_in_model.py) names its own subtree: the
    # model's other layers are its harness, neither its weights nor spare ones of it.
    scope = next((f"{path}.{own}" if path else own for path, own in
                  ((path, getattr(module, "weights_scope", None))
                   for path, module in root.named_modules()) if isinstance(own, str)), None)

    def inside(path: str) -> bool:
        return scope is None or path == scope or path.startswith(scope + ".")

    output, calls = record_calls(root, lambda: instance.forward(inputs))
    named = ({"x": inputs.query} if inputs.is_self else
             {"query": inputs.query, "context": inputs.key} if inputs.shares_kv else
             {"query": inputs.query, "key": inputs.key, "value": inputs.value})
    sources, packed, seen = [], [], set()
    for call in calls:
        if call.path in seen or not inside(call.path):
            continue
        seen.add(call.path)
        if getattr(call.module, "in_proj_weight", None) is not None:
            packed.append(call.path)
            continue
        weight = weight_of(call.module)
        if weight is None or not call.inputs or call.output is None:
            continue
        rows, cols = (weight.shape[1], weight.shape[0]) if is_conv1d(call.module) else weight.shape
        if call.inputs[0].shape[-1] != cols or call.output.shape[-1] != rows:
            continue
        reads = next((name for name, tensor in named.items()
                      if same_values(call.inputs[0], tensor)), None)
        if reads is None:
            reads = next((f"~{name}" for name, tensor in named.items()
                          if same_shape(call.inputs[0], tensor)), None)
        sources.append(Source(call.path, rows, cols, reads, same_values(call.output, output)))
    for path, module in root.named_modules():
        weight = weight_of(module)
        if path and path not in seen and weight is not None and inside(path) and not any(
                path.startswith(p + ".") for p in packed):
            rows, cols = (weight.shape[1], weight.shape[0]) if is_conv1d(module) else weight.shape
            sources.append(Source(path, rows, cols, "unused", False))
    cotangent = torch.ones_like(output)
    gradients = instance.gradients(inputs, cotangent)
    used = {name for name, grad in gradients.parameters.items() if grad is not None}
    return Trace(inputs, output, calls, sources, packed, used,
                 lambda: instance.forward(inputs))
