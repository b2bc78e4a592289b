"""A KV cache carried between the decoding calls of one built implementation.

The checks ask for cached calls with plain data (``Inputs.cache`` and ``Inputs.position``: the
call continues a cache holding ``position`` tokens; 0 starts a fresh one). The cache itself never
crosses the boundary: it lives here, beside the module, in the style the implementation declares
(:class:`conformance.model.forms.CacheStyle`):

- ``returned``: the past goes in through ``cache.argument`` (None for a fresh cache) and the
  present comes back in the output tuple: its only other element, or else the first element
  after the output that is neither a tensor nor None (HuggingFace's legacy ``(output, weights,
  present)``);
- ``buffers``: the module keeps its own preallocated buffers; ``cache.argument`` gets the first
  new token's position (Meta Llama's ``start_pos``), or, where it is also the declared position
  argument, the new tokens' positions in that argument's form (gpt-fast's ``input_pos`` vector);
- ``object``: a fresh cache object built by ``cache.factory`` ("module:Class", called with no
  arguments) goes in through ``cache.argument`` and is updated by the module in place.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from conformance.errors import ConformanceError
from conformance.model.forms import CacheStyle, PositionForm
from conformance.model.spec import Capabilities, Config
from conformance.subject.call_arguments import positions_argument

NOT_AS_DECLARED = "the present cache holding"
"""How a cache not in its declared layout is said (what kv_cache recognises it by: the words are
all that crosses the worker's boundary of an error)."""


class CacheProtocolError(ConformanceError):
    """The implementation did not hand the cache back as its declared style says; one line."""


def _factory(path: str) -> Callable[[], object]:
    module, _, attribute = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as error:
        raise CacheProtocolError(f"cache_factory {path!r}: {error}") from error


def _present(rest: tuple) -> object:
    """The present cache among the outputs after the attention output."""
    if len(rest) == 1:
        return rest[0]
    for item in rest:
        if item is not None and not isinstance(item, torch.Tensor):
            return item
    return None


def _form(value: object) -> str:
    """What a returned cache is, in a few words."""
    if isinstance(value, torch.Tensor):
        return f"one tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        parts = ", ".join(f"shape {tuple(v.shape)}" if isinstance(v, torch.Tensor)
                          else type(v).__name__ for v in value)
        return f"a {type(value).__name__} of {len(value)} ({parts})"
    return f"a {type(value).__name__}"


class CacheSession:
    """The cache of one built implementation: what the next cached call passes, and what it
    keeps from the call's output."""

    def __init__(self, capabilities: Capabilities, config: Config | None = None) -> None:
        self._caps = capabilities
        self._config = config
        self._state: object = None
        self.length = 0
        """Tokens the cache holds."""
        self._batch = 0

    def arguments(self, position: int, batch: int, length: int,
                  device: torch.device | str) -> dict[str, object]:
        """Keyword arguments for a cached call of ``batch`` x ``length`` tokens whose first token
        is at ``position`` (0: a fresh cache)."""
        caps = self._caps
        if position == 0:
            self.length = 0
            self._state = (_factory(caps.cache.factory)()
                           if caps.cache.style is CacheStyle.OBJECT else None)
        elif position != self.length:
            raise ValueError(f"a cached call at position {position}, but the cache holds "
                             f"{self.length} tokens")
        self._batch = batch
        kwargs: dict[str, object] = dict(caps.cache.options)
        if caps.cache.style is CacheStyle.BUFFERS:
            form = (caps.position.form if caps.position.argument == caps.cache.argument
                    else PositionForm.START)
            kwargs[caps.cache.argument] = positions_argument(form, position, batch, length,
                                                             device)
        else:
            kwargs[caps.cache.argument] = self._state
        return kwargs

    def collect(self, output: object, length: int) -> object:
        """The attention output of a cached call of ``length`` tokens; the present cache (style
        ``returned``) is kept for the next call."""
        first, rest = (output[0], tuple(output[1:])) if isinstance(output, (tuple, list)) else (
            output, ())
        if self._caps.cache.style is CacheStyle.RETURNED:
            present = _present(rest)
            if present is None:
                raise CacheProtocolError(
                    f"a call with {self._caps.cache.argument} returned no present cache beside "
                    "its output (expected (output, present))")
            self._state = present
        self.length += length
        if self._caps.cache.layout is not None and self._config is not None:
            self._hold(self._state)
        return first

    def _hold(self, present: object) -> None:
        """Raise CacheProtocolError where ``present`` is not the declared layout: (k, v), each
        of the layout's shape for the tokens the cache holds (key/value heads: the config's)."""
        config, layout = self._config, self._caps.cache.layout
        expected = layout.shape(self._batch, config.kv_heads, self.length, config.head_dim)
        tensors = (isinstance(present, (tuple, list)) and len(present) == 2
                   and all(isinstance(part, torch.Tensor) for part in present))
        if tensors and all(tuple(part.shape) == expected for part in present):
            return
        shown = (f"(k, v) of shapes {tuple(present[0].shape)} and {tuple(present[1].shape)}"
                 if tensors else _form(present))
        raise CacheProtocolError(
            f"{NOT_AS_DECLARED} {self.length} token(s) is {shown}, not the declared "
            f"layout {layout.value}: (k, v), each {expected}")
