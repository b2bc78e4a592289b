"""What a submission prints is for the teacher only, and printing is never a reason for a zero;
what its exceptions say reaches the student bounded.

A class of hostile submissions that print (what they read on the grading machine, their
environment, 20 MB of debugging output at import and in forward) is graded: every student-facing
file (feedback.md, feedback.html, results.json) is searched for what each one printed, which
must be only in the teacher's ``printed/ID.txt`` and named in the class report; the flooding
submission, whose attention is correct, gets the points its code earns.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from conformance.grading.pipeline import grade_class
from conformance.grading.score.rubric_file import load

HOSTILE = Path(__file__).parent / "fixtures" / "hostile"

RUBRIC = """
[assignment]
seed = 5
[limits]
check_seconds = 20
submission_seconds = 120
memory_mb = 1024
[[targets]]
class = "MultiHeadAttention"
[targets.interface]
call = "self"
mask = "keep_int:broadcast"
causal = "never"
width-arg = "d_model"
heads-arg = "num_heads"
[[targets.items]]
check = "gate"
points = 0
[[targets.items]]
check = "contract"
points = 1
[[targets.items]]
check = "padding"
points = 2
"""

FLOODER = '''
import math
import sys

import torch
from torch import nn

for line in range(20 * 1024):
    print(f"DEBUG-IMPORT line {line}: " + "z" * 1000)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, mask=None):
        print("DEBUG-FORWARD shapes", tuple(x.shape), file=sys.stderr)
        print("DEBUG-FORWARD " + "w" * 5000)
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(b, n, -1))
'''

EXCEPTOR = '''
import os

import torch
from torch import nn


def _secrets():
    try:
        with open("/etc/passwd") as handle:
            read = " ".join(handle.read().split())
    except OSError as error:
        read = f"DENIED {error}"
    return "LEAK-START " + "x" * 150 + " SECRET-TAIL " + read + " ENV " + repr(dict(os.environ))


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        raise RuntimeError(_secrets())
'''


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("printing")
    download = root / "download"
    download.mkdir()
    rubric_path = root / "rubric.toml"
    rubric_path.write_text(textwrap.dedent(RUBRIC))
    shutil.copytree(HOSTILE / "reads_secrets", download / "snooper")
    shutil.copytree(HOSTILE / "writes_files", download / "planter")
    (download / "flooder").mkdir()
    (download / "flooder" / "attention.py").write_text(FLOODER)
    (download / "exceptor").mkdir()
    (download / "exceptor" / "attention.py").write_text(EXCEPTOR)
    # Where a student might guess the grader keeps what matters: the rubric, a classmate's code.
    (download / "snooper" / "targets.txt").write_text(
        f"{rubric_path}\n{download / 'flooder' / 'attention.py'}\n/etc/hostname\n")
    out = root / "out"
    result = grade_class(download, load(rubric_path), out, jobs=2)
    return out, {s.id: s for s in result.students}


def _printed_lines(out: Path, student: str) -> list[str]:
    """Distinctive lines of what ``student`` printed (the teacher's file, its header left out)."""
    text = (out / "printed" / f"{student}.txt").read_text()
    lines = [line.strip() for line in text.splitlines()[1:]]
    return [line[:80] for line in lines if len(line) >= 12 and not line.startswith("[... ")]


def test_what_submissions_print_never_reaches_a_student(graded):
    out, students = graded
    for student in ("snooper", "planter", "flooder"):
        printed = _printed_lines(out, student)
        assert printed, f"{student} printed nothing the teacher can see"
        for name in ("feedback.md", "feedback.html", "results.json"):
            for other in students:
                facing = (out / "students" / other / name).read_text()
                leaked = [line for line in printed if line in facing]
                assert not leaked, (student, other, name, leaked[:3])
    assert any(line.startswith(("READ ", "DENIED ")) for line in _printed_lines(out, "snooper"))
    assert any(line.startswith("ENV ") for line in _printed_lines(out, "planter"))
    report = (out / "class_report.md").read_text()
    for student in ("snooper", "planter", "flooder"):
        assert f"printed/{student}.txt" in report


def test_printing_megabytes_costs_nothing_but_its_warning(graded):
    out, students = graded
    flooder = students["flooder"]
    assert flooder.status.value == "graded"
    assert flooder.score.total == flooder.score.max_points == 3
    contract = flooder.outcome.targets[0].result("contract")
    assert contract.status.value == "warning"
    assert contract.reason.startswith("forward printed ") and "DEBUG" not in contract.reason
    assert flooder.outcome.printed_bytes > 20 * 1024 * 1000          # counted in full
    kept = (out / "printed" / "flooder.txt").read_text()
    assert "DEBUG-IMPORT line 0:" in kept and len(kept) < 64 * 1024  # the beginning, not 20 MB


def test_what_a_submissions_exception_says_reaches_it_bounded(graded):
    """Its exception message carries a file's contents and its environment: the student sees
    the type and the message's start, cut, never what lies past it; the teacher sees it all."""
    out, students = graded
    assert students["exceptor"].score.total == 0
    for name in ("feedback.md", "feedback.html", "results.json"):
        facing = (out / "students" / "exceptor" / name).read_text()
        assert "SECRET-TAIL" not in facing and " ENV {" not in facing, name
    feedback = (out / "students" / "exceptor" / "feedback.md").read_text()
    assert "RuntimeError: LEAK-START" in feedback
    assert "the whole message is in your teacher's copy" in feedback
    gate = students["exceptor"].outcome.targets[0].result("gate")
    assert "SECRET-TAIL" in gate.reason  # the teacher's copy keeps it whole
