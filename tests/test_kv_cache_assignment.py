"""The second example class (``examples/kv-cache-assignment``): causal self-attention with a KV
cache, graded end to end under the default charge_once policy. The committed grades.csv; each
single-bug submission losing exactly the item of its bug; the correct ones full marks; a syntax
error in one line; a hostile submission that changes only its own grade.

Every submission runs in the sandboxed worker, as a teacher's run does.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conformance.grading import pipeline
from conformance.grading.intake.roster import load as load_roster
from conformance.grading.score.rubric_file import load

EXAMPLE = Path(__file__).parents[1] / "examples" / "kv-cache-assignment"
AS_OF = datetime(2026, 4, 1, tzinfo=timezone.utc)  # before the due date
TARGET = "CachedSelfAttention"

CORRECT = ("2101", "2102", "2103")
"""einsum; a fused qkv projection; a loop over the heads (a Moodle folder of two files)."""

SINGLE_BUG = [
    # student, the bug, the one item it must cost
    ("2104", "divides by sqrt(d_model) instead of sqrt(head_dim)", "numerics"),
    # Also fails causal, numerics, head_split and kv_cache, each naming the same kind of bug.
    ("2105", "softmax over the query axis", "row_stochastic"),
    ("2106", "the cache concatenated on the head axis", "kv_cache"),
    ("2107", "the past cache handed back unchanged (stale)", "kv_cache"),
    ("2108", "causal mask triu(1) on the (new, total) scores: top-left while decoding",
     "kv_cache"),
    # Also fails numerics, head_split and kv_cache (its full forward is not causal: no
    # decoding can match it), each naming the same kind of bug.
    ("2109", "no causal mask", "causal"),
    # The rubric states the cache's layout (cache-layout = "bhld"): a correct attention whose
    # cache keeps the heads merged, (B, L, d_model), is held to it.
    ("2112", "the cache returned as (B, L, d_model), not (B, H, L, head_dim)", "kv_cache"),
]

SYNTAX_ERROR = "2110"
HOSTILE = "2111"
FAKE_GRADE = "FINAL GRADE: 14/14"
"""What the hostile submission prints."""
PWNED = "kvcache-PWNED.txt"
"""The file the hostile submission tries to write outside its folder."""


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv-cache") / "out"
    result = pipeline.grade_class(EXAMPLE / "submissions", load(EXAMPLE / "rubric.toml"), out,
                                  roster=load_roster(EXAMPLE / "roster.csv"), as_of=AS_OF,
                                  jobs=2)
    return out, result, {student.id: student for student in result.students}


def lost(student) -> set[str]:
    """The keys of the items ``student`` lost points in, without the target's name."""
    return {item.item.key.removeprefix(f"{TARGET}.") for item in student.score.items
            if item.points < item.max_points}


def test_the_grades_are_the_committed_ones(graded):
    out, result, _ = graded
    assert len(result.graded) == 12 and not result.reused
    assert (out / "grades.csv").read_text() == (EXAMPLE / "expected" / "grades.csv").read_text()


def test_the_correct_submissions_get_full_marks(graded):
    _, _, students = graded
    for student in CORRECT:
        score = students[student].score
        assert students[student].status.value == "graded", student
        assert score.total == score.max_points == 14, (student, lost(students[student]))


@pytest.mark.parametrize(("student", "bug", "item"), SINGLE_BUG)
def test_a_single_bug_loses_exactly_its_item(graded, student, bug, item):
    _, _, students = graded
    graded_student = students[student]
    assert graded_student.status.value == "graded"
    assert lost(graded_student) == {item}, (bug, lost(graded_student))
    charged = graded_student.score.item(f"{TARGET}.{item}")
    assert charged.points == 0
    # Every other item its bug made fail is excused, charged to that item.
    for other in graded_student.score.items:
        if other.charged_to is not None:
            assert other.charged_to.key == f"{TARGET}.{item}", (bug, other.item.key)


def test_the_scale_bug_is_told_apart_and_charged_once(graded):
    out, _, students = graded
    assert students["2104"].score.item(f"{TARGET}.head_split").state.value == "excused"
    page = (out / "students" / "2104" / "feedback.md").read_text()
    assert "did you divide by sqrt(hidden_dim) instead of sqrt(head_dim)?" in page


def test_a_syntax_error_is_one_clear_line(graded):
    out, _, students = graded
    student = students[SYNTAX_ERROR]
    assert student.status.value == "syntax error" and student.score.total == 0
    page = (out / "students" / SYNTAX_ERROR / "feedback.md").read_text()
    notes = [line for line in page.splitlines() if line.startswith("> ") and "syntax error" in line]
    assert len(notes) == 1, notes
    assert "attention.py, line 17: expected ':'" in notes[0]
    assert "syntax error: syntax error" not in page  # the status said once


def _student_pages(out: Path) -> dict[str, str]:
    """Every file a student is shown, by path."""
    return {str(path): path.read_text() for path in (out / "students").rglob("*") if path.is_file()}


def test_a_hostile_submission_changes_only_its_own_grade(graded):
    out, _, students = graded
    mallory = students[HOSTILE]
    # It raises on every decode call: kv_cache is all it loses; it is graded like anyone else.
    assert mallory.status.value == "graded" and lost(mallory) == {"kv_cache"}
    # Its error is no shape mismatch: the cache's axis is not suggested.
    assert "does the cache grow" not in (out / "students" / HOSTILE / "feedback.md").read_text()
    # What it printed reaches the teacher only.
    assert FAKE_GRADE in (out / "printed" / f"{HOSTILE}.txt").read_text()
    for path, text in _student_pages(out).items():
        assert FAKE_GRADE not in text, path
    # It wrote nothing outside its folder: not the grades, not the others' files, not home or /tmp.
    assert (out / "grades.csv").read_text() == (EXAMPLE / "expected" / "grades.csv").read_text()
    for folder in (out, EXAMPLE):
        assert not list(folder.rglob(PWNED)), folder
    for place in (Path.home(), Path("/tmp"), Path.cwd(), out.parent):
        assert not (place / PWNED).exists(), place
    others = [path for folder in (out / "staged", EXAMPLE / "submissions")
              for path in folder.rglob("*.py") if HOSTILE not in str(path)]
    assert len(others) >= 20
    for path in others:
        assert "mallory,14" not in path.read_text(), path


def test_a_hostile_error_message_shows_no_more_than_its_start(graded):
    out, _, _ = graded
    try:
        passwd = Path("/etc/passwd").read_text().splitlines()
    except OSError:
        pytest.skip("no /etc/passwd here")
    pages = _student_pages(out)
    mine = {path: text for path, text in pages.items() if f"/{HOSTILE}/" in path}
    assert any("cache corrupted, dump follows" in text for text in mine.values())
    # At most the start of the message: no line of the file past its first, in anyone's pages.
    for path, text in pages.items():
        for line in passwd[1:]:
            assert line not in text, (path, line)
    # The feedback has the failure once per page, not twenty copies of the file.
    assert all(text.count("dump follows") <= 1 for path, text in mine.items()
               if path.endswith("feedback.md")), {p: t.count("dump follows") for p, t in mine.items()}
    assert json.loads((out / "students" / HOSTILE / "results.json").read_text())["score"] == 10


SELF_TEST_MUTANTS = ("mutant-causal-hides-current-token", "mutant-causal-shows-next-token",
                     "mutant-causal-scale-sqrt-d-model", "mutant-causal-softmax-query-axis",
                     "mutant-causal-heads-merged-without-transpose", "mutant-cache-wrong-axis",
                     "mutant-cache-not-updated", "mutant-cache-causal-top-left")
"""A bug for each item of this causal, cached assignment: its mask (two ways), scale, softmax
axis, head merge, cache axis, stale cache and top-left decode."""


def test_the_self_test_exercises_every_item_of_a_causal_cached_rubric():
    """The bundled causal mutants reach every item (the scale's and the softmax axis' too, which
    only non-causal mutants did before), and a mutant whose one bug an earlier item is charged
    for (charge_once) counts as caught, saying where."""
    from conformance.grading import selftest

    chosen = [m for m in selftest.bundled_mutants() if m.name in SELF_TEST_MUTANTS]
    assert len(chosen) == len(SELF_TEST_MUTANTS)
    result = selftest.run(load(EXAMPLE / "rubric.toml"), jobs=2, mutants=chosen)
    rows = {row.mutant.name: row for row in result.rows}
    assert {name: row.verdict for name, row in rows.items()} == \
        dict.fromkeys(SELF_TEST_MUTANTS, selftest.MutantVerdict.CAUGHT)
    assert result.unexercised == []
    hides = rows["mutant-causal-hides-current-token"]
    assert hides.lost == 0 and hides.charged_to is not None
    # One mistake, charged once, by diagnosis: the scale is not charged again to head_split;
    # the heads' merge (its mixed rows make a row see later positions) is charged to head_split,
    # the check named for it, and causal is excused (kv_cache: the mutants have no cache to
    # grade).
    assert rows["mutant-causal-scale-sqrt-d-model"].lost_in == (f"{TARGET}.numerics",
                                                                f"{TARGET}.kv_cache")
    merged = rows["mutant-causal-heads-merged-without-transpose"]
    assert merged.lost_in == (f"{TARGET}.head_split", f"{TARGET}.kv_cache")
    assert f"{TARGET}.causal" in merged.excused_in
