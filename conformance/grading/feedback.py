"""Per-student feedback, in Markdown and in HTML, from one document model.

Each rubric item appears with its points; a failed check shows what went wrong (the
result's reason), the likely bug in words (its hint), the numbers seen (its details) and the
smallest failing example hypothesis found (its counterexample), in words a student can act on
(see :mod:`conformance.grading.student_text`: no command-line advice, none of the grader's
paths). Items show only what their
visibility allows at the time of writing: ``visible`` everything; ``after_due_date`` its name,
and the rest once the due date has passed; ``hidden`` and ``after_published`` nothing but a
count. Everything that comes from a submission (messages, names) is escaped; what it printed is
never shown (it is the teacher's: ``printed/ID.txt`` and the class report).
"""

from __future__ import annotations

import html as html_lib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from conformance.checks.catalogue import CATALOGUE, GATE
from conformance.grading.outcome import RunStatus
from conformance.grading.rubric import Rubric
from conformance.grading.scoring import CheckScore, ItemScore, State
from conformance.grading.student_text import for_student, hint_for_student
from conformance.model.results import Status

if TYPE_CHECKING:
    from conformance.grading.student import Student

TITLES = {GATE.name: GATE.title, **{check.name: check.title for check in CATALOGUE}}
"""Each check's property in one line."""


def shown(visibility: str, rubric: Rubric, as_of: datetime) -> str:
    """What a student may see of an item now: ``all``, ``name`` or ``nothing``."""
    if visibility == "visible":
        return "all"
    if visibility == "after_due_date":
        return "all" if rubric.due is not None and as_of >= rubric.due else "name"
    return "nothing"


def points(value: float) -> str:
    return f"{value:g}"


# --------------------------------------------------------------------------------------------
# The document model: a list of blocks, rendered twice.


@dataclass
class Block:
    kind: str  # h1 h2 h3 p meta table list pre note image (text: src, tone: alt)
    # ``tone``: a CSS class (a heading's state, a note's kind, a table's style).
    text: str = ""
    rows: list[list[str]] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    tone: str = ""


def _check_lines(check: CheckScore, files: tuple[str, ...] = ()) -> list[Block]:
    """What a student needs to fix one check: why, the likely bug, the numbers, the example
    (``files``: the student's, as submitted, for the paths in messages)."""
    blocks: list[Block] = []
    result = check.result
    if check.state is State.NOT_EVALUATED:
        blocks.append(Block("p", f"Not evaluated: {for_student(check.why, files).rstrip('.')}."))
        if not check.blocked and result is not None:
            blocks.append(Block("note", "This could not be checked automatically: your teacher "
                                        "will look at it.", tone="hint"))
        return blocks
    hint = None if result is None else hint_for_student(result.hint, files)
    if result is not None and check.state is State.PASSED and result.status is Status.WARNED:
        blocks.append(Block("note", "Passed, with a warning (no points lost): "
                                    + for_student(result.reason, files), tone="hint"))
        if hint:
            blocks.append(Block("note", f"Worth knowing: {hint}", tone="hint"))
        return blocks
    if check.state is State.PASSED or result is None:
        return blocks
    blocks.append(Block("p", f"What went wrong: {for_student(result.reason, files)}"))
    if hint:
        blocks.append(Block("note", f"Likely bug: {hint}", tone="hint"))
    if result.details:
        blocks.append(Block("p", "Numbers seen:"))
        blocks.append(Block("list", items=[for_student(d, files) for d in result.details]))
    if result.counterexample:
        blocks.append(Block("p", "Smallest failing example (found and shrunk by hypothesis):"))
        blocks.append(Block("pre", for_student(result.counterexample, files)))
    return blocks


def item_blocks(score: ItemScore, files: tuple[str, ...] = ()) -> list[Block]:
    """The detail of one item (checks that did not pass), as blocks (``files``: the
    student's, for the paths in messages)."""
    blocks: list[Block] = [Block("p", f"Rule: {score.item.rule}.")]
    for check in score.checks:
        if score.item.is_group:
            blocks.append(Block("p", f"{check.check}: {check.label} — {TITLES.get(check.check, '')}",
                                tone=check.state.value))
        elif check.check in TITLES:
            blocks.append(Block("p", f"Property: {TITLES[check.check]}."))
        blocks += _check_lines(check, files)
    return blocks


def _outcome_line(status: RunStatus, message: str, files: tuple[str, ...] = ()) -> str:
    message = for_student(message, files)
    return status.value + (f": {message}" if message else "")


def document(rubric: Rubric, student: Student, as_of: datetime) -> list[Block]:
    """The feedback for ``student`` as blocks."""
    blocks = [Block("h1", f"Feedback: {rubric.title}")]
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
    blocks.append(Block("meta", rows=meta))
    if student.record is None:
        blocks.append(Block("note", "No submission was found for you.", tone="bad"))
        return blocks
    files = tuple(student.record.files)
    outcome = student.record.outcome
    if outcome.status is not RunStatus.GRADED and not outcome.targets:  # a staging problem
        blocks.append(Block("note", _outcome_line(outcome.status, outcome.message, files),
                            tone="bad"))

    for target_score in student.score.targets:
        target_outcome = target_score.outcome
        where = f" ({target_outcome.location})" if target_outcome and target_outcome.location else ""
        blocks.append(Block("h2", f"{target_score.target.name}{where}"))
        if target_outcome is not None and target_outcome.status is not RunStatus.GRADED:
            blocks.append(Block("note", _outcome_line(target_outcome.status,
                                                      target_outcome.message, files),
                                tone="bad"))
        if target_outcome is not None and target_outcome.interface:
            blocks.append(Block("p", "How your class was called (inferred from its code, or "
                                     "prescribed by the assignment where marked declared):"))
            blocks.append(Block("list", items=[for_student(line, files)
                                               for line in target_outcome.interface]))
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
            blocks.append(Block("table", rows=[["Item", "Result", "Points"], *rows],
                                classes=classes, tone="items"))
        for item in details:
            blocks.append(Block("h3", f"{item.item.label}: {item.state.value} "
                                      f"({points(item.points)} / {points(item.max_points)})",
                                tone=item.state.value))
            blocks += item_blocks(item, files)
    omitted = [i for i in items if shown(i.item.visibility, rubric, as_of) == "nothing"]
    if omitted:
        blocks.append(Block("p", f"{len(omitted)} further item(s) are graded but not shown "
                                 "here."))
    if student.record.notes:
        blocks.append(Block("h2", "Notes on your files"))
        blocks.append(Block("list", items=[for_student(note, files)
                                           for note in student.record.notes]))
    # What the code printed is the teacher's only (printed/ID.txt, the class report): a
    # submission could print what it read on the grading machine.
    return blocks


# --------------------------------------------------------------------------------------------
# Markdown.

_MD_SPECIAL = re.compile(r"([\\`*<>\[\]])")


def md_escape(text: str) -> str:
    """Text safe in Markdown: no emphasis, code, links or HTML from a submission's messages.
    Underscores inside words (``d_model``) are left: they never start emphasis."""
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", text)


def _md_cell(text: str) -> str:
    return md_escape(text).replace("|", "\\|").replace("\n", " ")


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip()}\n{fence}"


def render_markdown(blocks: list[Block]) -> str:
    out: list[str] = []
    for block in blocks:
        if block.kind in ("h1", "h2", "h3"):
            out.append("#" * int(block.kind[1]) + " " + md_escape(block.text))
        elif block.kind == "p":
            out.append(md_escape(block.text))
        elif block.kind == "note":
            out.append("> " + md_escape(block.text).replace("\n", "\n> "))
        elif block.kind == "meta":
            out.append("\n".join(f"- **{md_escape(k)}:** {md_escape(v)}" for k, v in block.rows))
        elif block.kind == "list":
            out.append("\n".join(f"- {md_escape(item)}" for item in block.items))
        elif block.kind == "pre":
            out.append(_fence(block.text))
        elif block.kind == "image":
            out.append(f"![{md_escape(block.tone)}]({block.text})")
        elif block.kind == "table":
            header, *rows = block.rows
            lines = ["| " + " | ".join(_md_cell(c) for c in header) + " |",
                     "|" + "|".join(" --- " for _ in header) + "|"]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            out.append("\n".join(lines))
    return "\n\n".join(out) + "\n"


def markdown(rubric: Rubric, student: Student, as_of: datetime) -> str:
    """The student's feedback as Markdown."""
    return render_markdown(document(rubric, student, as_of))


def item_markdown(score: ItemScore, files: tuple[str, ...] = ()) -> str:
    """One item's detail as Markdown (Gradescope test output: it applies visibility itself;
    ``files``: the student's, for the paths in messages)."""
    head = (f"**{score.state.value}**: {points(score.points)} / {points(score.max_points)} "
            "point(s)")
    return head + "\n\n" + render_markdown(item_blocks(score, files))


# --------------------------------------------------------------------------------------------
# HTML: one self-contained page, no script, no external resource.

_CSS = """
body { font: 15px/1.5 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       color: #1f2328; max-width: 860px; margin: 2em auto; padding: 0 1.2em; }
h1 { font-size: 1.6em; border-bottom: 1px solid #d0d7de; padding-bottom: .3em; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #eaeef2; padding-bottom: .2em; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
h3.failed, h3.not-evaluated { color: #a40e26; } h3.partial { color: #9a6700; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
dl.meta dt { font-weight: 600; color: #57606a; } dl.meta dd { margin: 0; }
table { border-collapse: collapse; width: 100%; margin: .8em 0; }
th, td { border: 1px solid #d0d7de; padding: .35em .7em; text-align: left; }
th { background: #f6f8fa; }
table.items { table-layout: fixed; }
table.items th:nth-child(1) { width: 58%; } table.items th:nth-child(2) { width: 27%; }
table.items td:last-child, table.items th:last-child { text-align: right; white-space: nowrap; }
tr.passed td:nth-child(2) { color: #1a7f37; font-weight: 600; }
tr.failed td:nth-child(2) { color: #cf222e; font-weight: 600; }
tr.partial td:nth-child(2) { color: #9a6700; font-weight: 600; }
tr.not-evaluated td:nth-child(2), tr.pending td:nth-child(2) { color: #57606a; font-style: italic; }
p.passed { color: #1a7f37; } p.failed { color: #cf222e; } p.not-evaluated { color: #57606a; }
.note { border-left: 4px solid #d0d7de; background: #f6f8fa; padding: .5em .9em; margin: .8em 0; }
.note.bad { border-color: #cf222e; background: #fff1f0; }
.note.hint { border-color: #bf8700; background: #fff8c5; }
pre { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: .7em;
      overflow-x: auto; white-space: pre-wrap; word-break: break-word; font-size: 13px; }
ul { padding-left: 1.4em; } li { margin: .15em 0; }
""".strip()


def render_html(blocks: list[Block], title: str) -> str:
    e = html_lib.escape
    body: list[str] = []
    for block in blocks:
        tone = f' class="{e(block.tone.replace(" ", "-"))}"' if block.tone else ""
        if block.kind in ("h1", "h2", "h3"):
            body.append(f"<{block.kind}{tone}>{e(block.text)}</{block.kind}>")
        elif block.kind == "p":
            body.append(f"<p{tone}>{e(block.text)}</p>")
        elif block.kind == "note":
            body.append(f'<div class="note {e(block.tone)}">{e(block.text)}</div>')
        elif block.kind == "meta":
            body.append('<dl class="meta">' + "".join(
                f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in block.rows) + "</dl>")
        elif block.kind == "list":
            body.append("<ul>" + "".join(f"<li>{e(i)}</li>" for i in block.items) + "</ul>")
        elif block.kind == "pre":
            body.append(f"<pre>{e(block.text)}</pre>")
        elif block.kind == "image":
            body.append(f'<p><img src="{e(block.text)}" alt="{e(block.tone)}" '
                        'style="max-width:100%"></p>')
        elif block.kind == "table":
            header, *rows = block.rows
            css = f' class="{e(block.tone)}"' if block.tone else ""
            lines = [f"<table{css}><thead><tr>" + "".join(f"<th>{e(c)}</th>" for c in header)
                     + "</tr></thead><tbody>"]
            for row, css in zip(rows, block.classes or [""] * len(rows), strict=True):
                lines.append(f'<tr class="{e(css)}">' + "".join(f"<td>{e(c)}</td>" for c in row)
                             + "</tr>")
            lines.append("</tbody></table>")
            body.append("".join(lines))
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{e(title)}</title>\n<style>\n{_CSS}\n</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


def html(rubric: Rubric, student: Student, as_of: datetime) -> str:
    """The student's feedback as a self-contained HTML page."""
    return render_html(document(rubric, student, as_of),
                       f"Feedback: {rubric.title} ({student.id})")
