"""What a forward does with its submodules, observed with hooks: which parameter-bearing
submodules it calls, on which inputs, with which outputs; which parameters it uses at all; and
what happens when one submodule's output is nudged (an intervention)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Called:
    """One call of a submodule that holds parameters of its own: its path under the traced root,
    the tensors it was given (positional, then keyword), and the first tensor it returned."""

    path: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    output: torch.Tensor | None


def _first_tensor(value: object) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def holds_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def record_calls(root: nn.Module, run: Callable[[], object]) -> tuple[object, list[Called]]:
    """Run ``run`` with every submodule of ``root`` that holds parameters of its own hooked;
    its result and the calls, in the order they returned."""
    calls: list[Called] = []
    handles = []

    def hook(path: str):
        def record(module, args, kwargs, output):
            # Copies: the forward may change a tensor in place after this call.
            tensors = tuple(a.detach().clone() for a in (*args, *kwargs.values())
                            if isinstance(a, torch.Tensor))
            first = _first_tensor(output)
            calls.append(Called(path, module, tensors,
                                None if first is None else first.detach().clone()))
        return record

    for path, module in root.named_modules():
        if path and holds_parameters(module):
            handles.append(module.register_forward_hook(hook(path), with_kwargs=True))
    try:
        result = run()
    finally:
        for handle in handles:
            handle.remove()
    return result, calls


def used_parameters(root: nn.Module, run: Callable[[], object]) -> set[str]:
    """Names of the parameters of ``root`` that the output of ``run`` depends on (those that get
    a gradient from it)."""
    parameters = dict(root.named_parameters())
    saved = {name: p.requires_grad for name, p in parameters.items()}
    for p in parameters.values():
        p.requires_grad_(True)
        p.grad = None
    try:
        with torch.enable_grad():
            output = _first_tensor(run())
            if output is None or not output.requires_grad:
                return set()
            output.sum().backward()
        return {name for name, p in parameters.items() if p.grad is not None}
    finally:
        for name, p in parameters.items():
            p.grad = None
            p.requires_grad_(saved[name])


@contextlib.contextmanager
def intervention(module: nn.Module,
                 change: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """While open, ``module``'s output (its first tensor) is replaced by ``change(output)``."""
    def replace_output(_module, _args, output):
        if isinstance(output, torch.Tensor):
            return change(output)
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            return (change(output[0]), *output[1:])
        return output

    handle = module.register_forward_hook(replace_output)
    try:
        yield
    finally:
        handle.remove()


class _LowerPrecision(torch.overrides.TorchFunctionMode):
    """Records the torch functions that return a float32 / half tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, None] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in (result if isinstance(result, (tuple, list)) else (result,)):
            if isinstance(value, torch.Tensor) and value.dtype in (
                    torch.float32, torch.float16, torch.bfloat16):
                self.seen.setdefault(getattr(func, "__name__", str(func)), None)
        return result


def lower_precision_parts(run: Callable[[], object]) -> list[str]:
    """The torch functions that produce float32 (or half) tensors while ``run`` computes in
    float64: the parts of a float64 forward that compute at a lower precision (HuggingFace's
    RoPE tables and float32 softmax, say)."""
    mode = _LowerPrecision()
    with mode:
        run()
    return list(mode.seen)


def same_values(a: torch.Tensor, b: torch.Tensor, tolerance: float = 1e-9) -> bool:
    """Whether two tensors hold the same values (to ``tolerance`` relative), allowing the
    sequence and batch axes to be swapped (a sequence-first module's internals)."""
    a, b = a.detach(), b.detach()
    candidates = [b]
    if b.dim() >= 2:
        candidates.append(b.transpose(0, 1))
    if b.dim() == 3:  # a packed module's internals: the batch's sequences one after another
        candidates.append(b.reshape(-1, b.shape[-1]))
    for other in candidates:
        if other.shape == a.shape and a.is_floating_point() and other.is_floating_point():
            if not torch.equal(torch.isnan(a), torch.isnan(other)):
                continue
            # NaN where both are NaN (a row with nothing to attend to) counts as the same.
            x, y = torch.nan_to_num(a.double()), torch.nan_to_num(other.double())
            scale = max(1.0, float(x.abs().max()) if x.numel() else 1.0)
            if float((x - y).abs().max()) <= tolerance * scale:
                return True
    return False
