"""Per-student feedback, in Markdown and in HTML, from one document model.

Each rubric item appears with its points; a failed check shows what went wrong (the
result's reason), the likely bug in words (its hint), the numbers seen (its details) and the
smallest failing example hypothesis found (its counterexample), in words a student can act on
(see :mod:`conformance.grading.report.student_text`: no command-line advice, none of the grader's
paths). Items show only what their
visibility allows at the time of writing: ``visible`` everything; ``after_due_date`` its name,
and the rest once the due date has passed; ``hidden`` and ``after_published`` nothing but a
count. Everything that comes from a submission (messages, names) is escaped; what it printed is
never shown (it is the teacher's: ``printed/ID.txt`` and the class report).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from conformance.checks.catalogue import CATALOGUE, GATE
from conformance.grading.report.course_words import Wording
from conformance.grading.report.document import (
    Block,
    Bullets,
    Facts,
    Heading,
    Paragraph,
    Preformatted,
    ReportNote,
    Table,
    Tone,
    render_html,
    render_markdown,
)
from conformance.grading.report.student_text import for_student
from conformance.grading.score.outcome import RunStatus, status_line
from conformance.grading.score.rubric import Item, Rubric
from conformance.grading.score.scoring import CheckScore, ItemScore, State
from conformance.model.results import Status

if TYPE_CHECKING:
    from conformance.grading.report.student import Student

TITLES = {GATE.name: GATE.title, **{check.name: check.title for check in CATALOGUE}}
"""Each check's property in one line."""

PLAIN = Wording()
"""The wording of an item shown with no class around it: no files, no mask, no labels."""


def shown(visibility: str, rubric: Rubric, as_of: datetime) -> str:
    """What a student may see of an item now: ``all``, ``name`` or ``nothing``."""
    if visibility == "visible":
        return "all"
    if visibility == "after_due_date":
        return "all" if rubric.due is not None and as_of >= rubric.due else "name"
    return "nothing"


def points(value: float) -> str:
    return f"{value:g}"


def _check_lines(check: CheckScore, words: Wording) -> list[Block]:
    """What a student needs to fix one check: why, the likely bug, the numbers, the example,
    in the course's ``words``."""
    blocks: list[Block] = []
    result = check.result
    if check.state is State.NOT_EVALUATED:
        blocks.append(Paragraph(f"Not evaluated: {words.say(check.why).rstrip('.')}."))
        if not check.blocked and result is not None:
            blocks.append(ReportNote("This could not be checked automatically: your teacher will "
                                     "look at it."))
        return blocks
    hint = None if result is None or not result.hint else words.say(result.hint) or None
    if result is not None and check.state is State.PASSED and result.status is Status.WARNED:
        blocks.append(ReportNote("Passed, with a warning (no points lost): "
                                 + words.say(result.reason)))
        if hint:
            blocks.append(ReportNote(f"Worth knowing: {hint}"))
        return blocks
    if check.state is State.PASSED or result is None:
        return blocks
    blocks.append(Paragraph(f"What went wrong: {words.say(result.reason)}"))
    if hint:
        blocks.append(ReportNote(f"Likely bug: {hint}"))
    if result.details:
        blocks.append(Paragraph("Numbers seen:"))
        blocks.append(Bullets([words.say(d) for d in result.details]))
    if result.counterexample:
        blocks.append(Paragraph("The smallest input found that shows it:"))
        blocks.append(Preformatted(words.example(result.counterexample)))
    return blocks


def rule(item: Item) -> str:
    """How ``item`` scores, in the words of its feedback (the properties are listed under it)."""
    if not item.is_group:
        return f"{points(item.points)} point(s) when the property below holds"
    if item.points_each is None:
        return f"{points(item.points)} point(s) when every property below holds"
    capped = f", at most {points(item.cap)}" if item.cap is not None else ""
    return f"{points(item.points_each)} point(s) for each property below that holds{capped}"


def item_blocks(score: ItemScore, words: Wording = PLAIN) -> list[Block]:
    """The detail of one item (checks that did not pass), as blocks, in the course's
    ``words``."""
    blocks: list[Block] = [Paragraph(f"Rule: {rule(score.item)}.")]
    if score.charged_to is not None:
        blocks.append(ReportNote(f"Not charged again: this is the same mistake as "
                                 f"\"{score.charged_to.label}\", where its points were taken; fixing "
                                 "it there fixes it here too."))
    for check in score.checks:
        if score.item.is_group:
            blocks.append(Paragraph(f"{TITLES.get(check.check, check.check)}: {check.label}",
                                    tone=Tone(check.state.value)))
        elif check.check in TITLES:
            blocks.append(Paragraph(f"Property: {TITLES[check.check]}."))
        blocks += _check_lines(check, words)
    return blocks


def _outcome_line(status: RunStatus, message: str, files: tuple[str, ...] = ()) -> str:
    return status_line(status, for_student(message, files))


def document(rubric: Rubric, student: Student, as_of: datetime) -> list[Block]:
    """The feedback for ``student`` as blocks."""
    blocks = [Heading(1, f"Feedback: {rubric.title}")]
    who = student.name or student.id
    meta = [["Student", f"{who} ({student.id})" if student.name else who]]
    if student.record is not None:
        meta.append(["Files graded", ", ".join(student.record.files) or "none"])
    if student.late:
        meta.append(["Submitted", "late"])
    meta.append(["Status", student.status.value])
    items = student.score.items
    hidden = [i for i in items if shown(i.item.visibility, rubric, as_of) != "all"]
    visible_total = sum(i.points for i in items if i not in hidden)
    visible_max = sum(i.max_points for i in items if i not in hidden)
    if any(i.max_points for i in hidden):
        meta.append(["Score", f"{points(visible_total)} / {points(visible_max)} on the items "
                              f"shown here; {len(hidden)} more item(s) worth "
                              f"{points(sum(i.max_points for i in hidden))} point(s) are not "
                              "shown here"])
    else:
        meta.append(["Score", f"{points(student.score.total)} / "
                              f"{points(student.score.max_points)} ({student.score.percent:g}%)"])
    blocks.append(Facts(meta))
    if student.record is None:
        blocks.append(ReportNote("No submission was found for you.", tone=Tone.BAD))
        return blocks
    files = tuple(student.record.files)
    outcome = student.record.outcome
    if outcome.status is not RunStatus.GRADED and not outcome.targets:  # a staging problem
        blocks.append(ReportNote(_outcome_line(outcome.status, outcome.message, files),
                                  tone=Tone.BAD))

    for target_score in student.score.targets:
        target_outcome = target_score.outcome
        where = f" ({target_outcome.location})" if target_outcome and target_outcome.location else ""
        blocks.append(Heading(2, f"{target_score.target.name}{where}"))
        if target_outcome is not None and target_outcome.status is not RunStatus.GRADED:
            blocks.append(ReportNote(_outcome_line(target_outcome.status,
                                                            target_outcome.message, files),
                                      tone=Tone.BAD))
        if target_outcome is not None and target_outcome.called:
            blocks.append(Paragraph("How your class was built and called (as the assignment "
                                     "prescribes where marked declared, else as its code "
                                     "reads):"))
            blocks.append(Bullets([for_student(line, files) for line in target_outcome.called]))
        rows, classes, details = [], [], []
        for item in target_score.items:
            visibility = shown(item.item.visibility, rubric, as_of)
            if visibility == "nothing":
                continue
            if visibility == "name":
                due = rubric.due.strftime("%Y-%m-%d %H:%M UTC") if rubric.due else "the due date"
                rows.append([item.item.label, f"shown after {due}", "–"])
                classes.append("pending")
                continue
            rows.append([item.item.label, item.state.value,
                         f"{points(item.points)} / {points(item.max_points)}"])
            classes.append(item.state.value.replace(" ", "-"))
            graded = target_outcome is not None and target_outcome.status is RunStatus.GRADED
            # A target that never ran says why once, above; its items have nothing to add.
            warned = any(c.result is not None and c.result.status is Status.WARNED
                         for c in item.checks)
            if (item.state is not State.PASSED or warned) and (
                    graded or item.state is not State.NOT_EVALUATED):
                details.append(item)
        if rows:
            blocks.append(Table([["Item", "Result", "Points"], *rows],
                                row_tones=classes, items=True))
        for item in details:
            blocks.append(Heading(3, f"{item.item.label}: {item.state.value} "
                                      f"({points(item.points)} / {points(item.max_points)})",
                                tone=Tone(item.state.value)))
            blocks += item_blocks(item, Wording.of(target_score, files))
    omitted = [i for i in items if shown(i.item.visibility, rubric, as_of) == "nothing"]
    if omitted:
        blocks.append(Paragraph(f"{len(omitted)} further item(s) are graded but not shown "
                                 "here."))
    if student.record.notes:
        blocks.append(Heading(2, "Notes on your files"))
        blocks.append(Bullets([for_student(note, files)
                                           for note in student.record.notes]))
    # What the code printed is the teacher's only (printed/ID.txt, the class report): a
    # submission could print what it read on the grading machine.
    return blocks


def markdown(rubric: Rubric, student: Student, as_of: datetime) -> str:
    """The student's feedback as Markdown."""
    return render_markdown(document(rubric, student, as_of))


def item_markdown(score: ItemScore, words: Wording = PLAIN) -> str:
    """One item's detail as Markdown (Gradescope test output: it applies visibility itself),
    in the course's ``words``."""
    head = (f"**{score.state.value}**: {points(score.points)} / {points(score.max_points)} "
            "point(s)")
    return head + "\n\n" + render_markdown(item_blocks(score, words))


def html(rubric: Rubric, student: Student, as_of: datetime) -> str:
    """The student's feedback as a self-contained HTML page."""
    return render_html(document(rubric, student, as_of),
                       f"Feedback: {rubric.title} ({student.id})")
