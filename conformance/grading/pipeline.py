"""Grading a class: discover, stage, run what is not done yet, score, write every output.

Everything after running is a function of the stored per-student results and the rubric, so
the outputs are the same whatever ``jobs`` is, in whatever order students finish, and whether
a result was computed now or reused from an interrupted run.
"""

from __future__ import annotations

import shutil
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from conformance.errors import ConformanceError
from conformance.generation.strategies import available_devices
from conformance.grading import shards
from conformance.grading.intake.archives import ArchiveError, extract_zip
from conformance.grading.intake.discovery import Submission, discover
from conformance.grading.intake.roster import Roster
from conformance.grading.intake.staging import Staged, stage
from conformance.grading.progress import GradingProgress
from conformance.grading.report import class_report, feedback, outputs
from conformance.grading.report.student import Student
from conformance.grading.run.execution import run_submission
from conformance.grading.run.parsing import one_parse_at_a_time
from conformance.grading.run.store import Record, Store, versions
from conformance.grading.score.outcome import RunStatus, SubmissionOutcome
from conformance.grading.score.rubric import Rubric, RubricError
from conformance.grading.score.scoring import SubmissionScore, score
from conformance.worker import SandboxKind
from conformance.worker.sandbox import resolve_kind


class GradingInputError(ConformanceError):
    """Input that can't be graded (missing or empty folder, unknown --only id); one line."""


@dataclass
class ClassResult:
    rubric: Rubric
    students: list[Student]
    graded: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """Submissions neither graded now (not in --only) nor stored from before."""


def find_submissions(folder: Path, rubric: Rubric, out: Path) -> list[Submission]:
    """The submissions in ``folder`` (or in a downloaded ``.zip`` of them, extracted under
    ``out``); GradingInputError when there are none."""
    if not folder.exists():
        raise GradingInputError(f"no such folder: {folder}")
    if folder.is_file() and folder.suffix.lower() == ".zip":
        extracted = out / "download"
        shutil.rmtree(extracted, ignore_errors=True)
        try:
            extract_zip(folder, extracted)
        except ArchiveError as error:
            raise GradingInputError(f"{folder}: {error}") from None
        folder = extracted
    if not folder.is_dir():
        raise GradingInputError(f"{folder} is not a folder (nor a .zip of submissions)")
    submissions = discover(folder, github_classroom_prefix=rubric.github_classroom_prefix,
                           exclude=(out,))
    if not submissions:
        raise GradingInputError(f"no submissions in {folder}: expected Canvas files "
                                "(name_userid_submissionid_file), Moodle folders, GitHub "
                                "Classroom repositories, or .py/.ipynb/.zip files or folders")
    return submissions


def check_only(submissions: list[Submission], only: set[str] | None) -> None:
    """GradingInputError when ``only`` names an id that no submission has."""
    ids = {s.id for s in submissions}
    unknown = sorted((only or set()) - ids)
    if unknown:
        raise GradingInputError(f"--only: no submission with id {', '.join(unknown)} "
                                f"(found: {', '.join(sorted(ids))})")


def _run_one(staged: Staged, rubric: Rubric, sandbox: SandboxKind) -> SubmissionOutcome:
    """One submission's outcome; anything going wrong here is that student's row, never the
    run's."""
    if staged.problem is not None:
        return SubmissionOutcome(staged.problem, staged.message)
    try:
        return run_submission(staged.directory, rubric, syntax_errors=staged.syntax_errors,
                              sandbox=sandbox)
    except Exception as error:
        last = traceback.format_exception_only(type(error), error)[-1].strip()
        return SubmissionOutcome(RunStatus.GRADER_ERROR,
                                 f"the grader failed on this submission: {last}")


def grade_class(folder: Path, rubric: Rubric, out: Path, *, jobs: int = 1,
                only: set[str] | None = None, roster: Roster | None = None,
                run_all_cells: bool = False, progress: GradingProgress | None = None,
                as_of: datetime | None = None, shard: shards.Shard | None = None,
                sandbox: SandboxKind = "filesystem",
                found: list[Submission] | None = None) -> ClassResult:
    """Grade every submission in ``folder`` into ``out`` and write the outputs.

    Submissions already graded (same files, same execution-relevant rubric, same versions)
    are reused; ``only`` regrades just those ids (forcing them) and reuses the rest. With
    ``shard``, only that part of the class is staged, graded and written
    (:mod:`conformance.grading.shards`), and ``run.json`` says which part it is. Student code
    runs in the ``sandbox`` tier (by default a filesystem sandbox:
    :class:`~conformance.worker.SandboxUnavailable` before anything is done where there is none).
    ``found``: the submissions :func:`find_submissions` already found in ``folder`` (a download's
    zip is then not extracted a second time).
    """
    tier = resolve_kind(sandbox)  # one tier for the whole class
    if rubric.device not in available_devices():
        raise RubricError(f"{rubric.path}: [assignment] device \"cuda\": this machine has no CUDA "
                          "GPU torch can use; grade on a machine with one, or on \"cpu\"")
    out.mkdir(parents=True, exist_ok=True)
    submissions = found if found is not None else find_submissions(folder, rubric, out)
    check_only(submissions, only)
    everyone = submissions
    if shard is not None:
        submissions = shards.part(submissions, shard)
    store = Store(out / "results")
    key = rubric.execution_key()
    staged: dict[str, Staged] = {}
    for submission in submissions:
        staged[submission.id] = stage(submission, out / "staged" / submission.id,
                                      run_all_cells=run_all_cells)
    result = ClassResult(rubric, [])
    todo: list[Submission] = []
    records: dict[str, Record] = {}
    for submission in submissions:
        stored = store.current(submission.id, staged[submission.id].hash, key)
        forced = only is not None and submission.id in only
        if stored is not None and not forced:
            records[submission.id] = stored
            result.reused.append(submission.id)
        elif only is not None and not forced:
            result.left_out.append(submission.id)
        else:
            todo.append(submission)

    progress = progress or GradingProgress(len(todo))
    progress.total = len(todo)
    by_id = {s.id: s for s in submissions}
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    # The threads share CPython's parser: one parse at a time (see the module).
    with one_parse_at_a_time():
        try:
            futures = {pool.submit(_run_one, staged[s.id], rubric, tier): s.id for s in todo}
            for future in as_completed(futures):
                student = futures[future]
                submission = by_id[student]
                record = Record(id=student, name=submission.name, layout=submission.layout,
                                late=submission.late, repository=submission.repository,
                                submission_hash=staged[student].hash, execution_key=key,
                                files=staged[student].files, notes=staged[student].notes,
                                outcome=future.result(), versions=versions())
                store.save(record)  # at once: an interrupted run keeps what is done
                records[student] = record
                result.graded.append(student)
                progress.advance(_finished(student, score(rubric, record.outcome)))
        finally:
            # Interrupted (Ctrl-C, the worker missing): nothing new starts; running ones finish.
            pool.shutdown(wait=True, cancel_futures=True)
            progress.close()

    listed = roster if shard is None else shards.roster_part(roster, everyone, shard)
    result.students = assemble(rubric, [s for s in submissions if s.id in records], records,
                               listed)
    write_outputs(out, rubric, result.students, roster=roster, as_of=as_of)
    if shard is not None:
        shards.stamp(out / "run.json", shard, everyone,
                     {i: r.submission_hash for i, r in records.items()}, result.left_out)
    result.graded.sort()
    return result


def _finished(student: str, scored: SubmissionScore) -> str:
    """How a student's grading ended, for the progress line: the status, and the points."""
    return (f"{student}: {scored.status.value} "
            f"{scored.total:g}/{scored.max_points:g}")


def assemble(rubric: Rubric, submissions: list[Submission], records: dict[str, Record],
             roster: Roster | None) -> list[Student]:
    """Grade-book rows: every graded submission, then rostered students who did not submit;
    sorted by id."""
    students: list[Student] = []
    matched: set[int] = set()
    for submission in submissions:
        record = records[submission.id]
        person = roster.find(submission.id) if roster else None
        if person is not None:
            matched.add(id(person))
        students.append(Student(
            id=submission.id, name=person.name if person and person.name else submission.name,
            email=person.email if person else "", layout=submission.layout,
            late=submission.late, repository=submission.repository,
            roster_identifier=(person.identifier or person.ids[0]) if person else "",
            record=record, score=score(rubric, record.outcome)))
    for person in roster.people if roster else []:
        if id(person) in matched:
            continue
        missing = SubmissionOutcome(RunStatus.NO_SUBMISSION, "no submission found")
        students.append(Student(id=person.ids[0], name=person.name, email=person.email,
                                layout="", late=False, repository=None,
                                roster_identifier=person.identifier or person.ids[0],
                                record=None, score=score(rubric, missing)))
    return sorted(students, key=lambda s: s.id)


def write_outputs(out: Path, rubric: Rubric, students: list[Student], *,
                  roster: Roster | None = None, as_of: datetime | None = None) -> None:
    """Every output file, from the students' rows alone."""
    as_of = as_of or datetime.now(timezone.utc)
    outputs.write_grades_csv(out / "grades.csv", rubric, students,
                             with_email=bool(roster and roster.has_email))
    outputs.write_classroom_csv(out / "classroom.csv", rubric, students)
    for student in students:
        folder = out / "students" / student.id
        folder.mkdir(parents=True, exist_ok=True)
        outputs.write_json(folder / "results.json", outputs.gradescope_results(rubric, student))
        (folder / "feedback.md").write_text(feedback.markdown(rubric, student, as_of),
                                            encoding="utf-8")
        (folder / "feedback.html").write_text(feedback.html(rubric, student, as_of),
                                              encoding="utf-8")
    class_report.write(out, rubric, students)
    outputs.write_printed(out / "printed", students)
    outputs.write_json(out / "run.json", outputs.run_summary(rubric, students))
