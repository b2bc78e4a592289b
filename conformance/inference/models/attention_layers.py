"""A model's attention layers, found by behaviour: one forward of the model on inputs the suite
makes, and the smallest submodules with parameters inside whose forward a softmax or SDPA ran
(not the class names). Layers of one class are one kind: one of each is checked, naming every
path it stands for.

Attention is where the tokens' queries meet the tokens' keys: a softmax normalises over the
tokens (and, with sinks, one logit more). A softmax over an axis no tensor the module was called
with has (the tokens are its inputs' axes, the features aside) normalises over something the
module holds: a router's or an expert gate's experts, whose other operand is a parameter. Such a
module is seen and skipped (:func:`seen_not_attention`), never checked as attention.
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


SOFTMAXES = frozenset((torch.softmax, F.softmax, torch.Tensor.softmax))


def _normalised(args: tuple, kwargs: dict) -> int | None:
    """The size of the axis a softmax call normalises over (None where it can't be read)."""
    tensor = args[0] if args else kwargs.get("input")
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if not isinstance(tensor, torch.Tensor) or not isinstance(dim, int) or not tensor.dim():
        return None
    return int(tensor.shape[dim]) if -tensor.dim() <= dim < tensor.dim() else None


def _token_axes(args: tuple, kwargs: dict) -> frozenset[int]:
    """The sizes of the axes of the tensors a module is called with, their last (features)
    aside: where its tokens are."""
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    return frozenset(size for t in tensors for size in t.shape[:-1])


class _Seen(TorchFunctionMode):
    def __init__(self, stack: list[tuple[str, nn.Module, frozenset[int]]],
                 found: dict[str, nn.Module], skipped: dict[str, int]) -> None:
        super().__init__()
        self.stack, self.found, self.skipped = stack, found, skipped

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in CORES:
            owner = next(((name, module, axes) for name, module, axes in reversed(self.stack)
                          if any(True for _ in module.parameters())), None)
            if owner is not None and owner[0] and owner[0] not in self.found:
                size = _normalised(args, kwargs or {}) if func in SOFTMAXES else None
                # One more than a token axis: the keys and a sink logit per head (gpt-oss).
                if size is not None and owner[2] and not {size, size - 1} & owner[2]:
                    self.skipped.setdefault(owner[0], size)  # over what it holds: no tokens
                else:
                    self.found[owner[0]] = owner[1]
                    self.skipped.pop(owner[0], None)
        return func(*args, **(kwargs or {}))


def attention_paths(model: nn.Module, run, skipped: dict[str, int] | None = None
                    ) -> dict[str, nn.Module]:
    """The paths of ``model``'s attention layers, in the order its forward reached them, each
    with its module, from one ``run(model)``; into ``skipped``, the paths of modules seen to
    run a softmax over no axis of their inputs, each with that axis' size."""
    stack: list[tuple[str, nn.Module, frozenset[int]]] = []
    found: dict[str, nn.Module] = {}
    skipped = {} if skipped is None else skipped
    handles = []

    def enter(name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        stack.append((name, module, _token_axes(args, kwargs)))

    def leave() -> None:  # a hook that returns something replaces the output: this returns None
        stack.pop()

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(
            lambda m, a, k, name=name: enter(name, m, a, k), with_kwargs=True))
        handles.append(module.register_forward_hook(lambda m, a, o: leave()))
    try:
        with torch.no_grad(), _Seen(stack, found, skipped):
            run(model)
    finally:
        for handle in handles:
            handle.remove()
    return found


def seen_not_attention(skipped: dict[str, int]) -> str | None:
    """The modules a search saw run a softmax over no axis of their inputs (a router's
    experts), in words; None where there were none."""
    if not skipped:
        return None
    shown = ", ".join(f"{path} (a softmax over {size}, no axis of its inputs)"
                      for path, size in list(skipped.items())[:3])
    more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return (f"seen and skipped, not attention: {shown}{more}: their softmax normalises over "
            "something they hold (a router's experts, a gate), not over tokens")


def kinds(found: dict[str, nn.Module], config: object = None,
          sides: dict[str, str] | None = None) -> dict[str, list[str]]:
    """The layers grouped by class, by their side of an encoder-decoder where ``sides`` gives
    one (encoder self, decoder self, cross: one class serves all three in BART) and, where the
    model's config gives its layers types that differ (``layer_types``: Gemma 2's alternating
    sliding and full layers; GPT-Neo's ``attention_layers``), by type too; each group's paths
    in the forward's order."""
    types = getattr(config, "layer_types", None) or getattr(config, "attention_layers", None)
    labels = {}
    for path, module in found.items():
        index = getattr(module, "layer_idx", getattr(module, "layer_id", None))
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
