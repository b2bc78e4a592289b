"""The cached library layers of tests/fixtures/library_caches.py decode correctly: step by step
through their own cache, they give the full causal forward's rows (float64)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import DynamicCache

from tests.fixtures.library_caches import LlamaDynamicCacheAttention


@pytest.mark.parametrize("chunks", [(1, 1, 1, 1, 1, 1), (3, 1, 2)])
def test_decoding_through_the_cache_gives_the_full_forward(chunks):
    torch.manual_seed(0)
    layer = LlamaDynamicCacheAttention(16, 4, num_key_value_heads=2).double()
    x = torch.randn(2, sum(chunks), 16, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x)
        cache, rows, start = DynamicCache(), [], 0
        for size in chunks:
            rows.append(layer(x[:, start:start + size], past_key_values=cache))
            start += size
        assert cache.get_seq_length() == sum(chunks)
    torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=0, atol=1e-6)


def test_a_keep_mask_over_the_cached_keys_hides_them():
    torch.manual_seed(1)
    layer = LlamaDynamicCacheAttention(16, 4).double()
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    keep = torch.tensor([[1, 0, 1, 1]])
    with torch.no_grad():
        full = layer(x, attention_mask=keep)
        cache = DynamicCache()
        layer(x[:, :3], attention_mask=keep[:, :3], past_key_values=cache)
        last = layer(x[:, 3:], attention_mask=keep, past_key_values=cache)
    torch.testing.assert_close(last, full[:, 3:], rtol=0, atol=1e-6)
