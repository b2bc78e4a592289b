"""``--attn-implementation``: a model checked with the attention function it will run, the way a
person tests a kernel of their own inside the models that will use it.

The value is a name ``transformers`` already knows (``sdpa``, ``eager``, ``flex_attention``, one
the checked file registered with ``AttentionInterface``), or a function in ``AttentionInterface``'s
form named where it lives (``module:function``, ``FILE.py::function``), which is registered here
under a name of its own. A model gives a registered function the mask its mask function makes;
where none is registered for that name, the mask function is chosen by what the function was
observed to take (a boolean keep mask: ``sdpa_mask``; an additive one: ``eager_mask``), and said.
"""

from __future__ import annotations

import zlib

from conformance.model.mask_forms import MaskKind
from conformance.model.remedies import Note

PREFIX = "attention_conformance."
"""Registered names of functions named by where they live: never one a library registers."""

DISPATCH_WORDS = ("sdpa", "flash", "flex_attention", "paged")
"""Words transformers reads in an implementation's name as its own (a name holding ``sdpa`` is
held to the model's SDPA support): a function's own name holding one is not registered as is."""


class AttnImplementationError(ValueError):
    """The declared attention implementation can't be used: one line saying what to pass."""


def declared_function(value: str | None, origin: str, model: bool,
                      load) -> tuple[str | None, tuple[Note, ...]]:
    """The name a model is built with for the declared ``value`` (None where nothing is
    declared), and how it was registered; AttnImplementationError where ``origin`` is no model
    to build with it (``model`` False) or ``value`` can't be used."""
    if value is None:
        return None, ()
    if not model:
        raise AttnImplementationError(
            f"the declared attn_implementation {value!r}: builds a transformers model with that "
            f"attention, and {origin} is no transformers model (nor an attention class built "
            "from a config)")
    name, said = registered(value, load)
    return name, tuple(said)


def registered(value: str, load) -> tuple[str, list[Note]]:
    """The name the model is built with for ``value``, registering a function named by where it
    lives (``load(spec)`` returns the object a located spec names); and what was done, said."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:
        raise AttnImplementationError(f"the declared attn_implementation {value!r}: builds a "
                                      "transformers model, and transformers is not installed "
                                      f"({error})") from error
    known = AttentionInterface._global_mapping
    if ":" not in value:
        if value != "eager" and value not in known:
            raise AttnImplementationError(
                f"the declared attn_implementation {value!r}: no attention function is "
                f"registered under that name (registered: eager, {', '.join(sorted(known))}); "
                "name a function as module:function or FILE.py::function")
        return value, [Note(f"built with attn_implementation={value!r}", None)]
    function = load(value)
    from conformance.inference.functions.interface_function import is_interface_function

    if not callable(function) or not is_interface_function(function):
        raise AttnImplementationError(
            f"the declared attn_implementation {value!r}: not a function in "
            "AttentionInterface's form f(module, query, key, value, attention_mask, "
            "scaling=None, dropout=0.0, **kwargs)")
    own = getattr(function, "__qualname__", function.__name__)
    name = PREFIX + (own if not any(word in own for word in DISPATCH_WORDS)
                     else f"function_{zlib.crc32(own.encode()):08x}")
    AttentionInterface.register(name, function)
    said = f"built with attn_implementation={value} (registered as {name!r})"
    if name not in AttentionMaskInterface._global_mapping:
        mask, form = _mask_function(function)
        AttentionMaskInterface.register(name, mask)
        said += f"; its mask made by transformers' {mask.__name__} ({form})"
    return name, [Note(said, None)]


def _mask_function(function):
    """transformers' mask function that makes the mask ``function`` was observed to take, and
    that form in words: a boolean keep mask (``sdpa_mask``) or an additive one (``eager_mask``,
    where it takes either or its form was not found: the eager path's own)."""
    from transformers.masking_utils import eager_mask, sdpa_mask

    from conformance.inference import infer_function

    try:
        mask = infer_function(function).implementation.capabilities.mask
    except Exception:  # its own inference's failure is said when it is checked alone
        mask = None
    if mask is not None and mask.kind is MaskKind.KEEP_BOOL:
        return sdpa_mask, "a boolean mask, True = attend, as it was observed to take"
    if mask is not None:
        return eager_mask, "an additive float mask, as it was observed to take"
    return eager_mask, "an additive float mask, the eager path's: no mask form was observed"
