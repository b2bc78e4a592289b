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

from conformance.inference.functions.function_wrapper import CoreFunctionModule, core_function_class
from conformance.inference.functions.kernel_arguments import call_output, refusal

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
    first call makes them, then ``length`` tokens held; paged, with its ``block_table``, where
    the kernel takes one."""

    def __init__(self) -> None:
        self.caches: tuple[torch.Tensor, torch.Tensor] | None = None
        self.block_table: torch.Tensor | None = None
        self.length = 0


def paged(k: torch.Tensor, page: int, tokens: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Zeroed caches of pages (blocks, page, H, D) for ``tokens`` tokens of each of k's (B, L, H,
    D) batch elements, and a block table (B, blocks per element) that hands the pages out in a
    shuffled order: a kernel that reads page i of element b as block b * n + i, ignoring the
    table, reads another element's tokens."""
    batch = k.shape[0]
    per = -(-tokens // page)
    order = torch.randperm(batch * per, generator=torch.Generator().manual_seed(31))
    table = order.reshape(batch, per).to(device=k.device, dtype=torch.int32)
    shape = (batch * per, page, *k.shape[2:])
    return (k.new_zeros(shape), k.new_zeros(shape)), table


def paged_slots(table: torch.Tensor, page: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the first ``length`` tokens of each element live in pages of ``page`` tokens: an
    index (blocks (B, length), offsets (length,)) into caches (blocks, page, H, D)."""
    positions = torch.arange(length, device=table.device)
    return table[:, positions // page].long(), positions % page


def read_paged(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of each element of a paged ``cache``: (B, length, H, D)."""
    return cache[paged_slots(table, cache.shape[1], length)]


class CacheKernelModule(CoreFunctionModule):
    """A cache kernel inside the suite's projections; a call with a :class:`KernelCache`
    continues it (the kernel writes the new keys and values into it), a call without one runs
    on fresh caches of its own. ``page``: the page size of a kernel that takes a block table
    (None: contiguous caches)."""

    page: int | None = None

    def forward(self, query, key, value, kv_cache: KernelCache | None = None, **options):
        q, k, v, given = self.per_head(query, key, value)
        axis = 1 if self.layout == "blhd" else 2
        cache = kv_cache if kv_cache is not None else KernelCache()
        needed = cache.length + k.shape[axis]
        if (cache.caches is None or cache.caches[0].dtype != k.dtype
                or self._capacity(cache, axis) < needed):
            self._grow(cache, k, v, axis, max(CAPACITY, 2 * needed), kv_cache is not None)
        held = torch.full((q.shape[0],), cache.length, dtype=torch.int32, device=q.device)
        paging = {} if cache.block_table is None else {"block_table": cache.block_table}
        out = call_output(self.function(q, *cache.caches, k=k, v=v, cache_seqlens=held,
                                        **paging, **options))
        cache.length += k.shape[axis]
        return self.merged(out, given)

    @staticmethod
    def _capacity(cache: KernelCache, axis: int) -> int:
        """The tokens each element's caches hold room for."""
        if cache.block_table is not None:
            return cache.block_table.shape[1] * cache.caches[0].shape[1]
        return cache.caches[0].shape[axis]

    def _grow(self, cache: KernelCache, k: torch.Tensor, v: torch.Tensor, axis: int,
              tokens: int, paging: bool) -> None:
        """New caches for ``tokens`` tokens, holding what the old ones held; paged where the
        kernel takes pages and ``paging`` (a decoding's cache: a plain call's are contiguous,
        so that the pages are the kv_cache check's alone)."""
        held = None
        if cache.caches is not None and cache.length:
            held = (tuple(read_paged(c, cache.block_table, cache.length) for c in cache.caches)
                    if cache.block_table is not None else
                    tuple(c.narrow(axis, 0, cache.length) for c in cache.caches))
        if self.page is not None and paging:
            cache.caches, cache.block_table = paged(k, self.page, tokens)
            if held is not None:
                slots = paged_slots(cache.block_table, self.page, cache.length)
                for new, old in zip(cache.caches, held, strict=True):
                    new[slots] = old.to(new.dtype)
            return
        shape = list(k.shape)
        shape[axis] = tokens
        cache.caches = (k.new_zeros(shape), v.new_zeros(shape))
        if held is not None:
            for new, old in zip(cache.caches, held, strict=True):
                new.narrow(axis, 0, cache.length).copy_(old)


PAGES = (4, 16, 256)
"""Page sizes tried for a kernel that takes a block table, smallest first (FlashAttention's
paged cache takes multiples of 256 on a GPU): the first a prefill runs with is used. Whether
the pages are read right is the kv_cache check's to judge, not this choice's."""


def page_size(cls: type[CacheKernelModule], dtype: torch.dtype) -> tuple[int | None, str | None]:
    """The page size ``cls``'s kernel takes a block table with (the first of PAGES a prefill
    through the pages runs with), and a note."""
    names = set(inspect.signature(cls.function).parameters)
    if "block_table" not in names or cls.layout != "blhd":
        return None, None
    generator = torch.Generator().manual_seed(37)
    q, k, v = (torch.randn(2, 9, 2, 8, generator=generator).to(dtype) for _ in range(3))
    refused = []
    for page in PAGES:
        (k_cache, v_cache), table = paged(k, page, 16)
        try:
            cls.function(q, k_cache, v_cache, k=k, v=v, block_table=table,
                         cache_seqlens=torch.zeros(2, dtype=torch.int32))
        except Exception as error:  # not this page size
            refused.append(f"{page}: {refusal(error)}")
            continue
        return page, (f"paged caches: block_table with pages of {page} tokens, handed out "
                      "shuffled (probed: the first page size a prefill runs with); kv_cache "
                      "decodes through them")
    return None, ("block_table: a prefill through pages raises at every size tried ("
                  + "; ".join(refused) + "): the cache is checked contiguous")


def cache_function_class(function, layout: str, grouped: bool,
                         dropout: bool = True) -> type[CoreFunctionModule]:
    """A CacheKernelModule subclass calling ``function``, whose forward takes (q, k, v), a
    ``kv_cache`` (a :class:`KernelCache`) and the function's other keywords."""
    dense = core_function_class(function, layout, grouped, dropout)
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
