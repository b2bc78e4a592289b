"""A constructor's context-length argument (``block_size``): set per case, as long as it needs."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from conformance import Config, Status
from conformance import check as check_target
from conformance.inference.names.roles import (
    CONTEXT_LENGTH,
    SHORT_CASE,
    SHORT_CONTEXT,
    context_length,
)
from conformance.loading.registry import implementations_of


class BlockSizedHead(nn.Module):
    """nanoGPT's causal head: a ``block_size`` x ``block_size`` buffer, cut to the sequence."""

    sizes: ClassVar[list[int]] = []  # every block_size built with, in order

    def __init__(self, n_embd, head_size, block_size):
        super().__init__()
        self.block_size = block_size
        BlockSizedHead.sizes.append(block_size)
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))

    def _weights(self, x, tril):
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        return F.softmax(wei.masked_fill(tril == 0, float("-inf")), dim=-1)

    def forward(self, x):
        length = x.shape[1]
        return self._weights(x, self.tril[:length, :length]) @ self.value(x)


class UnslicedHead(BlockSizedHead):
    """The classic slip: the buffer is not cut to the sequence, so only a sequence of exactly
    ``block_size`` tokens runs."""

    def forward(self, x):
        return self._weights(x, self.tril) @ self.value(x)


def _built(q_len: int, kv_len: int) -> nn.Module:
    (implementation,) = implementations_of(BlockSizedHead)
    config = Config(batch=1, q_len=q_len, kv_len=kv_len, d_model=8, num_heads=1)
    return implementation.factory(config).inner


def test_short_cases_build_with_the_short_context_and_longer_ones_with_the_long_one():
    assert SHORT_CONTEXT >= 2 * SHORT_CASE  # room for shifted positions (see roles.py)
    assert _built(3, 3).block_size == SHORT_CONTEXT
    assert _built(1, SHORT_CASE).block_size == SHORT_CONTEXT
    assert _built(SHORT_CASE + 1, SHORT_CASE + 1).block_size == CONTEXT_LENGTH
    assert context_length(1, CONTEXT_LENGTH) == CONTEXT_LENGTH


def test_a_block_sized_head_passes_with_its_long_case_built_long():
    (implementation,) = implementations_of(BlockSizedHead)  # inference builds it at 4 too
    BlockSizedHead.sizes.clear()
    results = check_target(implementation, checks=["gate", "causal", "low_precision"])
    assert {r.check: r.status for r in results} == {
        "gate": Status.PASSED, "causal": Status.PASSED, "low_precision": Status.PASSED}
    assert set(BlockSizedHead.sizes) == {SHORT_CONTEXT, CONTEXT_LENGTH}  # the long case ran


def test_a_buffer_not_cut_to_the_sequence_still_fails_the_gate():
    (gate,) = check_target(UnslicedHead, checks=["gate"])
    assert gate.status is Status.FAILED
    assert "must match the size" in " ".join([gate.reason, *gate.details])


def test_a_context_name_is_confirmed_by_the_lengths_it_refuses():
    from conformance.model.remedies import texts
    from tests.fixtures.courses.nanogpt import ManualCausalSelfAttention

    (implementation,) = implementations_of(ManualCausalSelfAttention)
    assert ("config.block_size: context length (confirmed: built with 4, 4 tokens run and 6 "
            "raise; built with 512, 6 run)") in texts(implementation.notes)


def test_a_size_named_like_a_context_that_shapes_the_rows_is_built_small():
    """A block-local layer's ``block_size`` (tests/fixtures/structural_sizes.py): built at 128,
    one block covers every generated sequence and its twin, blocks off by one, passes."""
    from conformance.model.remedies import texts
    from tests.fixtures.structural_sizes import BlockLocalAttention, BlocksOffByOne

    (implementation,) = implementations_of(BlockLocalAttention)
    said = texts(implementation.notes)
    assert any(note.startswith("block_size shapes what each row sees, not a length it takes")
               for note in said), said
    assert implementation.capabilities.chunk == 4  # measured, once built small
    results = {r.check: r.status for r in check_target(implementation)}
    assert Status.FAILED not in results.values() and results["chunked"] is Status.PASSED
    (causal,) = check_target(BlocksOffByOne, checks=["causal"])
    assert causal.status is Status.FAILED
