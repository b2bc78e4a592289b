"""How a model is fed so that a case reaches each of its attention layers, observed by running
it (:class:`conformance.subject.layer_in_model.Feed`).

- **Its first input**: token ids where it takes them, an encoder-decoder's on both sides, a fixed
  input where its config or its first convolution fixes one (Whisper's spectrogram of
  ``2 * max_source_positions`` frames, an image), hidden states as wide as its first linear
  layer otherwise: the first of these its forward runs on.
- **Each layer's side**: one forward with the encoder's input and the decoder's of different
  lengths (ENCODER_LENGTH, DECODER_LENGTH), each layer's hidden states' length read as it is
  called; a layer called with a second tensor as wide as its hidden states (the encoder's states
  a decoder's cross-attention takes) is a cross-attention, and where it takes it is kept.
- **Whether a mask reaches it**: the model's mask for that side (``attention_mask`` for the
  encoder and the cross-attention's keys, ``decoder_attention_mask`` for the decoder) hiding one
  key changes the layer's output, or no mask of the model's reaches it (Whisper's encoder and
  cross-attention take none).
- **Whether it keeps a KV cache**: the model called with ``use_cache`` hands the layer a cache
  object (a decoder's self-attention), or none (an encoder's, BERT's included).
- **What its forward adds besides attention**: a self-attention layer called with a second
  tensor as wide as its hidden states whose output moves by exactly that tensor (BLOOM's
  ``residual``, added inside its forward): measured by running the model with the tensor as the
  model computes it and as zeros, and kept out (the layer is then driven with zeros there).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from conformance.errors import one_line
from conformance.inference.models.attention_layers import attention_paths
from conformance.subject.layer_in_model import Feed, First, Side, driven_class, takes_cache

ENCODER_LENGTH, DECODER_LENGTH = 5, 3
"""The lengths of the one forward that finds the layers: different, so a layer's hidden states
say its side of an encoder-decoder."""

IMAGE_SIDES = (224, 32, 64, 96, 128, 16, 8)
"""Image sides tried where a model's first layer is a 2-D convolution and nothing says its size
(224, the usual; then small ones a tiny ViT's fixed positions fit)."""

MASK_KEYWORD = {Side.ONLY: "attention_mask", Side.ENCODER: "attention_mask",
                Side.DECODER: "decoder_attention_mask", Side.CROSS: "attention_mask"}
"""The model keyword whose mask reaches a layer on each side (``transformers``' names: the
encoder's padding masks the cross-attention's keys)."""


def _first_inputs(model: nn.Module) -> list[Feed]:
    """The first inputs to try, in order (see the module docstring)."""
    config = getattr(model, "config", None)
    tries = []
    if getattr(config, "is_encoder_decoder", False):
        if getattr(model, "main_input_name", "input_ids") == "input_features":
            frames = 2 * int(getattr(config, "max_source_positions", 1500))
            tries.append(Feed(Side.ENCODER, First.FIXED,
                              (int(getattr(config, "num_mel_bins", 80)), frames)))
        tries.append(Feed(Side.ENCODER, First.IDS))
    tries.append(Feed(Side.ONLY, First.IDS))
    linear = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    if linear is not None:
        tries.append(Feed(Side.ONLY, First.HIDDEN, (linear.in_features,)))
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is not None:
        said = [getattr(config, "image_size", None), getattr(model, "image_size", None),
                getattr(model, "img_size", None)]
        for side in [*[s for s in said if isinstance(s, int)], *IMAGE_SIDES]:
            tries.append(Feed(Side.ONLY, First.FIXED, (conv.in_channels, side, side)))
    return tries


def _sample(feed: Feed, length: int = ENCODER_LENGTH) -> tuple[tuple, dict[str, object]]:
    """One forward's inputs for the side-finding run: the encoder's ``length`` long, the
    decoder's DECODER_LENGTH."""
    hidden = feed.first is First.HIDDEN
    x = torch.randn(1, length, *feed.shape) if hidden else torch.zeros(1, length, 1)
    args, kwargs = feed.arguments(x, None, None)
    if feed.side is not Side.ONLY:
        kwargs["decoder_input_ids"] = torch.zeros(1, DECODER_LENGTH, dtype=torch.long)
    return args, kwargs


def found_by_running(model: nn.Module, options: dict[str, object],
                     skipped: dict[str, int] | None = None
                     ) -> tuple[Feed, dict[str, nn.Module]] | str:
    """(the first input its forward runs on, its attention layers) from one forward; where no
    input runs, what the first try raised, in one line. ``skipped``: see
    :func:`~conformance.inference.models.attention_layers.attention_paths`."""
    raised = []
    for feed in _first_inputs(model):
        args, kwargs = _sample(feed)
        try:
            return feed, attention_paths(model, lambda m, a=args, k=kwargs: m(*a, **options, **k),
                                         skipped)
        except Exception as error:  # the model's own refusal of this input: the next form
            raised.append(one_line(error, 200))
    return raised[0]


def _called(model: nn.Module, found: dict[str, nn.Module], run: Callable[[], object]
            ) -> dict[str, tuple[int, int, str | int | None, bool]]:
    """Each layer's hidden states' (length, width) as the model calls it, where it takes a
    second tensor as wide (a cross-attention's keys' states), and whether the states are
    contiguous, from one ``run()``."""
    seen: dict[str, tuple[int, int, str | int | None, bool]] = {}
    handles = []

    def hook(path):
        def record(module, args, kwargs):
            given = args[0] if args else kwargs.get("hidden_states")
            if not isinstance(given, torch.Tensor) or given.dim() != 3:
                return
            def other(t):
                return (isinstance(t, torch.Tensor) and t is not given and t.dim() == 3
                        and t.shape[-1] == given.shape[-1])
            where = next((i for i, a in enumerate(args) if other(a)), None)
            if where is None:
                where = next((k for k, v in kwargs.items() if other(v)), None)
            seen.setdefault(path, (given.shape[1], given.shape[-1], where,
                                   given.is_contiguous()))
        return record

    for path, module in found.items():
        handles.append(module.register_forward_pre_hook(hook(path), with_kwargs=True))
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def feeds(model: nn.Module, first: Feed, found: dict[str, nn.Module],
          options: dict[str, object], masked: bool) -> dict[str, Feed]:
    """Each found layer's feed (see the module docstring); ``masked``: whether a layer of a
    single-stack model takes the model's ``attention_mask`` (its forward has one)."""
    args, kwargs = _sample(first)
    called = _called(model, found, lambda: model(*args, **options, **kwargs))
    result = {}
    for path in found:
        if path not in called:  # not called on hidden states: driven as the model is first fed
            result[path] = first
            continue
        length, width, context, contiguous = called[path]
        if first.side is Side.ONLY:
            feed = replace(first, mask="attention_mask" if masked else None,
                           contiguous=contiguous,
                           residual=context if context is not None and _adds(
                               model, path, context, lambda: model(*args, **options, **kwargs))
                           else None)
        else:
            side = (Side.CROSS if context is not None else
                    Side.DECODER if length == DECODER_LENGTH else Side.ENCODER)
            feed = replace(first, side=side, context=context, mask=MASK_KEYWORD[side],
                           contiguous=contiguous)
            if not _mask_reaches(model, path, feed, width, options):
                feed = replace(feed, mask=None)
        result[path] = replace(feed, cached=_keeps_cache(model, path, feed, width, options))
    return result


RESIDUAL_TOLERANCE = 1e-5
"""How closely the output's move must match the tensor zeroed (float32 sums of a few terms)."""


def _adds(model: nn.Module, path: str, where: str | int, run: Callable[[], object]) -> bool:
    """Whether the layer at ``path`` adds the tensor it takes at ``where`` to its output
    unchanged: one ``run()`` with the tensor as the model computes it, one with zeros there,
    their outputs differing by the tensor itself (and it is not all zeros)."""
    layer = model.get_submodule(path)
    seen: dict[str, torch.Tensor] = {}

    def replace_it(zero: bool):
        def hook(module, args, kwargs):
            args = list(args)
            given = args[where] if isinstance(where, int) else kwargs[where]
            seen.setdefault("given", given.detach().clone())
            if zero:
                if isinstance(where, int):
                    args[where] = torch.zeros_like(given)
                else:
                    kwargs[where] = torch.zeros_like(given)
            return tuple(args), kwargs
        return hook

    outputs = []
    for zero in (False, True):
        before = layer.register_forward_pre_hook(replace_it(zero), with_kwargs=True)
        after = layer.register_forward_hook(
            lambda m, a, out: outputs.append((out[0] if isinstance(out, tuple) else out).detach()))
        try:
            with torch.no_grad():
                run()
        except Exception:  # the model's refusal of zeros there: nothing measured
            return False
        finally:
            before.remove()
            after.remove()
    if len(outputs) < 2 or "given" not in seen or not float(seen["given"].abs().max()):
        return False
    moved = outputs[0] - outputs[-1]
    given = seen["given"]
    return (moved.shape == given.shape
            and float((moved - given).abs().max()) <= RESIDUAL_TOLERANCE
            * max(1.0, float(given.abs().max())))


def _keeps_cache(model: nn.Module, path: str, feed: Feed, width: int,
                 options: dict[str, object]) -> bool:
    """Whether the model, called with ``use_cache`` (its forward takes ``past_key_values`` and
    it), hands the self-attention layer at ``path`` a cache object: a decoder's does; an
    encoder's (BERT's, though its forward takes one) and a cross-attention's are not checked
    so."""
    if feed.side is Side.CROSS or not takes_cache(model.forward):
        return False
    cached = replace(feed, cached=True)
    try:
        with torch.no_grad():
            _, cache = driven_class(cached)(model, path, feed=cached, options=options)(
                torch.randn(1, 3, width), use_cache=True)
    except Exception:  # the model's refusal to keep a cache: none is checked
        return False
    return cache is not None


def _mask_reaches(model: nn.Module, path: str, feed: Feed, width: int,
                  options: dict[str, object]) -> bool:
    """Whether the model's mask for ``feed``'s side changes the layer's output when it hides
    the last key (of four); where the model refuses the mask, no."""
    if feed.mask not in inspect.signature(model.forward).parameters:
        return False
    driven = driven_class(feed)(model, path, feed=feed, options=options)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, width, generator=generator)
    context = [torch.randn(1, 4, width, generator=generator)] if feed.side is Side.CROSS else []
    keep = torch.tensor([[1, 1, 1, 0]])
    try:
        with torch.no_grad():
            hidden = driven(x, *context, attention_mask=keep)
            shown = driven(x, *context, attention_mask=torch.ones_like(keep))
    except Exception:  # the model's refusal of a mask on this side: none reaches the layer
        return False
    return not torch.equal(hidden, shown)
