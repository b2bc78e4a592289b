"""Grading as the courses teach (issue 66): a class per convention (the Annotated Transformer's,
d2l's valid lengths, CS231n's shared mask, nanoGPT's config), each graded with a rubric that
lists items and points only, and every student gets the total written down before grading:
one bug costs one item, found by diagnosis; every correct form gets full marks."""

from __future__ import annotations

import re

import pytest

from conformance.grading import pipeline
from conformance.grading.score.rubric_file import load
from conformance.grading.score.scoring import State
from conformance.model.check_names import CHECK_NAMES
from tests.fixtures.grading_classes import CLASSES


@pytest.fixture(scope="module", params=list(CLASSES))
def graded(request, tmp_path_factory):
    course = CLASSES[request.param]
    folder = course.write(tmp_path_factory.mktemp(request.param))
    result = pipeline.grade_class(folder / "submissions", load(folder / "rubric.toml"),
                                  folder / "out", jobs=2)
    return course, {student.id: student for student in result.students}, folder / "out"


def test_each_rubric_lists_items_and_points_only():
    for course in CLASSES.values():
        assert "requires" not in course.rubric


def test_each_student_gets_the_total_written_down_before_grading(graded):
    course, students, _ = graded
    said = {name: (s.outcome.status.value, s.outcome.message) for name, s in students.items()
            if s.outcome is not None and s.outcome.message}
    assert {name: s.score.total for name, s in students.items()} == course.totals, said


def test_one_bug_costs_one_item_and_its_symptoms_say_where_it_is_charged(graded):
    course, students, _ = graded
    for student in course.students:
        score = students[student.name].score
        lost = [item.item.key for item in score.items if item.points < item.max_points]
        correct = student.total == score.max_points
        assert len(lost) == (0 if correct else 1), (student.name, lost)
        for item in score.items:
            if item.state is State.EXCUSED:
                assert item.charged_to is not None and item.charged_to.key in lost, (
                    student.name, item.item.key)


def test_the_class_report_groups_students_by_diagnosed_cause(graded):
    """Each student with one bug is counted in one group of the class report, the one of the
    item charged: their symptoms elsewhere (a padding leak from scrambled heads) make no group
    of their own."""
    from conformance.grading.report.class_report import likely_bugs

    course, students, _ = graded
    groups = likely_bugs(list(students.values()))
    for student in course.students:
        if student.total == students[student.name].score.max_points:
            assert not any(student.name in bug.students for bug in groups)
            continue
        (charged,) = [item for item in students[student.name].score.items
                      if item.points < item.max_points]
        (group,) = [bug for bug in groups if student.name in bug.students]
        assert set(charged.item.checks) & set(group.checks), (student.name, group.checks)


SUITE_WORDS = re.compile(r"Case\(|hypothesis|assumed|probed|canonical|nn\.Module can be cast|"
                         r"declare --|weights: |position-free|found by trial|"
                         + "|".join(rf"\b{name}\b" for name in CHECK_NAMES if "_" in name))
"""What the suite says of its own workings: its cases' repr, its instruments, its check names
(those with an underscore, which no label shares)."""


def test_student_feedback_speaks_the_course(graded):
    """A student reads the rubric's labels, their class as the course builds and calls it, and
    an example with its mask as the course passes it (``mask = [[[1, 0]]]``, ``valid_lens =
    [2, 1]``), never the suite's vocabulary."""
    course, _, out = graded
    argument = next((line.split("@")[1].strip('"') for line in course.rubric.splitlines()
                     if line.startswith("mask = ") and "@" in line), "mask")
    masked = 0
    for name in course.totals:
        text = (out / "students" / name / "feedback.md").read_text()
        assert not SUITE_WORDS.search(text), (name, SUITE_WORDS.search(text).group(0))
        assert "How your class was built and called" in text
        masked += f"{argument} = [" in text
    if "mask = " in course.rubric:
        assert masked, f"no example shows {argument} as the course passes it"


def test_a_reference_the_rubric_cannot_build_says_why_in_one_line(tmp_path):
    """d2l's own code as the reference, with the width declared under a name its constructor
    swallows in ``**kwargs`` (``d_model`` for ``num_hiddens``): the self-test says so in one
    line, naming the class, the status and what the constructor takes, not 0 points per item."""
    from conformance.grading import selftest

    course = CLASSES["d2l"]
    folder = course.write(tmp_path)
    (folder / "reference.py").write_text(course.base())
    text = (folder / "rubric.toml").read_text().replace(
        'width-arg = "num_hiddens"', 'width-arg = "d_model"').replace(
        "seed = 66\n", 'seed = 66\nreference = "reference.py"\n', 1)
    assert 'width-arg = "d_model"' in text
    (folder / "rubric.toml").write_text(text)
    graded, _, problems = selftest.grade_reference(load(folder / "rubric.toml"))
    assert graded.total == 0
    assert len(problems) == 1, problems
    assert problems[0].startswith("MultiHeadAttention: interface mismatch: ")
    assert "'d_model', sets no width" in problems[0] and "num_hiddens" in problems[0]
