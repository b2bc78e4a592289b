import math

import torch


def attend_one_head(q, k, v, offset):
    """q: (batch, new, d), k and v: (batch, offset + new, d). Query i is position offset + i."""
    d = q.shape[-1]
    scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d)
    for i in range(q.shape[1]):
        scores[:, i, offset + i + 1:] = float("-inf")
    return torch.bmm(torch.softmax(scores, dim=2), v)
