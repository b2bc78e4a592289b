"""An attention layer driven through its own model: the case's hidden states replace the
layer's input, everything else the layer receives (position embeddings, the mask in the model's
own form, cache positions, a relative bias the model computes) is what the model computes for
the case's length and padding, fed through the model's own mask argument, and the rest of the
forward is skipped.

So every convention is the model's, none guessed: :class:`LayerInModel` is an ``nn.Module`` whose
forward is ``f(x, attention_mask=None)`` over (B, L, D) hidden states and a (B, L) keep mask
(``f(x, context, attention_mask=None)`` for a cross-attention layer, the mask over the context's
keys), and inference reads it as it reads any layer (its weights are the layer's own
projections, which the suite reads and writes in place). The model's other parameters are its
harness, frozen: only the layer's are judged.

Which inputs reach the layer is its :class:`Feed`: its side of an encoder-decoder, the model's
first input (token ids, the hidden states themselves, or a fixed input such as a spectrogram or
an image, whose output the case replaces anyway), and the model argument a mask reaching it goes
through.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from enum import Enum

import torch
from torch import nn


class Side(Enum):
    """Where a layer sits in its model, which says how the model is called to reach it."""

    ONLY = "self"
    """A model with one stack (a decoder, an encoder): the case is its input."""
    ENCODER = "encoder self"
    """An encoder-decoder's encoder: the case is the encoder's input, the decoder one token."""
    DECODER = "decoder self"
    """An encoder-decoder's decoder: the case is the decoder's input, the encoder one token."""
    CROSS = "cross"
    """A decoder's attention over the encoder's states: queries from the decoder's input, keys
    and values from the encoder's, each of its own length."""


class First(Enum):
    """What the model's first input is made of for a case."""

    IDS = "ids"
    """Token ids: zeros of the case's (B, L), an embedding first."""
    HIDDEN = "hidden"
    """Hidden states: the case's x itself."""
    FIXED = "fixed"
    """An input of a fixed shape (a spectrogram of a set number of frames, an image): zeros of
    it, whatever the case's length, since the layer's input is replaced."""


@dataclass(frozen=True)
class Feed:
    """How a case is fed to the model so that it reaches the layer (see the module docstring).

    ``shape``: the fixed first input's shape past the batch; ``mask``: the model keyword a mask
    reaching this layer goes through (None: no mask of the model's reaches it, observed);
    ``context``: where a cross-attention layer takes the states its keys come from (a keyword
    of its forward, or a position); ``cached``: see below."""

    side: Side = Side.ONLY
    first: First = First.IDS
    shape: tuple[int, ...] = ()
    mask: str | None = "attention_mask"
    context: str | int | None = None
    cached: bool = False
    """Whether the model, called with ``use_cache``, hands the layer a KV cache object (its
    cache is then checked through the model's own, see CachedLayerInModel)."""
    contiguous: bool = False
    """Whether the model hands the layer contiguous hidden states (observed on its own
    forward: a norm's output is): non-contiguous ones are then outside the layer's domain."""
    residual: str | int | None = None
    """Where a self-attention layer takes a tensor it adds to its output unchanged (BLOOM's
    ``residual``: measured, see :mod:`conformance.inference.models.sides`): given zeros, so that
    its output is its attention's alone."""

    def arguments(self, x: torch.Tensor, context: torch.Tensor | None,
                  mask: torch.Tensor | None) -> tuple[tuple, dict[str, object]]:
        """The model's (args, kwargs) for a case: ``x`` the queries' states, ``context`` the
        keys' (a cross-attention's), ``mask`` over the keys (the mask keyword's)."""
        batch = x.shape[0]

        def first(length: int) -> torch.Tensor:
            if self.first is First.HIDDEN:
                return x
            if self.first is First.FIXED:
                return torch.zeros(batch, *self.shape, dtype=x.dtype, device=x.device)
            return torch.zeros(batch, length, dtype=torch.long, device=x.device)

        def tokens(length: int) -> torch.Tensor:
            return torch.zeros(batch, length, dtype=torch.long, device=x.device)

        kwargs: dict[str, object] = {}
        if self.side is Side.ONLY:
            args = (first(x.shape[1]),)
        elif self.side is Side.ENCODER:
            args, kwargs["decoder_input_ids"] = (first(x.shape[1]),), tokens(1)
        elif self.side is Side.DECODER:
            args, kwargs["decoder_input_ids"] = (first(1),), tokens(x.shape[1])
        else:
            keys = context.shape[1] if context is not None else 1
            args, kwargs["decoder_input_ids"] = (first(keys),), tokens(x.shape[1])
        if mask is not None and self.mask is not None:
            kwargs[self.mask] = mask
        return args, kwargs


class _Reached(Exception):
    """Raised by the layer's forward hook: its output is taken, the rest of the model skipped."""


class LayerInModel(nn.Module):
    """The layer at ``path`` of ``model``, called through ``model``'s own forward as ``feed``
    says. ``options``: keywords every call passes (``use_cache=False`` for a ``transformers``
    model: no cache object between the suite's calls)."""

    built_by_its_model = True
    """Its layer is built by its model's own code (from a config, or as the instance is): a
    constant logit scale it shows at every width is the architecture's or a mistake, and
    intent decides (see conformance.model.forms.LogitScale)."""

    def __init__(self, model: nn.Module, path: str, *, feed: Feed = Feed(),
                 options: dict[str, object] | None = None) -> None:
        super().__init__()
        self.model, self.path, self.feed = model, path, feed
        self.options = dict(options or {})
        self.layer = model.get_submodule(path)
        self.weights_scope = f"model.{path}"
        """Where its weights are (the weight trace reads this): the layer's own submodules."""
        judged = {id(p) for p in self.layer.parameters()}
        for parameter in model.parameters():
            if id(parameter) not in judged:
                parameter.requires_grad_(False)

    def _run(self, x: torch.Tensor, context: torch.Tensor | None,
             attention_mask: torch.Tensor | None, past: object = None,
             use_cache: bool = False) -> torch.Tensor | tuple[torch.Tensor, object]:
        """The layer's output for the case; with ``use_cache``, the model called with its cache
        (``past``, or None: the model makes its own) and the output paired with the cache
        object the model handed the layer (None where it handed none)."""
        reached: dict[str, object] = {}
        where = self.feed.context

        def replace_input(module, args, kwargs):
            # The hidden states, wherever the model passes the same tensor again (as key and
            # value to a self-attention called f(h, h, h)); a cross-attention's keys' states
            # where the model passes them.
            given = args[0] if args else kwargs.get("hidden_states")
            reached["cache"] = next((kwargs[name] for name in CACHE_KEYWORDS if name in kwargs),
                                    None)
            args = [x if a is given else a for a in args]
            kwargs = {k: x if v is given else v for k, v in kwargs.items()}
            if given is None:
                kwargs["hidden_states"] = x
            if context is not None:
                if isinstance(where, int) and where < len(args):
                    args[where] = context
                elif isinstance(where, str):
                    kwargs[where] = context
            added = self.feed.residual
            if isinstance(added, int) and added < len(args):
                args[added] = torch.zeros_like(args[added])
            elif isinstance(added, str) and added in kwargs:
                kwargs[added] = torch.zeros_like(kwargs[added])
            return tuple(args), kwargs

        def take_output(module, args, output):
            reached["output"] = output
            raise _Reached

        before = self.layer.register_forward_pre_hook(replace_input, with_kwargs=True)
        after = self.layer.register_forward_hook(take_output)
        args, kwargs = self.feed.arguments(x, context, attention_mask)
        options = ({**self.options, "use_cache": True, CACHE_KEYWORDS[0]: past} if use_cache
                   else self.options)
        try:
            self.model(*args, **options, **kwargs)
        except _Reached:
            pass
        finally:
            before.remove()
            after.remove()
        if "output" not in reached:
            raise RuntimeError(f"the model's forward did not reach {self.path}")
        output = reached["output"]
        output = output[0] if isinstance(output, tuple) else output
        return (output, reached["cache"]) if use_cache else output

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._run(x, None, attention_mask)


class UnmaskedLayerInModel(LayerInModel):
    """A layer no mask of its model's reaches: called without one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x, None, None)


class CrossLayerInModel(LayerInModel):
    """A decoder's cross-attention: queries' states ``x``, keys' and values' ``context``, the
    mask over the context's keys."""

    def forward(self, x: torch.Tensor, context: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._run(x, context, attention_mask)


class UnmaskedCrossLayerInModel(LayerInModel):
    """A cross-attention no mask of its model's reaches (Whisper's)."""

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self._run(x, context, None)


class CachedLayerInModel(LayerInModel):
    """A self-attention layer whose model keeps a KV cache: ``use_cache`` calls the model with
    its own cache object (the one it makes on a first call, ``past_key_values`` after), handed
    back beside the output as the model hands its ``past_key_values`` back."""

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_values=None,  # unannotated: a past handed back, not built here
                use_cache: bool = False) -> torch.Tensor | tuple[torch.Tensor, object]:
        return self._run(x, None, attention_mask, past_key_values, use_cache)


class CachedUnmaskedLayerInModel(LayerInModel):
    """A cached self-attention no mask of its model's reaches."""

    def forward(self, x: torch.Tensor, past_key_values=None,
                use_cache: bool = False) -> torch.Tensor | tuple[torch.Tensor, object]:
        return self._run(x, None, None, past_key_values, use_cache)


CACHE_KEYWORDS = ("past_key_values", "past_key_value")
"""The keyword a ``transformers`` model takes its cache by (the first), and those its layers are
handed it by (this version's and the one before)."""


def takes_cache(forward: object) -> bool:
    """Whether a model's ``forward`` takes a KV cache and a flag to keep one (``transformers``')."""
    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
    return CACHE_KEYWORDS[0] in parameters and "use_cache" in parameters


def driven_class(feed: Feed) -> type[LayerInModel]:
    """The LayerInModel whose forward takes what reaches a layer fed so."""
    cross, masked = feed.side is Side.CROSS, feed.mask is not None
    if feed.cached and not cross:
        return CachedLayerInModel if masked else CachedUnmaskedLayerInModel
    return {(False, True): LayerInModel, (False, False): UnmaskedLayerInModel,
            (True, True): CrossLayerInModel, (True, False): UnmaskedCrossLayerInModel}[
        (cross, masked)]
