"""``check --watch``: every save is checked again, what failed last time first, a line per
save; a save that does not load is one line and the watch goes on; Ctrl-C leaves nothing
behind."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from worker_support import left_behind

from conformance.frontends.watch import order, watch
from conformance.model.results import CheckResult, Status

ROOT = Path(__file__).resolve().parents[1]

ATTENTION = '''
import math
import torch
from torch import nn


class MHA(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.dh = num_heads, d_model // num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.h, self.dh).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        s = q @ k.transpose(-1, -2) / math.sqrt(SCALE)
        return self.o((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, -1))
'''


def _module(path: Path, scale: str) -> None:
    path.write_text(ATTENTION.replace("SCALE", scale))


def test_what_failed_last_time_runs_first():
    assert order(["gate", "contract", "padding", "scale"], ["scale", "nope"]) == [
        "scale", "gate", "contract", "padding"]


def test_each_save_is_checked_again_what_failed_first(tmp_path):
    target = tmp_path / "attn.py"
    target.write_text("x = 1\n")
    orders: list[list[str]] = []

    def check_once(checks, lines):
        orders.append(list(checks))
        failed = "scale" if len(orders) == 1 else None
        results = [CheckResult("m", name, "cpu",
                               Status.FAILED if name == failed else Status.PASSED, reason="off")
                   for name in checks]
        for result in results:
            lines.checked(result)
        if len(orders) == 1:  # the user saves while the first run is shown
            os.utime(target, ns=(time.time_ns(), time.time_ns() + 10**9))
        return results

    out = io.StringIO()
    assert watch(check_once, [target], ["gate", "reference", "scale"], out, saves=1,
                 poll=0.01) == 0
    assert orders == [["gate", "reference", "scale"], ["scale", "gate", "reference"]]
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("  scale: failed: off")
    assert "failed: scale · 2 passed" in lines[1]
    assert lines[2].startswith("  scale: passes now")
    assert "3 passed" in lines[3] and len(lines) == 4


def _line(process: subprocess.Popen, seen: list[str], count: int, seconds: float = 120) -> None:
    """Read the watch's stdout until it has written ``count`` save lines (``[hh:mm:ss]``)."""
    deadline = time.monotonic() + seconds
    while sum(line.startswith("[") for line in seen) < count:
        assert time.monotonic() < deadline, seen
        line = process.stdout.readline()
        assert line, seen  # it ended
        seen.append(line)


def test_a_fix_saved_is_seen_and_ctrl_c_leaves_nothing(tmp_path):
    target = tmp_path / "attn.py"
    _module(target, "self.dh * self.h")  # divides by sqrt(d_model): a scale bug
    with left_behind() as left:
        process = subprocess.Popen(
            [sys.executable, "-m", "conformance", "check", "attn.py::MHA", "--watch",
             "--check", "gate", "--check", "reference", "--check", "scale"],
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            # A user's terminal: CI (where failing examples are never kept) is not set.
            env={**{k: v for k, v in os.environ.items() if k != "CI"},
                 "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"},
            # Started by a parent that ignores SIGINT, as a CI runner's worker may be: Ctrl-C
            # still ends the watch (the ignored disposition is inherited; the watch resets it).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        seen: list[str] = []
        _line(process, seen, 1)
        assert "failed: reference, scale · 1 passed" in seen[-1]
        target.write_text("def broken(:\n")  # saved mid-edit
        _line(process, seen, 2)
        assert "syntax" in seen[-1].lower()
        _module(target, "self.dh")  # fixed
        _line(process, seen, 3)
        fixed = seen[seen.index(next(s for s in seen if "syntax" in s.lower())) + 1:]
        # The failing ones ran first, each said as soon as known: the pool may run them side by
        # side, so either may end first (scale did, on a busy CI runner).
        passing = sorted(line.split(":")[0].strip() for line in fixed[:2])
        assert passing == ["reference", "scale"], fixed
        assert all(": passes now" in line for line in fixed[:2]), fixed
        assert "3 passed" in fixed[-1]
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # where it hangs: every thread's stack (faulthandler)
            process.send_signal(signal.SIGABRT)
            raise AssertionError("Ctrl-C did not end the watch in 30 s:\n"
                                 + process.communicate(timeout=30)[0][-6000:]) from None
        assert code == 130
    assert left == []
    assert (tmp_path / ".hypothesis" / "examples").is_dir()  # failures were kept to try first
