"""Running as a Gradescope autograder: one submission in, ``results.json`` out.

Gradescope puts the student's files in ``/autograder/submission`` and reads
``/autograder/results/results.json`` (its autograder specification); ``docs/gradescope/``
holds a ready ``setup.sh`` and ``run_autograder`` that call
``attention-conformance grade --gradescope --rubric /autograder/source/rubric.toml``. The
submission goes through the same staging, worker and scoring as a class download; the student's
name and id come from ``/autograder/submission_metadata.json`` when it is there.
"""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from conformance.grading.intake.discovery import Submission, SubmissionSource, safe_id
from conformance.grading.intake.staging import stage
from conformance.grading.report import feedback, outputs
from conformance.grading.report.student import Student
from conformance.grading.run.execution import run_submission
from conformance.grading.run.store import Record, versions
from conformance.grading.score.outcome import SubmissionOutcome
from conformance.grading.score.rubric import Rubric
from conformance.grading.score.scoring import score
from conformance.worker import SandboxKind

SUBMISSION = Path("/autograder/submission")
RESULTS = Path("/autograder/results/results.json")


def _who(submission_dir: Path) -> tuple[str, str, str]:
    """(id, name, email) from Gradescope's submission metadata, when there is any."""
    metadata = submission_dir.parent / "submission_metadata.json"
    try:
        data = json.loads(metadata.read_text(encoding="utf-8"))
        user = (data.get("users") or [{}])[0]
        return (safe_id(str(user.get("id") or data.get("id") or "submission")),
                str(user.get("name", "")), str(user.get("email", "")))
    except (OSError, ValueError, AttributeError, IndexError):
        return "submission", "", ""


def autograde(rubric: Rubric, submission_dir: Path = SUBMISSION, results: Path = RESULTS, *,
              run_all_cells: bool = False, as_of: datetime | None = None,
              sandbox: SandboxKind = "filesystem") -> Student:
    """Grade the one submission in ``submission_dir`` (its code in the ``sandbox`` tier); write
    ``results`` (and, beside it, ``feedback.md``/``feedback.html`` for the instructor's
    download)."""
    student_id, name, email = _who(submission_dir)
    submission = Submission(id=student_id, name=name, layout="gradescope",
                            sources=[SubmissionSource(submission_dir, "")])
    with tempfile.TemporaryDirectory(prefix="attention-gradescope-") as scratch:
        staged = stage(submission, Path(scratch) / student_id, run_all_cells=run_all_cells)
        if staged.problem is not None:
            outcome = SubmissionOutcome(staged.problem, staged.message)
        else:
            outcome = run_submission(staged.directory, rubric,
                                     syntax_errors=staged.syntax_errors, sandbox=sandbox)
    record = Record(id=student_id, name=name, layout="gradescope", late=False, repository=None,
                    submission_hash=staged.hash, execution_key=rubric.execution_key(),
                    files=staged.files, notes=staged.notes, outcome=outcome,
                    versions=versions())
    student = Student(id=student_id, name=name, email=email, layout="gradescope", late=False,
                      repository=None, roster_identifier="", record=record,
                      score=score(rubric, outcome))
    outputs.write_json(results, outputs.gradescope_results(rubric, student))
    when = as_of or datetime.now(timezone.utc)
    results.with_name("feedback.md").write_text(feedback.markdown(rubric, student, when),
                                                encoding="utf-8")
    results.with_name("feedback.html").write_text(feedback.html(rubric, student, when),
                                                  encoding="utf-8")
    return student
