"""KV-cache kernels: ``f(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, ...)``,
FlashAttention's ``flash_attn_with_kvcache``: the new keys and values are written into the
caches at ``cache_seqlens`` in place, and the queries attend over each cache up to them.

Called with (q, k, v) alone such a function is dense attention (the whole cache), and is checked
as a dense kernel is. Its cache form is checked through the suite's wrapper
(:class:`CacheKernelModule`), whose forward takes a cache object (:class:`KernelCache`, as a
HuggingFace layer takes its ``Cache``): the ``kv_cache`` check decodes through the kernel's own
writes into it and compares every position with the full forward, so a kernel that never writes
its new keys reads zeros at the next step.
"""

from __future__ import annotations

import inspect

import torch

from conformance.inference.function_wrapper import CoreFunctionModule, core_function_class
from conformance.inference.kernel_arguments import call_output

CACHE = ("k_cache", "v_cache", "k", "v", "cache_seqlens")
"""The arguments of FlashAttention's cache form."""
LEFT_OUT = (*CACHE, "block_table", "cache_batch_idx", "cache_leftpad", "rotary_cos",
            "rotary_sin", "rotary_interleaved", "return_softmax_lse")
"""Arguments the wrapper fills (or leaves at their defaults): not its forward's."""

CAPACITY = 64
"""Tokens each cache holds at least (more than any case the kv_cache check decodes); a call
that needs more grows them."""


def is_cache_kernel(function) -> bool:
    """Whether ``function`` takes FlashAttention's cache form (by the names of its arguments;
    the kv_cache check then judges what it does with them)."""
    try:
        names = set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False
    return set(CACHE) <= names


class KernelCache:
    """The caches a cache kernel writes into, kept between one decoding's calls: none until the
    first call makes them (CAPACITY tokens each, as the kernel's keys are laid out), then
    ``length`` tokens held."""

    def __init__(self) -> None:
        self.caches: tuple[torch.Tensor, torch.Tensor] | None = None
        self.length = 0


class CacheKernelModule(CoreFunctionModule):
    """A cache kernel inside the suite's projections; a call with a :class:`KernelCache`
    continues it (the kernel writes the new keys and values into it), a call without one runs
    on fresh caches of its own."""

    def forward(self, query, key, value, kv_cache: KernelCache | None = None, **options):
        q, k, v = self.heads(query, key, value)
        if self.layout == "blhd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        given = q.dtype
        if self.compute_dtype is not None:
            q, k, v = (t.to(self.compute_dtype) for t in (q, k, v))
        axis = 1 if self.layout == "blhd" else 2
        cache = kv_cache if kv_cache is not None else KernelCache()
        needed = cache.length + k.shape[axis]
        if (cache.caches is None or cache.caches[0].dtype != k.dtype
                or cache.caches[0].shape[axis] < needed):
            shape = list(k.shape)
            shape[axis] = max(CAPACITY, 2 * needed)
            grown = (k.new_zeros(shape), v.new_zeros(shape))
            if cache.caches is not None and cache.length:  # what it held, in the larger caches
                for new, old in zip(grown, cache.caches, strict=True):
                    new.narrow(axis, 0, cache.length).copy_(old.narrow(axis, 0, cache.length))
            cache.caches = grown
        held = torch.full((q.shape[0],), cache.length, dtype=torch.int32, device=q.device)
        out = call_output(self.function(q, *cache.caches, k=k, v=v, cache_seqlens=held,
                                        **options)).to(given)
        cache.length += k.shape[axis]
        if self.layout == "blhd":
            out = out.transpose(1, 2)
        return self.merge(out)


def cache_function_class(function, layout: str, grouped: bool) -> type[CoreFunctionModule]:
    """A CacheKernelModule subclass calling ``function``, whose forward takes (q, k, v), a
    ``kv_cache`` (a :class:`KernelCache`) and the function's other keywords."""
    dense = core_function_class(function, layout, grouped)
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.name not in LEFT_OUT][1:]
    tensors = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
               for name in ("self", "q", "k", "v")]
    cache = inspect.Parameter("kv_cache", inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation=KernelCache)

    def forward(self, q, k, v, kv_cache=None, **options):
        return CacheKernelModule.forward(self, q, k, v, kv_cache=kv_cache, **options)

    forward.__signature__ = inspect.Signature(
        [*tensors, cache, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters)])
    return type(dense.__name__, (CacheKernelModule,),
                {"function": staticmethod(dense.function), "forward": forward, "layout": layout,
                 "__init__": dense.__init__, "__module__": dense.__module__})
