"""The class report: how the class did, what went wrong most often, who needs a human look.

Writes ``class_report.md`` and ``class_report.html`` (same content) and ``class_report.png``: a
histogram of the scores and, per rubric item, the share of submissions that passed, failed or
could not be evaluated (matplotlib, Agg canvas, no pyplot state; skipped with a note when
matplotlib is not installed: ``pip install -e .[plot]``).

"Likely bugs" counts each student's mistake once: the failed checks that name the same likely
bug (numbers masked, so "sqrt(6)" and "sqrt(8)" count as one) are one row with the checks it
failed in, a student's unnamed failures beside exactly one named bug are its knock-ons, and
failures that name no bug are symptoms, grouped by their reason with its numbers masked.
"Needs a human look": crashes, timeouts, running out of memory, import errors, interface
mismatches, unreadable files, grader errors, a failed gate, a class found only through an
import, classes not found where a near-miss name exists, and items that could not be evaluated
(``partly evaluated``), with the reason.

"Printed output" (the teacher's only: students never see it) lists who printed how much; its
beginning and end are in ``printed/ID.txt``.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from conformance.grading.report.document import (
    Block,
    Facts,
    Heading,
    Image,
    Paragraph,
    Table,
    render_html,
    render_markdown,
)
from conformance.grading.score.outcome import NEEDS_A_LOOK, RunStatus, status_line
from conformance.grading.score.rubric import Rubric
from conformance.grading.score.scoring import State, bug_of, same_bug
from conformance.model.check_names import CHECK_NAMES
from conformance.model.results import Status

if TYPE_CHECKING:
    from conformance.grading.report.student import Student


@dataclass(frozen=True)
class Bug:
    """One mistake, and the students who made it: ``named`` where the suite named a likely bug
    (``text``: its most common wording), else a symptom (``text``: the failure's reason, numbers
    masked); ``checks``: every check it failed in."""

    checks: tuple[str, ...]
    text: str
    students: tuple[str, ...]
    named: bool = True

    @property
    def check(self) -> str:
        """The first check it failed in (catalogue order)."""
        return self.checks[0]


def likely_bugs(students: list[Student]) -> list[Bug]:
    """The class's mistakes, most students first, each counted once per student.

    A student's failed checks that name the same likely bug (its kind, whichever check named it;
    a hint of no known kind by its words, numbers masked: "sqrt(6)" and "sqrt(8)" are one) are
    one mistake, as grading charges it once (:func:`~conformance.grading.score.scoring.bug_of`);
    where a student has exactly one named bug, their failures that name none are taken as its
    knock-ons (the same mistake seen by other checks). Failures that name no bug are grouped by
    their reason, numbers masked, as symptoms. The failures of an item grading excused (its
    diagnosis charged them to another item) are no mistake of their own: they join the one
    mistake a student is charged for, where there is one, and are left out otherwise."""
    groups: dict[tuple[bool, str], dict[str, set[str]]] = defaultdict(dict)
    wording: dict[tuple[bool, str], Counter] = defaultdict(Counter)
    for student in students:
        named: dict[str, set[str]] = defaultdict(set)
        symptoms: dict[str, set[str]] = defaultdict(set)
        excused: set[str] = set()
        for item in student.score.items:
            for check in item.checks:
                if check.state is not State.FAILED or check.result is None:
                    continue
                if item.state is State.EXCUSED:  # charged to another item: its symptom
                    excused.add(check.check)
                    continue
                result = check.result
                if result.hint:  # one mistake here is one in the scores (charge_once)
                    named[bug_of(result)].add(check.check)
                    wording[(True, bug_of(result))][result.hint] += 1
                else:
                    symptoms[same_bug(result.reason)].add(check.check)
        if len(named) == 1:  # one bug named: the unnamed failures are its knock-ons
            (only,) = named.values()
            for checks in symptoms.values():
                only.update(checks)
            symptoms.clear()
        charged = [*named.values(), *symptoms.values()]
        if len(charged) == 1:
            charged[0].update(excused)
        for is_named, found in ((True, named), (False, symptoms)):
            for masked, checks in found.items():
                groups[(is_named, masked)].setdefault(student.id, set()).update(checks)
    order = {name: index for index, name in enumerate(CHECK_NAMES)}
    bugs = []
    for (is_named, masked), by_student in groups.items():
        checks = sorted(set().union(*by_student.values()), key=lambda c: order.get(c, len(order)))
        text = wording[(True, masked)].most_common(1)[0][0] if is_named else masked
        bugs.append(Bug(tuple(checks), text, tuple(by_student), named=is_named))
    return sorted(bugs, key=lambda bug: (-len(bug.students), not bug.named, bug.checks,
                                         bug.text))


def needs_a_look(students: list[Student]) -> list[tuple[str, str]]:
    """(student id, why) for every submission a human should look at."""
    found: list[tuple[str, str]] = []
    for student in students:
        outcome = student.outcome
        if outcome is None:
            continue
        reasons = []
        if outcome.status in NEEDS_A_LOOK:
            reasons.append(status_line(outcome.status, outcome.message))
        for target in outcome.targets:
            if target.status is RunStatus.NOT_FOUND and target.near_misses:
                reasons.append(f"{target.target} not found; defines "
                               f"{', '.join(target.near_misses)}")
            if "bound by an import" in target.message:
                reasons.append(f"{target.target}: {target.message}")
            gate = target.result("gate")
            if target.status is RunStatus.GRADED and gate is not None \
                    and gate.status is not Status.PASSED:
                reasons.append(f"{target.target}: the gate failed ({gate.reason})")
        for key, check in student.score.unevaluated:
            reasons.append(f"{key}: {check.check} not evaluated ({check.why})")
        if reasons:
            found.append((student.id, "; ".join(dict.fromkeys(reasons))))
    return found


def sandbox_summary(students: list[Student]) -> str:
    """How student code was contained: the filesystem sandboxes it ran in, and a warning for the
    submissions that ran in none (``grade --no-sandbox``)."""
    ran = Counter(s.outcome.sandbox for s in students if s.outcome and s.outcome.sandbox)
    unsandboxed = ran.pop("none", 0)
    parts = [f"{name} ({count})" for name, count in sorted(ran.items())]
    if unsandboxed:
        parts.insert(0, f"NOT SANDBOXED ({unsandboxed} submission(s), --no-sandbox): their code "
                        "could read and write whatever the grader's user can")
    return "; ".join(parts) or "no student code ran"


def _item_rates(rubric: Rubric, students: list[Student]) -> list[tuple[str, float, float, float]]:
    """Per item: the share passed (full points), failed or partial, not evaluated."""
    rates = []
    submitted = [s for s in students if s.record is not None]
    for item in rubric.items:
        states = [s.score.item(item.key).state for s in submitted]
        n = max(len(states), 1)
        passed = sum(state in (State.PASSED, State.EXCUSED) for state in states) / n
        skipped = sum(state is State.NOT_EVALUATED for state in states) / n
        failed = sum(state in (State.FAILED, State.PARTIAL) for state in states) / n
        rates.append((item.key, passed, failed, skipped))
    return rates


def plot(path: Path, rubric: Rubric, students: list[Student]) -> bool:
    """Draw the histogram and the per-item rates; False when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    rates = _item_rates(rubric, students)
    height = max(4.0, 0.38 * len(rates) + 1.6)
    figure = Figure(figsize=(12, height), dpi=110)
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.35]})
    percents = [s.score.percent for s in students if s.record is not None]
    left.hist(percents, bins=[i * 10 for i in range(11)], color="#4c72b0", edgecolor="white")
    left.set_xlim(0, 100)
    left.set_xlabel("score (%)")
    left.set_ylabel("submissions")
    left.set_title(f"Scores ({len(percents)} submissions)")
    left.yaxis.get_major_locator().set_params(integer=True)
    names = [key for key, *_ in rates][::-1]
    passed = [p * 100 for _, p, _, _ in rates][::-1]
    failed = [f * 100 for _, _, f, _ in rates][::-1]
    skipped = [s * 100 for _, _, _, s in rates][::-1]
    right.barh(names, passed, color="#55a868", label="passed")
    right.barh(names, failed, left=passed, color="#c44e52", label="failed / partial")
    right.barh(names, skipped, left=[p + f for p, f in zip(passed, failed, strict=True)],
               color="#bbbbbb", label="not evaluated")
    right.set_xlim(0, 100)
    right.set_xlabel("share of submissions (%)")
    right.set_title("Per rubric item")
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, fontsize=8,
                 frameon=False)
    right.tick_params(axis="y", labelsize=8)
    figure.suptitle(rubric.title)
    figure.tight_layout()
    figure.savefig(path)
    return True


def document(rubric: Rubric, students: list[Student], image: str | None) -> list[Block]:
    submitted = [s for s in students if s.record is not None]
    percents = [s.score.percent for s in submitted]
    blocks = [Heading(1, f"Class report: {rubric.title}")]
    statuses = Counter(s.status.value for s in students)
    meta = [["Students", str(len(students))], ["Submissions", str(len(submitted))],
            ["Statuses", ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))],
            ["Possible points", f"{rubric.max_points:g}"], ["Sandbox", sandbox_summary(students)]]
    if percents:
        meta += [["Mean score", f"{statistics.fmean(percents):.1f}%"],
                 ["Median score", f"{statistics.median(percents):.1f}%"],
                 ["Range", f"{min(percents):.1f}% to {max(percents):.1f}%"]]
    blocks.append(Facts(meta))
    if image:
        blocks.append(Image(image, "scores and per-item results"))
    else:
        blocks.append(Paragraph("No chart: matplotlib is not installed (pip install -e "
                                 ".[plot])."))
    rows = [["Item", "Points", "Passed", "Failed or partial", "Not evaluated"]]
    for (key, passed, failed, skipped), item in zip(_item_rates(rubric, students), rubric.items,
                                                    strict=True):
        rows.append([key, f"{item.max_points:g}", f"{passed:.0%}", f"{failed:.0%}",
                     f"{skipped:.0%}"])
    blocks += [Heading(2, "Per item"), Table(rows)]
    bugs = likely_bugs(students)
    blocks.append(Heading(2, "Most common likely bugs"))
    if bugs:
        rows = [["Likely bug", "Failed checks", "Students"]]
        for bug in bugs[:12]:
            shown = ", ".join(bug.students[:8]) + (" ..." if len(bug.students) > 8 else "")
            text = bug.text if bug.named else f"(none named) symptom: {bug.text}"
            rows.append([text, ", ".join(bug.checks), f"{len(bug.students)}: {shown}"])
        blocks.append(Table(rows))
        if len(bugs) > 12:
            blocks.append(Paragraph(f"... and {len(bugs) - 12} more, each in fewer or as many "
                                     "students (every failure is in the students' feedback)."))
    else:
        blocks.append(Paragraph("No check failed."))
    look = needs_a_look(students)
    blocks.append(Heading(2, "Needs a human look"))
    if look:
        blocks.append(Table([["Student", "Why"], *[[i, why] for i, why in look]]))
    else:
        blocks.append(Paragraph("Nothing: every submission ran and was graded normally."))
    printed = printed_output(students)
    if printed:
        blocks.append(Heading(2, "Printed output (for you only: never in a student's feedback)"))
        blocks.append(Paragraph("What each submission printed while it was graded: its "
                                 "beginning and end are kept in printed/ID.txt, the rest was "
                                 "dropped (printing never stops the grading)."))
        rows = [["Student", "Printed", "Kept in"]]
        rows += [[student, f"{total} bytes", f"printed/{student}.txt"]
                 for student, total in printed]
        blocks.append(Table(rows))
    return blocks


def printed_output(students: list[Student]) -> list[tuple[str, int]]:
    """(student id, bytes printed) for every submission that printed anything."""
    return [(student.id, student.outcome.printed_bytes
             or len(student.outcome.output.encode("utf-8")))
            for student in students
            if student.outcome is not None and student.outcome.output.strip()]


def write(out: Path, rubric: Rubric, students: list[Student]) -> None:
    """``class_report.md``, ``.html`` and ``.png`` in ``out``."""
    image = "class_report.png" if plot(out / "class_report.png", rubric, students) else None
    blocks = document(rubric, students, image)
    (out / "class_report.md").write_text(render_markdown(blocks), encoding="utf-8")
    (out / "class_report.html").write_text(render_html(blocks, f"Class report: {rubric.title}"),
                                           encoding="utf-8")
