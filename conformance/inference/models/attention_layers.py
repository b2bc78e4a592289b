"""A model's attention layers, found by behaviour: one forward of the model on inputs the suite
makes, and the smallest submodules with parameters inside whose forward a softmax or SDPA ran
(not the class names). Layers of one class are one kind: one of each is checked, naming every
path it stands for.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

CORES = frozenset(f for f in (torch.softmax, F.softmax, torch.Tensor.softmax,
                              F.scaled_dot_product_attention, F.multi_head_attention_forward,
                              getattr(torch, "_native_multi_head_attention", None))
                   if f is not None)
"""The calls that make an attention core (``nn.MultiheadAttention``'s, fused in eval, too)."""


class _Seen(TorchFunctionMode):
    def __init__(self, stack: list[tuple[str, nn.Module]], found: dict[str, nn.Module]) -> None:
        super().__init__()
        self.stack, self.found = stack, found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in CORES:
            owner = next(((name, module) for name, module in reversed(self.stack)
                          if any(True for _ in module.parameters())), None)
            if owner is not None and owner[0]:
                self.found.setdefault(owner[0], owner[1])
        return func(*args, **(kwargs or {}))


def attention_paths(model: nn.Module, run) -> dict[str, nn.Module]:
    """The paths of ``model``'s attention layers, in the order its forward reached them, each
    with its module, from one ``run(model)``."""
    stack: list[tuple[str, nn.Module]] = []
    found: dict[str, nn.Module] = {}
    handles = []
    def enter(name: str, module: nn.Module) -> None:
        stack.append((name, module))

    def leave() -> None:  # a hook that returns something replaces the output: this returns None
        stack.pop()

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(
            lambda m, a, name=name: enter(name, m)))
        handles.append(module.register_forward_hook(lambda m, a, o: leave()))
    try:
        with torch.no_grad(), _Seen(stack, found):
            run(model)
    finally:
        for handle in handles:
            handle.remove()
    return found


def kinds(found: dict[str, nn.Module], config: object = None,
          sides: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The layers grouped by class, by their side of an encoder-decoder where ``sides`` gives
    one (encoder self, decoder self, cross: one class serves all three in BART) and, where the
    model's config gives its layers types that differ (``layer_types``: Gemma 2's alternating
    sliding and full layers), by type too; each group's paths in the forward's order."""
    types = getattr(config, "layer_types", None)
    labels = {}
    for path, module in found.items():
        index = getattr(module, "layer_idx", None)
        labels[path] = (types[index] if isinstance(types, (list, tuple)) and
                        isinstance(index, int) and 0 <= index < len(types) else None)
    split = len(set(labels.values())) > 1
    groups: dict[str, list[str]] = {}
    for path, module in found.items():
        said = [(sides or {}).get(path), labels[path] if split else None]
        said = [label for label in said if label]
        kind = type(module).__name__ + (f" ({', '.join(said)})" if said else "")
        groups.setdefault(kind, []).append(path)
    return groups
