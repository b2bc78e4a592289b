"""What a student reads is in rubric language: no declaration to make (a remedy is data beside
a message, never rendered for a student), none of the grader's paths, their own file names and
lines kept. Rules one by one, then the feedback and the Gradescope results.json of a submission
whose results carry remedies and grader paths."""

from __future__ import annotations

import json
import re
import sysconfig
import textwrap
from datetime import datetime, timezone

import pytest

from conformance.checks.invariants.padding import UNRESOLVED_HINT, UNRESOLVED_REMEDY
from conformance.grading.report import feedback, outputs
from conformance.grading.report.student import Student
from conformance.grading.report.student_text import SUITE, for_student
from conformance.grading.run.store import Record
from conformance.grading.score.outcome import RunStatus, SubmissionOutcome, TargetOutcome
from conformance.grading.score.rubric_file import load
from conformance.grading.score.scoring import score
from conformance.model.remedies import Remedy
from conformance.model.results import CheckResult, Status

PACKAGES = sysconfig.get_paths()["purelib"]
STDLIB = sysconfig.get_paths()["stdlib"]
OUT = "/home/teacher/course/grading"
"""A grading output folder; the staged copy of a submission lives under it."""

CLI = re.compile(r"(?<![\w-])--[a-z]|\bdeclare\b|attention-conformance|conformance\.implementation")


def test_a_message_without_paths_is_shown_as_it_is():
    text = ("matches the reference at scale 1/sqrt(d_model) = 1/sqrt(4): did you divide by "
            "sqrt(hidden_dim) instead of sqrt(head_dim)?")
    assert for_student(text) == text


@pytest.mark.parametrize("text,shown", [
    (f"forward raised KeyError: 'x' ({OUT}/staged/1001/hw3/my attention.py:12)",
     "forward raised KeyError: 'x' (hw3/my attention.py:12)"),
    ("constructing it raised TypeError: bad (/tmp/sandbox-1/submission/attention.py:7)",
     "constructing it raised TypeError: bad (attention.py:7)"),
    (f"forward raised RuntimeError: shapes ({PACKAGES}/torch/nn/functional.py:12)",
     "forward raised RuntimeError: shapes (torch/nn/functional.py:12)"),
    (f"the check itself crashed in {SUITE}/invariants/padding.py:40",
     "the check itself crashed in the grader"),
    (f"{OUT}/staged/1001/notes.txt is not code", "notes.txt is not code"),
    # Not paths: formulas and slashes between words.
    ("1/sqrt(head_dim), q,k,v[,o], inner.q_proj/inner.k_proj, a / b",
     "1/sqrt(head_dim), q,k,v[,o], inner.q_proj/inner.k_proj, a / b"),
])
def test_paths_show_the_students_own_files_and_nothing_of_the_grader(text, shown):
    assert for_student(text, ["hw3/my attention.py", "attention.py"]) == shown


def test_traceback_frames_of_the_grader_are_dropped_the_students_kept():
    traceback = textwrap.dedent(f"""\
        Traceback (most recent call last):
          File "{SUITE}/worker/server.py", line 12, in run
            result = call()
                     ^^^^^^
          File "{STDLIB}/runpy.py", line 88, in _run_code
            exec(code, run_globals)
          File "{OUT}/staged/1001/attention.py", line 30, in forward
            scores = q @ k.transpose(1, 2)
          File "{PACKAGES}/torch/nn/functional.py", line 12, in linear
            return torch._C._nn.linear(input, weight, bias)
        RuntimeError: mat1 and mat2 shapes cannot be multiplied""")
    assert for_student(traceback, ["attention.py"]) == textwrap.dedent("""\
        Traceback (most recent call last):
          File "attention.py", line 30, in forward
            scores = q @ k.transpose(1, 2)
          File "torch/nn/functional.py", line 12, in linear
            return torch._C._nn.linear(input, weight, bias)
        RuntimeError: mat1 and mat2 shapes cannot be multiplied""")


RUBRIC = """
[assignment]
name = "hw3"
title = "Homework 3"
[[targets]]
class = "MHA"
[[targets.items]]
check = "gate"
points = 0
[[targets.items]]
check = "padding"
points = 2
[[targets.items]]
check = "kv_groups"
points = 1
[[targets.items]]
check = "autograd"
points = 1
"""


@pytest.fixture
def graded(tmp_path):
    """A submission whose results and notes carry command-line advice and grader paths."""
    path = tmp_path / "rubric.toml"
    path.write_text(textwrap.dedent(RUBRIC))
    rubric = load(path)
    results = [
        CheckResult("MHA", "gate", "cpu", Status.PASSED),
        CheckResult("MHA", "padding", "cpu", Status.FAILED,
                    reason="no mask convention makes masked keys invisible",
                    hint=UNRESOLVED_HINT + "; if it is meant to read it as tried, the mask is "
                                           "not applied as it should be",
                    remedy=UNRESOLVED_REMEDY),
        CheckResult("MHA", "kv_groups", "cpu", Status.WARNED,
                    reason="query head h reads key/value head h mod Hkv (tiled)",
                    hint="inference can't know which pairing was meant",
                    remedy=Remedy.to("kv_grouping", "interleaved", "hold it to HuggingFace's")),
        CheckResult("MHA", "autograd", "cpu", Status.FAILED,
                    reason=f"backward raised RuntimeError: boom ({OUT}/staged/1001/attention.py"
                           ":41)",
                    details=[f"the check itself crashed at {SUITE}/invariants/autograd.py:12",
                             f"in {PACKAGES}/torch/nn/functional.py:200"]),
    ]
    target = TargetOutcome("MHA", RunStatus.GRADED, "found in attention.py", "MHA",
                           "attention.py",
                           interface=["self-attention forward(x, mask)",
                                      "float16 assumed: what breaks there is a warning",
                                      "weights: q, k, v (probed)"],
                           called=["self-attention forward(x, mask)"], results=results)
    outcome = SubmissionOutcome(RunStatus.GRADED, "", [target], isolation="worker")
    record = Record("1001", "", "canvas", False, None, "hash", rubric.execution_key(),
                    ["attention.py"], ["attention.ipynb: 3 statement(s) not run"], outcome, {})
    student = Student("1001", "", "", "canvas", False, None, "", record, score(rubric, outcome))
    return rubric, student


def test_feedback_and_results_json_carry_no_command_line_advice_and_no_grader_path(graded):
    rubric, student = graded
    as_of = datetime(2026, 3, 5, tzinfo=timezone.utc)
    texts = {"feedback.md": feedback.markdown(rubric, student, as_of),
             "feedback.html": feedback.html(rubric, student, as_of),
             "results.json": json.dumps(outputs.gradescope_results(rubric, student))}
    for name, text in texts.items():
        assert not CLI.search(text), (name, CLI.search(text))
        for grader in (SUITE, PACKAGES, OUT, "site-packages"):
            assert grader not in text, (name, grader)
        # The student's own file and line, and what the messages say besides the advice.
        assert "attention.py:41" in text, name
        assert "torch/nn/functional.py:200" in text, name
        assert "the mask is not applied as it should be" in text, name
    page = texts["feedback.md"]
    # How the class was called is the student's; what inference found besides is the teacher's.
    assert "- self-attention forward(x, mask)" in page
    assert "(probed)" not in page and "float16 assumed" not in page
    # The hint is shown, the remedy beside it never is.
    assert "Worth knowing: inference can't know which pairing was meant" in page
    assert "HuggingFace" not in page and "keep_bool:per_query" not in page
