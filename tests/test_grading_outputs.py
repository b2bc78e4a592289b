"""Outputs from constructed results: grades.csv, GitHub Classroom CSV, Gradescope results.json
(field by field against the autograder specification), feedback visibility and escaping, the
class report."""

from __future__ import annotations

import csv
import json
import textwrap
from datetime import datetime, timezone

import pytest

from conformance.grading.intake.roster import Person, Roster
from conformance.grading.pipeline import write_outputs
from conformance.grading.report import class_report, feedback, outputs
from conformance.grading.report.student import Student
from conformance.grading.run.store import Record, Store
from conformance.grading.score.outcome import RunStatus, SubmissionOutcome, TargetOutcome, overall_status
from conformance.grading.score.rubric_file import load
from conformance.grading.score.scoring import score
from conformance.model.results import CheckResult, Status

RUBRIC = """
[assignment]
name = "hw3"
title = "Homework 3"
due = 2026-03-01T23:59:00Z
[[targets]]
class = "MHA"
[[targets.items]]
check = "gate"
points = 0
[[targets.items]]
check = "padding"
label = "padding mask"
points = 2
[[targets.items]]
check = "scale"
points = 1
visibility = "after_due_date"
[[targets.items]]
check = "autograd"
points = 1
visibility = "hidden"
"""

BEFORE = datetime(2026, 2, 1, tzinfo=timezone.utc)
AFTER = datetime(2026, 3, 5, tzinfo=timezone.utc)
EVIL = '<script>alert("x")</script> **bold** `code` | pipe'
PRINTED = "READ /etc/shadow: 'root:$6$...' <b>printed</b>"


@pytest.fixture
def rubric(tmp_path):
    path = tmp_path / "rubric.toml"
    path.write_text(textwrap.dedent(RUBRIC))
    return load(path)


def result(check: str, status: Status, **extra) -> CheckResult:
    return CheckResult("MHA", check, "cpu", status, **extra)


def student(rubric, id_: str, results: list[CheckResult] | None, *, status=RunStatus.GRADED,
            message="", name="", late=False, layout="canvas", output="",
            near_misses=()) -> Student:
    if results is None:
        outcome = SubmissionOutcome(status, message)
    else:
        targets = [TargetOutcome("MHA", status, message, "MHA", "attention.py", list(near_misses),
                                 interface=["self-attention forward(x, mask)"], results=results)]
        outcome = SubmissionOutcome(overall_status(targets), message, targets, output=output,
                                    isolation="worker", seconds=3.2)
    record = Record(id_, name, layout, late, None, f"hash-{id_}", rubric.execution_key(),
                    ["attention.py"], [], outcome, {"attention-conformance": "0.1.0"})
    return Student(id_, name, "", layout, late, None, "", record, score(rubric, outcome))


@pytest.fixture
def students(rubric):
    failing = result("padding", Status.FAILED, reason=f"masked keys changed row 0 {EVIL}",
                     counterexample="Case(batch=1, q_len=2, kv_len=2, num_heads=1, head_dim=1)",
                     details=["batch 0 keeps keys [0], masks [1]"],
                     hint="output is independent of the kept keys: is the mask inverted?")
    return [
        student(rubric, "1001", [result("gate", Status.PASSED), result("padding", Status.PASSED),
                                 result("scale", Status.PASSED), result("autograd", Status.PASSED)],
                name="Ada Lovelace"),
        student(rubric, "1002", [result("gate", Status.PASSED), failing,
                                 result("scale", Status.FAILED, reason="scale 1/sqrt(8)",
                                        hint="did you divide by sqrt(d_model)?"),
                                 result("autograd", Status.FAILED, reason="secret detail")],
                late=True, output=PRINTED),
        student(rubric, "1003", [result("gate", Status.PASSED),
                                 result("padding", Status.FAILED, reason="changed row 1",
                                        hint="output is independent of the kept keys: is the "
                                             "mask inverted?"),
                                 result("scale", Status.PASSED), result("autograd", Status.PASSED)]),
        student(rubric, "1004", [], status=RunStatus.NOT_FOUND,
                message="no class MHA; did you mean Mha?", near_misses=["Mha"]),
        student(rubric, "1005", None, status=RunStatus.UNREADABLE,
                message="s.zip is not a readable zip archive"),
        student(rubric, "1006", [result("gate", Status.PASSED)], status=RunStatus.TIMEOUT,
                message="padding exceeded the per-check limit of 15 s"),
        student(rubric, "1007", [result("gate", Status.PASSED), result("padding", Status.PASSED),
                                 result("scale", Status.SKIPPED,
                                        reason="no assignment of its weights reproduces its "
                                               "output"),
                                 result("autograd", Status.PASSED)]),
    ]


def test_grades_csv_has_a_points_possible_row_and_one_row_per_student(rubric, students, tmp_path):
    path = tmp_path / "grades.csv"
    outputs.write_grades_csv(path, rubric, students)
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["id", "name", "late", "MHA.gate", "MHA.padding", "MHA.scale", "MHA.autograd",
                       "total", "percent", "status", "not_evaluated", "provisional_total",
                       "submission_hash"]
    assert rows[1] == ["Points Possible", "", "", "0", "2", "1", "1", "4", "100", "", "", "", ""]
    assert rows[2] == ["1001", "Ada Lovelace", "", "0", "2", "1", "1", "4", "100.0", "graded", "",
                       "", "hash-1001"]
    assert rows[3][:2] == ["1002", ""] and rows[3][2] == "yes" and rows[3][-6:-3] == ["0", "0.0", "graded"]
    assert [r[-4] for r in rows[5:]] == ["not found", "unreadable", "timeout", "partly evaluated"]
    assert rows[7][7] == "0"                                  # the timeout kept nothing else
    # An item that could not be run is never a silent zero, and the points so far never look
    # final: the item and the total empty, the points so far provisional, the item named.
    assert rows[8][3:] == ["0", "2", "", "1", "", "", "partly evaluated", "MHA.scale", "3",
                           "hash-1007"]


def test_classroom_csv_uses_github_classrooms_columns(rubric, students, tmp_path):
    path = tmp_path / "classroom.csv"
    outputs.write_classroom_csv(path, rubric, students)
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == list(outputs.CLASSROOM_COLUMNS)
    assert rows[0]["assignment_name"] == "hw3"
    assert (rows[0]["roster_identifier"], rows[0]["points_awarded"], rows[0]["points_available"]) == (
        "1001", "4", "4")


SPEC_TOP = {"score", "execution_time", "output", "output_format", "test_output_format",
            "test_name_format", "visibility", "stdout_visibility", "extra_data", "tests",
            "leaderboard"}
SPEC_TEST = {"score", "max_score", "status", "name", "name_format", "number", "output",
             "output_format", "tags", "visibility", "extra_data"}
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
FORMATS = {"text", "html", "simple_format", "md", "ansi"}


def test_results_json_follows_the_gradescope_specification(rubric, students):
    for one in students:
        payload = json.loads(json.dumps(outputs.gradescope_results(rubric, one)))
        assert set(payload) <= SPEC_TOP
        assert payload["visibility"] in VISIBILITY and payload["stdout_visibility"] in VISIBILITY
        assert payload["output_format"] in FORMATS and payload["test_output_format"] in FORMATS
        scored = [t for t in payload["tests"] if "score" in t]
        assert payload["score"] == pytest.approx(sum(t["score"] for t in scored))
        assert payload["score"] == one.score.total
        for test in payload["tests"]:
            assert set(test) <= SPEC_TEST
            assert test["status"] in ("passed", "failed")
            assert test["visibility"] in VISIBILITY
            assert isinstance(test["name"], str) and isinstance(test["number"], str)
            if "score" in test:
                assert 0 <= test["score"] <= test["max_score"]
                assert (test["status"] == "passed") == (test["score"] == test["max_score"]
                                                        and test["extra_data"]["state"] == "passed")
    payload = outputs.gradescope_results(rubric, students[1])
    by_name = {t["name"]: t for t in payload["tests"]}
    padding = by_name["MHA: padding mask"]
    assert padding["score"] == 0 and padding["max_score"] == 2 and padding["status"] == "failed"
    assert "is the mask inverted?" in padding["output"]
    assert "batch 1, 2 queries and 2 keys" in padding["output"]
    assert by_name["MHA: scale"]["visibility"] == "after_due_date"
    assert by_name["MHA: autograd"]["visibility"] == "hidden"
    assert by_name["MHA: found and loaded"]["status"] == "passed"
    assert "score" not in by_name["MHA: found and loaded"]  # informational, per the spec
    assert payload["extra_data"]["submission_hash"] == "hash-1002"
    assert payload["execution_time"] == 3


def test_feedback_shows_each_item_as_its_visibility_allows(rubric, students):
    before = feedback.markdown(rubric, students[1], BEFORE)
    assert "| padding mask | failed | 0 / 2 |" in before
    assert "| scale | shown after 2026-03-01 23:59 UTC | – |" in before
    assert "did you divide by sqrt" not in before            # after_due_date detail held back
    assert "autograd" not in before and "secret detail" not in before   # hidden: nothing
    assert "1 further item(s) are graded but not shown here" in before
    assert "0 / 2 on the items shown here; 2 more item(s) worth 2 point(s) are not shown here" \
        in before
    assert "Likely bug: output is independent of the kept keys: is the mask inverted?" in before
    assert "batch 1, 2 queries and 2 keys per sequence, 1 head of width 1" in before
    assert "batch 0 keeps keys \\[0\\], masks \\[1\\]" in before
    after = feedback.markdown(rubric, students[1], AFTER)
    assert "| scale | failed | 0 / 1 |" in after and "did you divide by sqrt(d\\_model)?" not in after
    assert "did you divide by sqrt(d_model)?" in after and "secret detail" not in after


def test_feedback_escapes_what_the_submission_controls(rubric, students):
    page = feedback.html(rubric, students[1], AFTER)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    text = feedback.markdown(rubric, students[1], AFTER)
    reason = next(line for line in text.splitlines() if line.startswith("What went wrong"))
    assert "\\<script\\>" in reason and "\\*\\*bold\\*\\*" in reason and "\\`code\\`" in reason
    # What the code printed is the teacher's only.
    assert "What your code printed" not in text and "shadow" not in text


def test_feedback_for_students_who_did_not_get_graded(rubric, students):
    unreadable = feedback.markdown(rubric, students[4], AFTER)
    assert "> unreadable: s.zip is not a readable zip archive" in unreadable
    missing = feedback.markdown(rubric, students[3], AFTER)
    assert "did you mean Mha?" in missing
    assert "### " not in missing  # the reason is said once, not per item


def test_a_status_the_message_already_begins_with_is_said_once(rubric):
    syntax = "syntax error in attention.py, line 17: expected ':'"
    broken = student(rubric, "1010", [], status=RunStatus.SYNTAX_ERROR, message=syntax)
    page = feedback.markdown(rubric, broken, AFTER)
    assert f"> {syntax}" in page and "syntax error: syntax error" not in page
    tests = outputs.gradescope_results(rubric, broken)["tests"]
    assert not any("syntax error: syntax error" in test.get("output", "") for test in tests)
    assert any(syntax in test.get("output", "") for test in tests)
    whys = {check.why for item in broken.score.items for check in item.checks}
    assert syntax in whys and not any("syntax error: syntax" in why for why in whys)
    crashed = student(rubric, "1011", None, status=RunStatus.IMPORT_ERROR,
                      message="import error in attention.py: ModuleNotFoundError: No module named "
                              "'numpyy'")
    assert dict(class_report.needs_a_look([crashed]))["1011"].startswith("import error in ")
    # A message that does not begin with it keeps the status before it.
    timed_out = student(rubric, "1012", None, status=RunStatus.TIMEOUT, message="ran 240 s")
    assert dict(class_report.needs_a_look([timed_out]))["1012"] == "timeout: ran 240 s"


def test_class_report_finds_common_bugs_and_who_needs_a_look(rubric, students, tmp_path):
    bugs = class_report.likely_bugs(students)
    assert bugs[0].check == "padding" and bugs[0].students == ("1002", "1003")
    assert bugs[0].text == "output is independent of the kept keys: is the mask inverted?"
    look = dict(class_report.needs_a_look(students))
    assert set(look) == {"1004", "1005", "1006", "1007"}
    assert look["1004"] == "MHA not found; defines Mha"
    assert look["1006"].startswith("timeout")
    assert look["1007"] == ("MHA.scale: scale not evaluated (no assignment of its weights "
                            "reproduces its output)")
    class_report.write(tmp_path, rubric, students)
    assert (tmp_path / "class_report.png").stat().st_size > 10_000
    report = (tmp_path / "class_report.md").read_text()
    assert "![scores and per-item results](class_report.png)" in report
    assert "| output is independent of the kept keys: is the mask inverted? | padding | 2: 1002, 1003 |" \
        in report
    html = (tmp_path / "class_report.html").read_text()
    assert '<img src="class_report.png"' in html


def test_outputs_are_a_function_of_the_rows_alone(rubric, students, tmp_path):
    roster = Roster([Person(("1001",), "Ada Lovelace", "ada@example.edu")])
    write_outputs(tmp_path / "a", rubric, students, roster=roster, as_of=BEFORE)
    write_outputs(tmp_path / "b", rubric, list(reversed(students)) and students, roster=roster,
                  as_of=BEFORE)
    for name in ("grades.csv", "classroom.csv", "class_report.md", "students/1002/feedback.html",
                 "students/1002/results.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    header = (tmp_path / "a" / "grades.csv").read_text().splitlines()[0]
    assert header.startswith("id,name,email,late,")
    run = json.loads((tmp_path / "a" / "run.json").read_text())
    assert run["statuses"] == {"graded": 3, "not found": 1, "timeout": 1, "unreadable": 1,
                               "partly evaluated": 1}
    # What a submission printed is in a teacher-only file, and named in the class report.
    assert (tmp_path / "a" / "printed" / "1002.txt").read_text().endswith(PRINTED)
    assert sorted(p.name for p in (tmp_path / "a" / "printed").iterdir()) == ["1002.txt"]
    assert "printed/1002.txt" in (tmp_path / "a" / "class_report.md").read_text()
    for name in ("feedback.md", "feedback.html", "results.json"):
        assert "shadow" not in (tmp_path / "a" / "students" / "1002" / name).read_text()
    assert set(run["versions"]) == {"attention-conformance", "torch", "hypothesis", "python",
                                    "environment"}


def test_the_store_round_trips_and_writes_atomically(rubric, students, tmp_path):
    store = Store(tmp_path / "results")
    record = students[1].record
    store.save(record)
    assert store.load("1002").to_dict() == record.to_dict()
    assert store.current("1002", "hash-1002", rubric.execution_key()) is None  # old versions
    from conformance.grading.run.store import versions

    record.versions = versions()
    store.save(record)
    assert store.current("1002", "hash-1002", rubric.execution_key()) is not None
    assert store.current("1002", "other-hash", rubric.execution_key()) is None
    assert store.current("1002", "hash-1002", "other-key") is None
    # A package the environment lacked is tried again on every run, whatever the digest says.
    status = record.outcome.status
    record.outcome.status = RunStatus.MISSING_PACKAGE
    store.save(record)
    assert store.current("1002", "hash-1002", rubric.execution_key()) is None
    record.outcome.status = status
    store.save(record)
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["1002.json"]  # no temporaries
    (tmp_path / "results" / "1003.json").write_text("{half a fi")
    assert store.load("1003") is None
