"""A hostile submission: it sabotages torch for everyone sharing its process, snoops on the
other submissions, and never returns from forward. Graded in its own process, it only hurts
itself: its gate times out, and every other student's grade is unchanged."""
import os

import torch
import torch.nn.functional as F
from torch import nn

print("snooping:", sorted(os.listdir("..")))  # the other students' staged folders

_garbage = lambda *args, **kwargs: torch.zeros(())  # noqa: E731
torch.softmax = _garbage
F.softmax = _garbage
torch.Tensor.softmax = _garbage


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        while True:  # never returns
            pass
