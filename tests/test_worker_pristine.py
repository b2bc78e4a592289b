"""The worker puts torch back after submission code patched it (conformance.worker.pristine)."""

from __future__ import annotations

import torch

from conformance.worker.pristine import Pristine


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
