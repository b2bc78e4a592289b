"""The worker puts torch back after submission code patched it (conformance.worker.pristine)."""

from __future__ import annotations

import sys

import pytest
import torch

from conformance.worker import pristine as pristine_module
from conformance.worker.pristine import Pristine

TAGGED = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] <= (3, 13)
"""Whether this interpreter's dictionaries carry the version tag the fast path reads."""


def test_patched_functions_and_shadowing_methods_are_put_back():
    pristine = Pristine()
    allclose, had_sub = torch.allclose, "__sub__" in vars(torch.Tensor)
    try:
        torch.allclose = lambda *args, **kwargs: True
        torch.Tensor.__sub__ = lambda self, other: self  # shadows TensorBase.__sub__
        assert (torch.ones(2) - torch.ones(2)).sum() == 2
        restored = pristine.restore()
    finally:
        torch.allclose = allclose
        if not had_sub and "__sub__" in vars(torch.Tensor):
            del torch.Tensor.__sub__
    assert set(restored) == {"torch.allclose", "torch.Tensor.__sub__"}
    assert (torch.ones(2) - torch.ones(2)).sum() == 0
    assert not torch.allclose(torch.zeros(1), torch.ones(1))


def test_ordinary_torch_use_restores_nothing():
    pristine = Pristine()
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 3, 8, requires_grad=True)
    module(x, x, x)[0].sum().backward()
    torch.nn.functional.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None])
    assert pristine.restore() == ()


def test_a_deleted_function_comes_back_even_when_another_name_keeps_the_count():
    import math

    pristine = Pristine()
    sqrt = math.sqrt
    try:
        del math.sqrt
        math.not_sqrt = sqrt  # the same value under another name: the count is unchanged
        restored = pristine.restore()
        assert math.sqrt is sqrt
    finally:
        math.sqrt = sqrt
        vars(math).pop("not_sqrt", None)
    assert restored == ("math.sqrt",)


@pytest.mark.skipif(not TAGGED, reason="no dictionary version tags in this interpreter")
def test_a_restore_after_no_change_compares_nothing(monkeypatch):
    pristine = Pristine()
    assert pristine._versions is not None  # the tags passed their test on this interpreter
    monkeypatch.setattr(pristine, "_compared", lambda: pytest.fail("compared unchanged names"))
    torch.ones(3).softmax(0)
    assert pristine.restore() == ()


@pytest.mark.skipif(not TAGGED, reason="no dictionary version tags in this interpreter")
def test_after_a_patch_is_put_back_the_next_restore_is_fast_again(monkeypatch):
    pristine = Pristine()
    assert _restored_with_allclose_patched(pristine) == ("torch.allclose",)
    assert pristine.restore() == ()  # what the helper's finally did is what was recorded
    monkeypatch.setattr(pristine, "_compared", lambda: pytest.fail("compared unchanged names"))
    assert pristine.restore() == ()


def test_a_patch_undone_before_the_restore_restores_nothing():
    pristine = Pristine()
    allclose = torch.allclose
    torch.allclose = lambda *args, **kwargs: True
    torch.allclose = allclose
    assert pristine.restore() == ()


def test_without_version_tags_every_restore_compares(monkeypatch):
    monkeypatch.setattr(pristine_module, "version_reader", lambda namespaces: None)
    pristine = Pristine()
    assert _restored_with_allclose_patched(pristine) == ("torch.allclose",)
    assert pristine.restore() == ()


def _restored_with_allclose_patched(pristine: Pristine) -> tuple[str, ...]:
    """What ``pristine`` puts back with ``torch.allclose`` replaced (and put back after, whatever
    happens)."""
    allclose = torch.allclose
    try:
        torch.allclose = lambda *args, **kwargs: True
        return pristine.restore()
    finally:
        torch.allclose = allclose
