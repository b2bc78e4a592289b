"""The example class, end to end: the committed grades.csv, resuming, regrading some students,
and a hostile submission that changes nobody else's grade.

Every submission runs in the sandboxed worker, as a teacher's run does.
"""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conformance.checks import mask_mistakes
from conformance.grading import merge, pipeline, selftest, shards
from conformance.grading.intake.roster import load as load_roster
from conformance.grading.report.student_text import SUITE
from conformance.grading.score.rubric_file import load

EXAMPLE = Path(__file__).parents[1] / "examples" / "attention-assignment"
AS_OF = datetime(2026, 2, 20, tzinfo=timezone.utc)  # before the due date


def grade(out: Path, **options):
    return pipeline.grade_class(EXAMPLE / "submissions", load(EXAMPLE / "rubric.toml"), out,
                                roster=load_roster(EXAMPLE / "roster.csv"),
                                as_of=AS_OF,
                                **{"jobs": 2, **options})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    out = tmp_path_factory.mktemp("example") / "out"
    return out, grade(out)


def test_the_grades_are_the_committed_ones(graded):
    out, result = graded
    assert len(result.graded) == 14 and not result.reused
    # Where a grade differs, what each run said (a grader error's message names the check).
    said = [(s.id, s.outcome.status, s.outcome.message) for s in result.students
            if s.outcome is not None and s.outcome.message]
    assert (out / "grades.csv").read_text() == (EXAMPLE / "expected" / "grades.csv").read_text(), said


def test_every_student_gets_feedback_and_a_gradescope_result(graded):
    out, result = graded
    for student in result.students:
        folder = out / "students" / student.id
        assert (folder / "feedback.md").is_file() and (folder / "feedback.html").is_file()
        payload = json.loads((folder / "results.json").read_text())
        assert payload["score"] == student.score.total
    for name in ("classroom.csv", "class_report.md", "class_report.html", "class_report.png",
                 "run.json"):
        assert (out / name).is_file(), name


def test_the_class_report_flags_what_needs_a_human(graded):
    out, _ = graded
    report = (out / "class_report.md").read_text()
    look = report.split("## Needs a human look")[1]
    for student, why in [("1005", "MultiHeadAttention not found; defines MultiheadAttention"),
                         ("1008", "timeout"), ("1009", "unreadable")]:
        assert f"| {student} | {why}" in look, look
    bugs = report.split("## Most common likely bugs")[1].split("##")[0]
    # One mistake seen by several checks is one row, with every check: the same kind of bug,
    # whatever each check's words (grading charges it once the same way).
    scale = [line for line in bugs.splitlines() if "| 1: 1003 |" in line]
    assert len(scale) == 1 and "divide by sqrt(hidden_dim) instead of sqrt(head_dim)?" in scale[0]
    assert "| head_split, reference, scale | 1: 1003 |" in scale[0]
    assert "is W_o skipped? | head_split, reference, autograd | 1: bliskov |" in bugs
    # A failure that names no bug is said as a symptom, its numbers masked.
    symptoms = [line for line in bugs.splitlines() if "(none named) symptom:" in line]
    assert symptoms and not any(re.search(r"\d\.\d", line.split("|")[1]) for line in symptoms)
    per_item = report.split("## Per item")[1].split("##")[0]
    assert "-0%" not in per_item


CLI = re.compile(r"(?<![\w-])--[a-z]|\bdeclare\b|attention-conformance|conformance\.implementation")
"""What command-line advice looks like."""


def test_students_read_rubric_language_their_own_files_and_measured_hints(graded):
    out, result = graded
    for student in result.students:
        folder = out / "students" / student.id
        # What the code printed is the student's own (and goes in another change).
        page = (folder / "feedback.md").read_text().split("## What your code printed")[0]
        payload = json.loads((folder / "results.json").read_text())
        shown = [payload["output"]] + [f"{t['name']}\n{t.get('output', '')}"
                                       for t in payload["tests"]]
        for text in (page, *shown):
            assert not CLI.search(text), (student.id, CLI.search(text))
            for grader in (str(out), SUITE, "site-packages"):
                assert grader not in text, (student.id, grader)
    pages = {s.id: (out / "students" / s.id / "feedback.md").read_text()
             for s in result.students}
    # Dijkstra reads the mask inverted: named as such where padding fails.
    padding = pages["2002"].split("### padding mask")[1].split("###")[0]
    assert f"Likely bug: {mask_mistakes.Mistake.INVERTED.words}" in padding
    # Scrambled heads and a query-axis softmax break causality, the causal mask is right:
    # no causal-mask mistake is named.
    for student in ("mhamilton", "torvalds"):
        for words in (mask_mistakes.Mistake.HIDES_CURRENT.words,
                      mask_mistakes.Mistake.SHOWS_NEXT.words, "triu"):
            assert words not in pages[student], (student, words)


def test_a_mask_mistake_is_charged_once_where_padding_judges_it(graded):
    """Dijkstra reads the mask inverted, Johnson ignores it: each loses padding's 2 points and
    nothing else; the checks that require padding ran without the mask and say so."""
    _, result = graded
    students = {s.id: s for s in result.students}
    for student in ("2001", "2002"):
        score = students[student].score
        assert score.item("MultiHeadAttention.padding").points == 0
        for key in ("row_stochastic", "head_split", "numerics", "autograd"):
            item = score.item(f"MultiHeadAttention.{key}")
            assert item.points == item.max_points, (student, key)
        (target,) = [t for t in students[student].outcome.targets
                     if t.target == "MultiHeadAttention"]
        assert any("run without mask" in note for note in target.result("head_split").observations)


def test_a_hostile_submission_hurts_only_itself(graded):
    _, result = graded
    by_id = {s.id: s for s in result.students}
    mallory = by_id["1008"]
    assert mallory.status.value == "timeout" and mallory.score.total == 0
    assert "snooping:" in mallory.outcome.output
    # It replaced torch.softmax in its process; the correct submissions still get full marks.
    for correct in ("1001", "1002", "1006", "1007"):
        outcome = by_id[correct].outcome
        assert by_id[correct].score.percent == 100.0, (correct, outcome.status, outcome.message,
                                                       [t.message for t in outcome.targets])


def test_a_rerun_regrades_nothing_and_an_interrupted_one_resumes(graded, tmp_path):
    out, _ = graded
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    again = grade(copy)
    assert again.graded == [] and len(again.reused) == 14
    # As if interrupted before 2002 was stored.
    (copy / "results" / "2002.json").unlink()
    resumed = grade(copy)
    assert resumed.graded == ["2002"]
    assert (copy / "grades.csv").read_text() == (out / "grades.csv").read_text()


def test_only_regrades_the_named_students(graded, tmp_path):
    out, _ = graded
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    result = grade(copy, only={"1003"}, jobs=1)
    assert result.graded == ["1003"] and "1003" not in result.reused
    assert (copy / "grades.csv").read_text() == (out / "grades.csv").read_text()
    with pytest.raises(pipeline.GradingInputError, match="no submission with id 9999"):
        grade(copy, only={"9999"})


def test_two_shards_merged_equal_one_run(graded, tmp_path):
    out, result = graded
    parts = [tmp_path / "shard1", tmp_path / "shard2"]
    # Both at once, as on two machines; one submission at a time each (two in all, as in one
    # run with jobs=2).
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda k: grade(parts[k - 1], shard=shards.Shard(k, 2), jobs=1),
                             (1, 2)))
    assert all(shard.graded and not shard.reused for shard in done)
    rows = [(part / "grades.csv").read_text().splitlines() for part in parts]
    # Each shard holds a part of the class (header and points row aside), no row twice.
    assert rows[0][:2] == rows[1][:2] == (out / "grades.csv").read_text().splitlines()[:2]
    ids = [{row.split(",")[0] for row in part[2:]} for part in rows]
    assert ids[0] and ids[1] and not ids[0] & ids[1]
    assert sorted(rows[0][2:] + rows[1][2:]) \
        == sorted((out / "grades.csv").read_text().splitlines()[2:])
    merged = tmp_path / "merged"
    combined = merge.merge(parts, load(EXAMPLE / "rubric.toml"), merged,
                           roster=load_roster(EXAMPLE / "roster.csv"), as_of=AS_OF)
    assert combined.submissions == 14 and len(combined.students) == len(result.students) == 15
    assert (merged / "grades.csv").read_bytes() == (out / "grades.csv").read_bytes()
    assert (merged / "classroom.csv").read_bytes() == (out / "classroom.csv").read_bytes()
    # The class report is the whole class's, recomputed.
    assert (merged / "class_report.md").read_text() == (out / "class_report.md").read_text()
    for name in ("class_report.html", "class_report.png", "run.json"):
        assert (merged / name).is_file(), name
    # The merged folder resumes like one run's: nothing to regrade.
    again = grade(merged)
    assert again.graded == [] and len(again.reused) == 14
    assert (merged / "grades.csv").read_bytes() == (out / "grades.csv").read_bytes()


def test_the_reference_solution_gets_full_marks():
    graded_reference, outcome, problems = selftest.grade_reference(load(EXAMPLE / "rubric.toml"))
    assert problems == [] and graded_reference.total == graded_reference.max_points == 12
    assert outcome.status.value == "graded"
