"""Which KV cache a forward argument takes, in which style (see :class:`conformance.model.forms.CacheStyle`).

From the signature: a start position (``start_pos``) means buffers the module keeps; an argument
annotated with a cache class (HuggingFace's ``Cache``, a module's own ``KVCache``) means an object
passed in and updated in place, built with no arguments (for HuggingFace's abstract ``Cache``,
``DynamicCache``); anything else (``past_key_value``, ``layer_past``) a past passed in and a
present handed back in the output tuple. The style is confirmed by a prefill through the cache:
only a protocol that works is declared; what decoding then gives is the kv_cache check's to judge.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass

import torch

from conformance.generation.cases import Case
from conformance.inference.names.convention import START_NAMES, ForwardConvention
from conformance.model.forms import CacheStyle
from conformance.subject.boundary import ImplementationError, Inputs, Instance

NOT_CACHES = (type(None), torch.Tensor, tuple, list, dict, int, bool, str)


@dataclass(frozen=True)
class CacheProtocol:
    """How to hand a cache over: the capabilities it declares."""

    style: CacheStyle
    argument: str
    options: tuple[tuple[str, object], ...] = ()
    factory: str | None = None

    def capabilities(self) -> dict[str, object]:
        """The cache group's fields it sets (Capabilities' ``cache``)."""
        return {"cache": {"style": self.style, "argument": self.argument, "options": self.options,
                          "factory": self.factory}}

    def describe(self) -> str:
        if self.style is CacheStyle.BUFFERS:
            return f"buffers it keeps, {self.argument} = the new tokens' first position"
        if self.style is CacheStyle.OBJECT:
            name = self.factory.rpartition(":")[2]
            return f"a {name} object ({self.factory}) passed as {self.argument}, updated in place"
        flag = "".join(f", {name}={value!r}" for name, value in self.options)
        return f"{self.argument} in{flag}, the present cache out beside the output"


def _classes(annotation: object) -> list[type]:
    """The classes an annotation names (through unions and Optional)."""
    if isinstance(annotation, type):
        return [annotation]
    found: list[type] = []
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for argument in typing.get_args(annotation):
            found += _classes(argument)
    return found


def _annotation(forward: Callable, argument: str, written: object) -> object:
    """The argument's annotation, resolved where it was written as a string (None where there
    is none)."""
    if written is inspect.Parameter.empty:
        return None
    try:
        return typing.get_type_hints(forward).get(argument, written)
    except Exception:  # unresolvable names elsewhere in the signature
        if not isinstance(written, str):
            return written
        try:
            return eval(written, getattr(forward, "__globals__", {}))  # what get_type_hints does
        except Exception:
            return None


def _constructible(cls: type) -> type | None:
    """``cls`` if it builds with no arguments; HuggingFace's ``DynamicCache`` for its ``Cache``."""
    candidates = [cls]
    if cls.__module__.startswith("transformers"):
        try:
            from transformers import DynamicCache
        except ImportError:  # pragma: no cover - transformers half installed
            DynamicCache = None
        if DynamicCache is not None and issubclass(DynamicCache, cls):
            candidates.append(DynamicCache)
    for candidate in candidates:
        try:
            candidate()
        except Exception:
            continue
        return candidate
    return None


def protocol(convention: ForwardConvention, forward: Callable) -> tuple[CacheProtocol | None, str]:
    """The protocol the signature implies, with how it was read (or why none)."""
    argument = convention.cache
    options = ((convention.use_cache, True),) if convention.use_cache else ()
    if argument in START_NAMES:
        return CacheProtocol(CacheStyle.BUFFERS, argument, options), f"{argument} is a start position"
    annotation = _annotation(forward, argument, convention.cache_annotation)
    classes = [c for c in _classes(annotation) if not issubclass(c, NOT_CACHES)]
    if len(classes) == 1:
        cls = _constructible(classes[0])
        if cls is None or "." in cls.__qualname__ or "<" in cls.__module__:
            return None, (f"{argument} is annotated {classes[0].__name__}, which can't be built "
                          "with no arguments")
        factory = f"{cls.__module__}:{cls.__qualname__}"
        return (CacheProtocol(CacheStyle.OBJECT, argument, options, factory),
                f"{argument} is annotated {classes[0].__name__}")
    return CacheProtocol(CacheStyle.RETURNED, argument, options), f"{argument} takes the past"


def confirm(build: Callable[..., Instance], found: CacheProtocol, case: Case,
            call: str) -> str | None:
    """None when a prefill through the cache works (and, for a returned cache, hands one back);
    else what went wrong, in words."""
    x = case.tensor(case.batch, case.q_len, case.d_model)
    context = x.clone()
    # A cross-attention cache holds the context's keys and values: it is not causal.
    inputs = Inputs(x, x, x, causal=True, cache=True) if call == "self" else Inputs(
        x, context, context if call == "cross" else x.clone(), causal=call != "cross",
        cache=True)
    try:
        instance = build(**found.capabilities())
        output = instance.forward(inputs)
    except ImplementationError as error:
        return str(error)
    if tuple(output.shape) != (case.batch, case.q_len, case.d_model):
        return f"the cached prefill returned shape {tuple(output.shape)}"
    return None
