"""The rubric's self-test: does it give the reference full marks and tell the mutants apart?

The instructor's reference solution (``[assignment] reference``) is graded like a submission
and must get full marks. Then every bundled mutant (:mod:`conformance.implementations.mutants`, each a
correct textbook attention with one bug people ship, and ``CATCHES``, the check that must
catch it) is graded against each target of matching causality, with the mutant's own
declaration. A mutant must lose the points of the item that holds its ``CATCHES`` check;
when the rubric has no such item, the mutant is reported as not covered, and as
indistinguishable from a correct solution if it also gets full marks.

Both are trusted code (the instructor's and the suite's own), so they run on the temporary
trusted path of :mod:`conformance.grading.run.execution`.

Verdicts (:class:`MutantVerdict`): ``caught``; ``NOT CAUGHT`` (the rubric grades the check but
the mutant keeps its points: the profile or the checks are too weak); ``caught elsewhere`` (no
item for the check, but the mutant loses points on others); ``not covered`` (no item for the
check and full marks elsewhere: indistinguishable from a correct solution); ``not applicable``
(the same, for a bug of a feature the assignment's class does not have, ALiBi in an assignment
without it: its check does not apply to the reference's interface, so no student can make it);
``COULD NOT RUN`` (its run ended in another status than graded: points it lost prove nothing).
The self-test fails on a reference short of full marks, on any ``NOT CAUGHT`` and on any
``COULD NOT RUN``.

It also grades a correct solution written another way (:mod:`conformance.grading.run.variants`:
the reference with its attributes renamed) and warns when an item is then not evaluated or
loses points: the rubric would cost a correct student points for a name.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from conformance.checks.catalogue import by_name
from conformance.errors import ConformanceError
from conformance.grading.intake.discovery import Submission, SubmissionSource
from conformance.grading.intake.staging import stage
from conformance.grading.run import variants
from conformance.grading.run.execution import run_registered, run_submission
from conformance.grading.run.parsing import one_parse_at_a_time
from conformance.grading.score.outcome import RunStatus, SubmissionOutcome
from conformance.grading.score.rubric import Rubric, Target
from conformance.grading.score.scoring import ItemScore, State, SubmissionScore, score
from conformance.loading.registry import resolve
from conformance.model.spec import Capabilities
from conformance.model.target_spec import TargetSpec
from conformance.worker import SandboxKind


class MutantVerdict(str, Enum):
    """What the self-test concludes of one mutant against one target (the module docstring says
    when each is given)."""

    CAUGHT = "caught"
    NOT_CAUGHT = "NOT CAUGHT"
    CAUGHT_ELSEWHERE = "caught elsewhere"
    NOT_COVERED = "not covered"
    NOT_APPLICABLE = "not applicable"
    COULD_NOT_RUN = "COULD NOT RUN"


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str
    catches: str
    bug: str
    causal: bool


@dataclass
class MutantRow:
    mutant: Mutant
    target: str
    score: float
    max_points: float
    item: str | None
    lost: float
    item_points: float
    verdict: MutantVerdict
    outside: str | None = None
    """Why the mutant's bug can't occur in this target (its check does not apply to the
    reference's interface: "declares no ALiBi position bias"), where it can't."""
    lost_in: tuple[str, ...] = ()
    """The items (keys) the mutant lost points in."""
    excused_in: tuple[str, ...] = ()
    """The items (keys) that saw the mutant's bug and were excused, charged to another item."""
    charged_to: str | None = None
    """The earlier item its check's item was excused for (charge_once: the same bug, charged
    there): the mutant is told apart, once."""
    not_run: str | None = None
    """Where it could not be run (``COULD_NOT_RUN``): the run's status."""
    not_run_why: str = ""
    """Where it could not be run: what the run said of it (the worker's error: a bundled
    mutant's, never a student's, so it is shown whole)."""

    @property
    def shown(self) -> str:
        """The verdict as the table shows it (a run that failed with its status)."""
        if self.not_run is not None:
            return f"{self.verdict.value} ({self.not_run})"
        return self.verdict.value


@dataclass
class VariantRow:
    """A correct solution written another way, and every item short of full marks."""

    description: str
    score: SubmissionScore
    problems: list[str]


@dataclass
class SelfTest:
    reference: SubmissionScore | None
    reference_outcome: SubmissionOutcome | None
    reference_problems: list[str] = field(default_factory=list)
    rows: list[MutantRow] = field(default_factory=list)
    variants: list[VariantRow] = field(default_factory=list)
    items: tuple[str, ...] = ()
    """The rubric's items that award points (keys), in order."""

    @property
    def unexercised(self) -> list[str]:
        """The items no mutant lost points in: the self-test shows nothing about them (a
        rubric item whose bug no bundled mutant makes, or a check too weak to see it)."""
        # An item excused for a bug charged to another one saw that bug: it counts.
        lost = {key for row in self.rows for key in (*row.lost_in, *row.excused_in)}
        lost |= {row.item for row in self.rows if row.charged_to and row.item}
        return [key for key in self.items if key not in lost]

    @property
    def not_caught(self) -> list[MutantRow]:
        return [row for row in self.rows if row.verdict is MutantVerdict.NOT_CAUGHT]

    @property
    def warnings(self) -> list[str]:
        """A correct solution written another way short of full marks, item by item."""
        return [f"{variant.description}: {problem}"
                for variant in self.variants for problem in variant.problems]

    @property
    def indistinguishable(self) -> list[MutantRow]:
        return [row for row in self.rows
                if row.verdict is MutantVerdict.NOT_COVERED and row.score >= row.max_points
                and row.outside is None]

    @property
    def not_run(self) -> list[MutantRow]:
        return [row for row in self.rows if row.verdict is MutantVerdict.COULD_NOT_RUN]

    @property
    def ok(self) -> bool:
        return not self.reference_problems and not self.not_caught and not self.not_run


def bundled_mutants() -> list[Mutant]:
    """Every mutant of the zoo, with the check that must catch it."""
    from conformance.implementations.mutants import MUTANT_MODULES

    return [Mutant(module.IMPLEMENTATION.name, module.__name__, module.CATCHES,
                   module.IMPLEMENTATION.description,
                   module.IMPLEMENTATION.capabilities.causality.kind != "never")
            for module in MUTANT_MODULES]


def _problems(graded: SubmissionScore) -> list[str]:
    """Why a correct solution falls short of full marks: one line per class that did not run
    (its status and why), then one per item short of its points (each check and its message)."""
    problems = []
    stopped = set()
    for target in graded.targets:
        outcome = target.outcome
        if outcome is not None and outcome.status is not RunStatus.GRADED:
            stopped.add(target.target.name)
            problems.append(f"{target.target.name}: {outcome.status.value}: {outcome.message}")
    for target in graded.targets:
        if target.target.name in stopped:
            continue
        problems += _short_items(target.items)
    if not problems and graded.total < graded.max_points:
        problems.append(f"{graded.total:g} / {graded.max_points:g} ({graded.status.value})")
    return problems


def _short_items(items: list[ItemScore]) -> list[str]:
    """One line per item short of its points: each check that did not pass, and why."""
    problems = []
    for item in items:
        if item.points < item.max_points:
            reasons = []
            for check in item.checks:
                if check.state is not State.PASSED:
                    why = check.why or (check.result.reason if check.result else "")
                    reasons.append(f"{check.check} {check.label}" + (f" ({why})" if why else ""))
            problems.append(f"{item.item.key}: {item.points:g} / {item.max_points:g}: "
                            + "; ".join(reasons))
    return problems


def grade_reference(rubric: Rubric, sandbox: SandboxKind = "filesystem", path: Path | None = None
                    ) -> tuple[SubmissionScore, SubmissionOutcome, list[str]]:
    """The reference solution's score, outcome, and every item short of full marks (run in the
    ``sandbox`` tier, like the students; ``path``: another correct solution, graded the same
    way)."""
    if rubric.reference is None:
        raise ValueError("the rubric names no reference solution ([assignment] reference)")
    path = path or rubric.reference
    submission = Submission(id="reference", name="reference", layout="file",
                            sources=[SubmissionSource(path, "" if path.is_dir() else path.name)])
    with tempfile.TemporaryDirectory(prefix="attention-reference-") as scratch:
        staged = stage(submission, Path(scratch) / "reference")
        if staged.problem is not None:
            outcome = SubmissionOutcome(staged.problem, staged.message)
        else:
            outcome = run_submission(staged.directory, rubric,
                                     syntax_errors=staged.syntax_errors, sandbox=sandbox)
    graded = score(rubric, outcome)
    return graded, outcome, _problems(graded)


def _row(rubric: Rubric, target: Target, mutant: Mutant, sandbox: SandboxKind) -> MutantRow:
    outcome = run_registered(rubric, target, mutant.module, sandbox=sandbox)
    single = replace(rubric, targets=(target,))
    graded = score(single, outcome)
    item = next((i for i in graded.items if mutant.catches in i.item.checks), None)
    if outcome.status is not RunStatus.GRADED:
        # Points lost to a mutant that never ran prove nothing about the rubric.
        return MutantRow(mutant, target.name, graded.total, graded.max_points,
                         item.item.key if item else None, 0.0, 0.0,
                         MutantVerdict.COULD_NOT_RUN, not_run=outcome.status.value,
                         not_run_why=outcome.message)
    if item is None:
        lost, item_points = 0.0, 0.0
        verdict = (MutantVerdict.CAUGHT_ELSEWHERE if graded.total < graded.max_points
                   else MutantVerdict.NOT_COVERED)
    else:
        lost, item_points = item.max_points - item.points, item.max_points
        # Excused for the same bug charged to an earlier item (charge_once): caught there.
        charged_to = (item.charged_to.key if item.state is State.EXCUSED and item.charged_to
                      else None)
        told_apart = (lost > 0 or charged_to is not None
                      or (item.max_points == 0 and graded.total < graded.max_points))
        verdict = MutantVerdict.CAUGHT if told_apart else MutantVerdict.NOT_CAUGHT
    return MutantRow(mutant, target.name, graded.total, graded.max_points,
                     item.item.key if item else None, lost, item_points, verdict,
                     lost_in=tuple(i.item.key for i in graded.items if i.points < i.max_points),
                     excused_in=tuple(i.item.key for i in graded.items
                                      if i.state is State.EXCUSED),
                     charged_to=charged_to if item is not None else None)


def reference_capabilities(rubric: Rubric, target: Target) -> Capabilities | None:
    """What the reference solution's class for ``target`` can do, as the rubric's interface
    declares it and inference finds the rest (the instructor's code: trusted, loaded here);
    None where it can't be read so."""
    if rubric.reference is None or not rubric.reference.is_file():
        return None
    try:
        found = resolve(TargetSpec.in_file(rubric.reference, target.name).text,
                        target.declarations)
    except ConformanceError:
        return None
    return found[0].capabilities if len(found) == 1 else None


def _applicable(row: MutantRow, capabilities: Capabilities | None) -> MutantRow:
    """``row``, marked as outside the assignment where its bug's check does not apply to the
    target's class (a bug of ALiBi, a KV cache or RoPE in an assignment that has none)."""
    if capabilities is None or row.verdict is not MutantVerdict.NOT_COVERED:
        return row
    outside = by_name(row.mutant.catches).skip_reason(capabilities)
    if outside is None:
        return row
    return replace(row, verdict=MutantVerdict.NOT_APPLICABLE, outside=outside)


def run(rubric: Rubric, *, jobs: int = 1, mutants: list[Mutant] | None = None,
        on_done: Callable[[str], None] | None = None,
        sandbox: SandboxKind = "filesystem") -> SelfTest:
    """Grade the reference and every mutant against every target of matching causality, in the
    ``sandbox`` tier."""
    reference, outcome, problems = grade_reference(rubric, sandbox)
    result = SelfTest(reference, outcome, problems,
                      items=tuple(item.key for item in rubric.items if item.max_points > 0))
    with tempfile.TemporaryDirectory(prefix="attention-variant-") as scratch:
        variant = variants.renamed(rubric.reference, Path(scratch) / "renamed")
        if variant is not None:
            graded, _, short = grade_reference(rubric, sandbox, variant.path)
            result.variants.append(VariantRow(variant.describe(), graded, short))
    pairs = [(target, mutant) for mutant in (mutants if mutants is not None
                                             else bundled_mutants())
             for target in rubric.targets if mutant.causal == target.causal]
    interfaces = {target.name: reference_capabilities(rubric, target)
                  for target in rubric.targets}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, one_parse_at_a_time():
        futures = [pool.submit(_row, rubric, target, mutant, sandbox) for target, mutant in pairs]
        for future in futures:
            row = future.result()
            row = _applicable(row, interfaces[row.target])
            result.rows.append(row)
            if on_done:
                on_done(f"{row.mutant.name} as {row.target}: {row.shown}")
    return result


def render(result: SelfTest) -> str:
    """The self-test as a table and a verdict, for the terminal."""
    lines = []
    if result.reference is not None:
        ref = result.reference
        lines.append(f"reference solution: {ref.total:g} / {ref.max_points:g}"
                     + (" (full marks)" if not result.reference_problems else
                        "  NOT FULL MARKS"))
        lines += [f"  {problem}" for problem in result.reference_problems]
    if result.rows:
        header = ("mutant", "bug", "target", "catches", "rubric item", "lost", "score", "verdict")
        table = [header] + [
            (row.mutant.name, row.mutant.bug, row.target, row.mutant.catches, row.item or "-",
             (f"charged to {row.charged_to}" if row.charged_to else
              f"{row.lost:g}/{row.item_points:g}") if row.item else "-",
             f"{row.score:g}/{row.max_points:g}", row.shown) for row in result.rows]
        widths = [min(max(len(r[i]) for r in table), 48) for i in range(len(header))]
        lines.append("")
        for row in table:
            cells = [cell if len(cell) <= widths[i] else cell[:widths[i] - 1] + "…"
                     for i, cell in enumerate(row)]
            lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    caught = sum(row.verdict is MutantVerdict.CAUGHT for row in result.rows)
    covered = sum(row.item is not None for row in result.rows)
    elsewhere = sum(row.verdict is MutantVerdict.CAUGHT_ELSEWHERE for row in result.rows)
    outside = sum(row.outside is not None for row in result.rows)
    lines.append("")
    lines.append(f"{caught} of {covered} mutants whose bug the rubric grades lose those points; "
                 f"{len(result.rows) - covered} mutant(s) whose bug it does not grade, "
                 f"{elsewhere} of them losing points on other items, {outside} of them bugs of "
                 "a feature the assignment's classes do not have (not applicable)")
    if result.rows and result.unexercised:
        lines.append(f"items no mutant lost points in, so this self-test shows nothing about "
                     f"them: {', '.join(result.unexercised)} (test them with a submission of "
                     "your own that has their bug)")
    for variant in result.variants:
        lines.append(f"{variant.description}: {variant.score.total:g} / "
                     f"{variant.score.max_points:g}" + ("" if variant.problems else
                                                        " (full marks)"))
        if variant.problems:
            lines.append("  WARNING: a correct solution written another way loses points (does "
                         "the rubric depend on names, e.g. declared weights?):")
            lines += [f"    {problem}" for problem in variant.problems]
    for row in result.indistinguishable:
        lines.append(f"  indistinguishable from a correct solution: {row.mutant.name} "
                     f"({row.mutant.bug}; the rubric grades no {row.mutant.catches} in {row.target})")
    if result.ok:
        lines.append("OK: the reference gets full marks and every graded bug costs its points")
    else:
        reasons = []
        if result.reference_problems:
            reasons.append("the reference does not get full marks")
        if result.not_caught:
            reasons.append(f"{len(result.not_caught)} mutant(s) keep the points of the check "
                           "that should catch them: "
                           + ", ".join(r.mutant.name for r in result.not_caught))
        if result.not_run:
            reasons.append(f"{len(result.not_run)} mutant(s) could not be run: "
                           + ", ".join(r.mutant.name for r in result.not_run))
        lines += [f"  {row.mutant.name} as {row.target} could not run ({row.not_run}): "
                  f"{row.not_run_why}" for row in result.not_run if row.not_run_why]
        lines.append("FAILED: " + "; ".join(reasons))
    return "\n".join(lines)
