"""Library layers a held-out kit found the suite wrong on (``tests/fixtures/library_held_out.py``):
each proved correct here without the suite, then checked with nothing declared: no failure, and
what was wrong before said as what it is."""

from __future__ import annotations

import math

import pytest
import torch

from conformance import Status
from conformance.loading.registry import resolve
from conformance.run.many import check_many
from tests.fixtures import library_held_out as held_out

NEEDS_TORCHTUNE = pytest.mark.skipif(not held_out.HAS_TORCHTUNE,
                                     reason="torchtune is not installed")
NEEDS_TRANSFORMERS = pytest.mark.skipif(not held_out.HAS_TRANSFORMERS,
                                        reason="transformers is not installed")


def checked(name: str) -> dict:
    spec = f"tests.fixtures.library_held_out:{name}"
    return {r.check: r for r in check_many([(spec, resolve(spec)[0])], devices=["cpu"])}


@NEEDS_TORCHTUNE
def test_torchtune_padded_queries_attend_to_their_own_key():
    torch.manual_seed(0)
    layer = held_out.TorchtunePaddedLlama(16, 4, num_kv_heads=2).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    padding = torch.tensor([[False, False, True, True, True], [False] * 5])
    attn = layer.attn
    q = attn.q_proj(x).view(2, 5, 4, 4)
    k = attn.k_proj(x).view(2, 5, 2, 4)
    v = attn.v_proj(x).view(2, 5, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
    q, k = (attn.pos_embeddings(t).transpose(1, 2) for t in (q, k))
    k = k.repeat_interleave(2, dim=1)
    allowed = torch.ones(5, 5, dtype=torch.bool).tril() & padding[:, None, :]
    allowed |= torch.eye(5, dtype=torch.bool)  # torchtune keeps the diagonal
    scores = (q @ k.transpose(-1, -2) / math.sqrt(4)).masked_fill(~allowed[:, None], -math.inf)
    expected = attn.output_proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(layer(x, padding_mask=padding), expected)


@NEEDS_TORCHTUNE
def test_a_fully_padded_element_whose_rows_see_themselves_is_one_behaviour():
    results = checked("TorchtunePaddedLlama")
    assert not [r for r in results.values() if r.status in (Status.FAILED, Status.SUITE_ERROR)]
    fully_masked = results["fully_masked"]
    assert fully_masked.status is Status.PASSED
    assert any("its own key alone" in note for note in fully_masked.observations)


@NEEDS_TRANSFORMERS
def test_gpt2s_upcast_path_refuses_float64_with_a_mask():
    layer = held_out.GPT2UpcastAttention(16, 4).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    layer(x)  # without a mask float64 runs
    with pytest.raises(RuntimeError, match="upcasting"):
        layer(x, attention_mask=torch.ones(2, 5))


@NEEDS_TRANSFORMERS
def test_a_dtype_refused_only_with_a_mask_is_stated_never_failed():
    results = checked("GPT2UpcastAttention")
    gate = results["gate"]
    assert gate.status is Status.PASSED
    assert any(note.startswith("refuses float64, which nobody declared (with a mask")
               for note in gate.observations)
    assert not any("float64" in r.reason for r in results.values()
                   if r.status in (Status.FAILED, Status.SUITE_ERROR))
