"""Mask encoding, cases and strategies: what the checks are fed is what it claims to be."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.capability_groups import CausalForm
from conformance.model.mask_forms import MaskConvention, MaskKind, MaskLayout
from conformance.model.spec import Capabilities
from conformance.subject.masks import encode_mask

KEEP = torch.tensor([[True, False, True], [True, True, True]])


@pytest.mark.parametrize("layout,shape", [
    (MaskLayout.KEY_PADDING, (2, 3)), (MaskLayout.BROADCAST, (2, 1, 1, 3)),
    (MaskLayout.ROWS_BROADCAST, (2, 1, 3)),
    (MaskLayout.PER_QUERY, (2, 4, 3)), (MaskLayout.PER_HEAD, (2, 5, 4, 3)),
])
def test_layouts(layout, shape):
    mask = encode_mask(KEEP, MaskConvention(MaskKind.KEEP_BOOL, layout), num_heads=5, q_len=4,
                       dtype=torch.float32)
    assert tuple(mask.shape) == shape
    assert torch.equal(mask.reshape(2, -1, 3)[:, 0], KEEP)


def test_kinds():
    def enc(kind):
        return encode_mask(KEEP, MaskConvention(kind, MaskLayout.KEY_PADDING), num_heads=1,
                           q_len=1, dtype=torch.float16)

    assert enc(MaskKind.KEEP_INT).tolist() == [[1, 0, 1], [1, 1, 1]]
    assert enc(MaskKind.IGNORE_BOOL).tolist() == [[False, True, False], [False] * 3]
    additive = enc(MaskKind.ADDITIVE)
    assert additive.dtype == torch.float16
    assert additive[0, 1] == float("-inf") and additive[0, 0] == 0


def test_case_repr_pastes_back():
    case = Case(batch=2, q_len=3, kv_len=4, num_heads=2, head_dim=3, seed=7, kept=(4, 1),
                mask_seed=3)
    assert eval(repr(case)) == case


def test_case_tensors_and_masks_are_deterministic():
    case = Case(batch=2, q_len=3, kv_len=5, num_heads=1, head_dim=2, seed=3, kept=(2, 0),
                mask_seed=11)
    assert torch.equal(case.tensor(2, 3, 2), case.tensor(2, 3, 2))
    assert not torch.equal(case.tensor(2, 3, 2), case.tensor(2, 3, 2, stream=1))
    keep = case.keep()
    assert keep.sum(-1).tolist() == [2, 0]
    assert case.attendable_rows().tolist() == [[True] * 3, [False] * 3]


SELF = Capabilities(call="self", mask=MaskConvention(MaskKind.KEEP_INT, MaskLayout.BROADCAST))
CROSS = Capabilities(call="qkv", cross_attention=True,
                     mask=MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.BROADCAST))


@given(cases(SELF, "cpu", masks="partly_masked"))
def test_partly_masked_cases_mask_and_keep_keys_in_every_element(case):
    assert case.q_len == case.kv_len
    assert all(1 <= kept < case.kv_len for kept in case.kept)


@given(cases(CROSS, "cpu", masks="fully_masked"))
def test_fully_masked_cases_mask_some_elements_entirely_but_not_all(case):
    assert case.batch >= 2
    assert 0 in case.kept and any(k > 0 for k in case.kept)


@given(cases(Capabilities(call="self", heads=1, max_len=7, causality=CausalForm("always")), "cpu"))
def test_cases_respect_declared_limits(case):
    assert case.num_heads == 1 and case.q_len <= 7 and case.causal


@given(cases(CROSS, "cpu", probe=True))
def test_probe_cases_fit_the_probe(case):
    assert case.head_dim >= case.kv_len and case.d_model > case.kv_len


@given(st.data())
def test_cross_lengths_only_where_declared(data):
    self_case = data.draw(cases(SELF, "cpu"))
    assert self_case.q_len == self_case.kv_len


def test_strategies_reach_cross_lengths_batch_equal_length_and_many_heads():
    seen = []

    @given(cases(CROSS, "cpu"))
    def collect(case):
        seen.append(case)

    collect()
    assert any(c.q_len != c.kv_len for c in seen)
    assert any(c.batch == c.q_len for c in seen)
    assert any(c.num_heads > 1 for c in seen)
