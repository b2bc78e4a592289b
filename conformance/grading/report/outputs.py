"""The grade books: ``grades.csv``, a GitHub-Classroom-style CSV, Gradescope ``results.json``.

``grades.csv``: one row per student (sorted by id): ``id``, ``name`` (the roster's, else what the
LMS naming carries), ``email`` (with a roster that has them), ``late``, one column per rubric
item (``Target.check`` or ``Target.group``), ``total``, ``percent``, ``status``,
``not_evaluated`` (the items that could not be evaluated through no failure of the student's,
with status ``partly evaluated``: never a silent zero), ``provisional_total``,
``submission_hash``. A partly evaluated row has no final total: its ``total``, ``percent`` and
the items not evaluated are empty, and ``provisional_total`` holds the points of the items that
were (a person decides the rest). The first row under
the header is ``Points Possible`` (as in a Canvas grade export). Nothing in it depends on time
or on the order of grading.

``classroom.csv``: GitHub Classroom's grade-export columns (``assignment_name``,
``github_username``, ``roster_identifier``, ``student_repository_name``, ``points_awarded``,
``points_available``, ...), blank where a download doesn't say.

``results.json``: the Gradescope autograder format (``score``, ``tests[]`` with ``name``,
``number``, ``score``, ``max_score``, ``status``, ``output``, ``output_format``, ``visibility``,
``tags``). Gradescope applies each test's visibility itself, so every test carries its full
output, in words a student can act on (see :mod:`conformance.grading.report.student_text`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.grading.report import feedback
from conformance.grading.report.course_words import Wording
from conformance.grading.report.document import md_escape
from conformance.grading.report.student_text import for_student
from conformance.grading.run.store import versions
from conformance.grading.score.outcome import PROVISIONAL, WITHHELD, RunStatus, status_line
from conformance.grading.score.rubric import Rubric
from conformance.grading.score.scoring import State

if TYPE_CHECKING:
    from conformance.grading.report.student import Student

CLASSROOM_COLUMNS = ("assignment_name", "assignment_url", "starter_code_url", "github_username",
                     "roster_identifier", "student_repository_name", "student_repository_url",
                     "submission_timestamp", "points_awarded", "points_available")


def number(value: float) -> str:
    return f"{value:g}"


def grades_rows(rubric: Rubric, students: list[Student], *, with_email: bool) -> list[list[str]]:
    """``grades.csv`` as rows, header and points-possible row first."""
    keys = [item.key for item in rubric.items]
    header = ["id", "name", *(["email"] if with_email else []), "late", *keys, "total",
              "percent", "status", "not_evaluated", "provisional_total", "submission_hash"]
    possible = ["Points Possible", "", *([""] if with_email else []), "",
                *(number(item.max_points) for item in rubric.items),
                number(rubric.max_points), "100", "", "", "", ""]
    rows = [header, possible]
    for student in students:
        unevaluated = dict.fromkeys(key for key, _ in student.score.unevaluated)
        # Withheld (the grader's or its environment's doing): no grade, never a 0. Provisional
        # (an item a person decides): no final total, the points so far beside it.
        withheld = student.status in WITHHELD
        provisional = student.status in PROVISIONAL
        final = not (withheld or provisional)
        rows.append([student.id, student.name, *([student.email] if with_email else []),
                     "yes" if student.late else "",
                     *("" if withheld or key in unevaluated
                       else number(student.score.item(key).points) for key in keys),
                     number(student.score.total) if final else "",
                     f"{student.score.percent:.1f}" if final else "",
                     student.status.value, " ".join(unevaluated),
                     number(student.score.total) if provisional else "",
                     student.submission_hash])
    return rows


def _write_csv(path: Path, rows: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)


def write_grades_csv(path: Path, rubric: Rubric, students: list[Student], *,
                     with_email: bool = False) -> None:
    _write_csv(path, grades_rows(rubric, students, with_email=with_email))


def write_classroom_csv(path: Path, rubric: Rubric, students: list[Student]) -> None:
    rows = [list(CLASSROOM_COLUMNS)]
    for student in students:
        github = student.id if student.layout == "github-classroom" else ""
        rows.append([rubric.name, "", "", github, student.roster_identifier or student.id,
                     student.repository or "", "", "",
                     "" if student.status in WITHHELD | PROVISIONAL
                     else number(student.score.total),
                     number(student.score.max_points)])
    _write_csv(path, rows)


def write_printed(folder: Path, students: list[Student]) -> None:
    """``printed/ID.txt``: what each submission printed (its beginning and end), for the
    teacher only; students never see it (a submission could print what it read on the grading
    machine). Files of an earlier run for students who print nothing now are removed."""
    if folder.is_dir():
        for stale in folder.glob("*.txt"):
            stale.unlink()
    for student in students:
        outcome = student.outcome
        if outcome is not None and outcome.output.strip():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{student.id}.txt").write_text(
                f"# {student.id}: {outcome.printed_bytes} bytes printed while grading (its "
                "beginning and end are kept); for the teacher only\n" + outcome.output,
                encoding="utf-8")


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _target_test(target_score, index: int, files: tuple[str, ...] = ()) -> dict:
    outcome = target_score.outcome
    name = target_score.target.name
    if outcome is None:
        return {"name": f"{name}: found and loaded", "number": f"{index}.0", "status": "failed",
                "output": "The submission was not run.", "visibility": "visible"}
    message = for_student(outcome.message, files)
    lines = [status_line(outcome.status, message)]
    if outcome.near_misses:
        lines.append("Close names in your code: " + ", ".join(outcome.near_misses))
    if outcome.called:
        lines.append("How your class was built and called:\n" + "\n".join(
            f"- {md_escape(for_student(n, files))}" for n in outcome.called))
    return {"name": f"{name}: found and loaded", "number": f"{index}.0",
            "status": "passed" if outcome.status is RunStatus.GRADED else "failed",
            "output": md_escape(lines[0]) + "\n\n" + "\n\n".join(lines[1:]),
            "output_format": "md", "visibility": "visible"}


def gradescope_results(rubric: Rubric, student: Student) -> dict:
    """``student``'s result in Gradescope's ``results.json`` format."""
    tests = []
    files = tuple(student.record.files) if student.record is not None else ()
    for index, target_score in enumerate(student.score.targets, 1):
        tests.append(_target_test(target_score, index, files))
        for position, item in enumerate(target_score.items, 1):
            tests.append({
                "name": f"{target_score.target.name}: {item.item.label}",
                "number": f"{index}.{position}",
                "score": item.points,
                "max_score": item.max_points,
                "status": ("passed" if item.state in (State.PASSED, State.EXCUSED)
                           else "failed"),
                "output": feedback.item_markdown(item, Wording.of(target_score, files)),
                "output_format": "md",
                "visibility": item.item.visibility,
                "tags": list(item.item.checks),
                "extra_data": {"state": item.state.value, "key": item.item.key},
            })
    outcome = student.outcome
    summary = (f"{number(student.score.total)} / {number(student.score.max_points)} points; "
               f"status: {student.status.value}")
    if outcome is not None and outcome.message:
        summary += f" ({for_student(outcome.message, files)})"
    payload = {
        "score": student.score.total,
        "output": md_escape(summary),
        "output_format": "md",
        "test_output_format": "md",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {"id": student.id, "status": student.status.value,
                       "submission_hash": student.submission_hash,
                       "rubric_hash": rubric.rubric_hash(),
                       "execution_key": rubric.execution_key(),
                       "isolation": outcome.isolation if outcome else "",
                       "sandbox": outcome.sandbox if outcome else "",
                       "versions": student.record.versions if student.record else versions()},
    }
    if outcome is not None:
        payload["execution_time"] = round(outcome.seconds)
    return payload


def run_summary(rubric: Rubric, students: list[Student]) -> dict:
    """``run.json``: what produced these outputs, and the class in numbers. ``sandbox``: the
    filesystem sandboxes student code ran in (``none``: not sandboxed, ``grade --no-sandbox``);
    ``sandboxed``: whether all of it ran in one."""
    statuses: dict[str, int] = {}
    for student in students:
        statuses[student.status.value] = statuses.get(student.status.value, 0) + 1
    sandboxes = sorted({s.outcome.sandbox for s in students if s.outcome and s.outcome.sandbox})
    return {"tool": "attention-conformance grade", "versions": versions(),
            "rubric": str(rubric.path), "rubric_hash": rubric.rubric_hash(),
            "execution_key": rubric.execution_key(), "profile": rubric.profile,
            "seed": rubric.seed, "limits": rubric.limits.to_dict(),
            "students": len(students), "statuses": dict(sorted(statuses.items())),
            "max_points": rubric.max_points,
            "isolation": sorted({s.outcome.isolation for s in students
                                 if s.outcome and s.outcome.isolation}),
            "sandbox": sandboxes, "sandboxed": "none" not in sandboxes}
