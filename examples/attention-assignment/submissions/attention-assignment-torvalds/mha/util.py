import torch


def causal_mask(n, device=None):
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
