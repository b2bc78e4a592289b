"""Textbook float64 pieces the collections' oracle proofs share (``test_*_are_correct.py``):
written here from the formulas, nothing of the suite, so a collection is proved correct
independently of what it is used to test."""

from __future__ import annotations

import torch

F64 = torch.float64


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def same_weights(module, cls, *args, **kwargs):
    """A ``cls(*args, **kwargs)`` in float64 holding ``module``'s parameters."""
    other = cls(*args, **kwargs).double().eval()
    other.load_state_dict(module.state_dict())
    return other


def linear(x, layer):
    out = x @ layer.weight.T
    return out if layer.bias is None else out + layer.bias


def heads(t, count):
    """(B, L, count * d) -> (B, count, L, d)."""
    return t.reshape(*t.shape[:2], count, -1).transpose(1, 2)


def merge(out):
    """(B, H, L, d) -> (B, L, H * d)."""
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


def rms(x, weight, eps):
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight
