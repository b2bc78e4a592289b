import torch

from mha import MultiHeadAttention


def test_shape():
    assert MultiHeadAttention(8, 2)(torch.randn(2, 3, 8)).shape == (2, 3, 8)
