"""An attention layer driven through its own model: the case's hidden states replace the
layer's input, everything else the layer receives (position embeddings, the mask in the model's
own form, cache positions) is what the model computes for the case's length and padding, fed
through the model's own ``attention_mask``, and the rest of the forward is skipped.

So every convention is the model's, none guessed: :class:`LayerInModel` is an ``nn.Module`` whose
forward is ``f(x, attention_mask=None)`` over (B, L, D) hidden states and a (B, L) keep mask, and
inference reads it as it reads any layer (its weights are the layer's own projections, which
the suite reads and writes in place). The model's other parameters are its harness, frozen: only
the layer's are judged.
"""

from __future__ import annotations

import torch
from torch import nn


class _Reached(Exception):
    """Raised by the layer's forward hook: its output is taken, the rest of the model skipped."""


class LayerInModel(nn.Module):
    """The layer at ``path`` of ``model``, called through ``model``'s own forward.

    ``ids``: the model takes token ids (an embedding first): zeros of the case's shape are
    passed, and the layer's input is replaced; otherwise the hidden states themselves are its
    first input. ``options``: keywords every call passes (``use_cache=False`` for a
    ``transformers`` model: no cache object between the suite's calls)."""

    def __init__(self, model: nn.Module, path: str, *, ids: bool,
                 options: dict[str, object] | None = None) -> None:
        super().__init__()
        self.model, self.path, self.ids = model, path, ids
        self.options = dict(options or {})
        self.layer = model.get_submodule(path)
        self.weights_scope = f"model.{path}"
        """Where its weights are (the weight trace reads this): the layer's own submodules."""
        judged = {id(p) for p in self.layer.parameters()}
        for parameter in model.parameters():
            if id(parameter) not in judged:
                parameter.requires_grad_(False)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        reached: dict[str, object] = {}

        def replace_input(module, args, kwargs):
            # The hidden states, wherever the model passes the same tensor again (as key and
            # value to a self-attention called f(h, h, h)).
            given = args[0] if args else kwargs.get("hidden_states")
            args = tuple(x if a is given else a for a in args)
            kwargs = {k: x if v is given else v for k, v in kwargs.items()}
            if given is None:
                kwargs["hidden_states"] = x
            return args, kwargs

        def take_output(module, args, output):
            reached["output"] = output
            raise _Reached

        before = self.layer.register_forward_pre_hook(replace_input, with_kwargs=True)
        after = self.layer.register_forward_hook(take_output)
        first = (torch.zeros(x.shape[:2], dtype=torch.long, device=x.device) if self.ids else x)
        options = dict(self.options)
        if attention_mask is not None:
            options["attention_mask"] = attention_mask
        try:
            self.model(first, **options)
        except _Reached:
            pass
        finally:
            before.remove()
            after.remove()
        if "output" not in reached:
            raise RuntimeError(f"the model's forward did not reach {self.path}")
        output = reached["output"]
        return output[0] if isinstance(output, tuple) else output


class UnmaskedLayerInModel(LayerInModel):
    """A layer in a model whose forward takes no ``attention_mask``: called without one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)
