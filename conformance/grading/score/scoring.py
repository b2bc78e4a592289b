"""Points from check results: a pure function of the rubric and a :class:`SubmissionOutcome`.

Rules (also in ``docs/grading.md``):

- a check earns its points when its result is ``passed``, or ``warning`` (a finding beyond
  the contract's normal range, shown in the feedback) unless the rubric is ``strict``; any
  other status (failed, skipped, a status this version doesn't know) is not a pass;
- a check that did not pass while one of its prerequisites (``requires``, transitively, and
  always the gate) did not pass either is **not evaluated**: the prerequisite's failure is the
  one reported, the dependent earns nothing and is not counted as a bug of its own;
- a check that passed keeps its points whatever its prerequisites did (it was evaluated);
- a check that was skipped (it could not run) is not evaluated;
- a target that was not found, did not import or stopped early scores what it had finished
  (nothing, usually); the rest is not evaluated, with the reason;
- nothing scores 0 silently: a graded submission with a check not evaluated for a reason that is
  not a failure of its own (skipped, not run; not a failed prerequisite, which is reported once
  where it failed) is ``partly evaluated``, and those items are listed with the reason;
- a group scores ``points`` when every check passes (all-or-nothing), or ``points_each`` per
  passing check, at most ``cap``;
- one mistake is charged once (``charge_once``, on by default), by a diagnosis of all the
  target's failures together (:func:`diagnose`): a bug whose kind the table of
  :mod:`conformance.model.bugs` describes is charged to the item of the check named for it (a
  head split without a transpose to ``head_split``, a softmax over the queries to
  ``row_stochastic``), and explains every failure in its reach that names no other bug; where
  the check that judges the mask failed, each failure that is gone when the check runs again
  without the mask (``CheckResult.unmasked``) is the mask's, charged to the mask's item. An item
  whose every failed check is explained by a bug charged to another item is **excused**: it
  keeps its points and says which item the bug is charged to. Then, in rubric order, an item
  whose every failed check names a likely bug (its kind, else its hint's words, numbers aside:
  :func:`bug_of`) that an earlier item lost points for is excused the same way. A failure that
  nothing explains is charged where it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from conformance.grading.score.outcome import (
    RunStatus,
    SubmissionOutcome,
    TargetOutcome,
    status_line,
)
from conformance.grading.score.rubric import Item, Rubric, Target, prerequisites
from conformance.model.bugs import MASK_JUDGE, reach
from conformance.model.results import CheckResult, Status


class State(str, Enum):
    """What became of a check or an item."""

    PASSED = "passed"
    PARTIAL = "partial"
    FAILED = "failed"
    NOT_EVALUATED = "not evaluated"
    EXCUSED = "excused"
    """It failed through a bug an earlier item is charged for (``charge_once``): its points
    kept."""


@dataclass
class CheckScore:
    """One check of an item: its state, why (when not evaluated), and its result."""

    check: str
    state: State
    why: str = ""
    result: CheckResult | None = None
    blocked: bool = False
    """Not evaluated because a prerequisite did not pass (the student's failure, reported
    there), as opposed to a check that could not run."""

    @property
    def label(self) -> str:
        """The state in words; a status this module doesn't know keeps its own name."""
        if (self.state is State.FAILED and self.result is not None
                and self.result.status is not Status.FAILED):
            return self.result.status.value
        return self.state.value


@dataclass
class ItemScore:
    item: Item
    points: float
    state: State
    checks: list[CheckScore] = field(default_factory=list)
    charged_to: Item | None = None
    """Excused: the earlier item its bug is charged to."""

    @property
    def max_points(self) -> float:
        return self.item.max_points

    @property
    def unevaluated(self) -> list[CheckScore]:
        """Checks of a graded target that could not be evaluated, through no failure of the
        student's (skipped, not run)."""
        return [c for c in self.checks if c.state is State.NOT_EVALUATED and not c.blocked]


@dataclass
class TargetScore:
    target: Target
    outcome: TargetOutcome | None
    items: list[ItemScore]

    @property
    def points(self) -> float:
        return _round(sum(item.points for item in self.items))

    @property
    def max_points(self) -> float:
        return self.target.max_points


@dataclass
class SubmissionScore:
    """A submission's points, item by item."""

    status: RunStatus
    targets: list[TargetScore]

    @property
    def unevaluated(self) -> list[tuple[str, CheckScore]]:
        """(item key, check) for every check that could not be evaluated through no failure of
        the student's, in a target that was graded."""
        return [(item.item.key, check) for target in self.targets
                if target.outcome is not None and target.outcome.status is RunStatus.GRADED
                for item in target.items for check in item.unevaluated]

    @property
    def items(self) -> list[ItemScore]:
        return [item for target in self.targets for item in target.items]

    @property
    def total(self) -> float:
        return _round(sum(target.points for target in self.targets))

    @property
    def max_points(self) -> float:
        return _round(sum(target.max_points for target in self.targets))

    @property
    def percent(self) -> float:
        return round(100.0 * self.total / self.max_points, 1) if self.max_points else 0.0

    def item(self, key: str) -> ItemScore:
        for item in self.items:
            if item.item.key == key:
                return item
        raise KeyError(key)


def _round(value: float) -> float:
    # Points are sums of a few decimals: round away float noise so CSVs are stable.
    return round(value + 0.0, 6)


def _passed(result: CheckResult | None, strict: bool = False) -> bool:
    if result is None:
        return False
    return result.status is Status.PASSED or (result.status is Status.WARNED and not strict)


def _check_score(target: Target, outcome: TargetOutcome | None, check: str,
                 strict: bool = False) -> CheckScore:
    if outcome is None:
        return CheckScore(check, State.NOT_EVALUATED, "the submission was not run")
    result = outcome.result(check)
    if result is None:
        if outcome.status is RunStatus.GRADED:
            return CheckScore(check, State.NOT_EVALUATED, "this check was not run")
        why = status_line(outcome.status, outcome.message)
        return CheckScore(check, State.NOT_EVALUATED, why)
    if _passed(result, strict):
        return CheckScore(check, State.PASSED, result=result)
    if result.status is Status.SUITE_ERROR:  # never charged: the grader's own error
        return CheckScore(check, State.NOT_EVALUATED, "the grader's own error here: a person "
                          "looks at it", result)
    blocking = [needed for needed in prerequisites(target, check)
                if not _passed(outcome.result(needed), strict)]
    if blocking:
        return CheckScore(check, State.NOT_EVALUATED,
                          f"requires {blocking[0]}, which did not pass", result, blocked=True)
    if result.status is Status.SKIPPED:
        return CheckScore(check, State.NOT_EVALUATED, result.reason, result)
    return CheckScore(check, State.FAILED, result=result)


def score_item(item: Item, target: Target, outcome: TargetOutcome | None,
               strict: bool = False) -> ItemScore:
    """The points ``item`` earns given the target's outcome (``strict``: a warning earns none)."""
    checks = [_check_score(target, outcome, check, strict) for check in item.checks]
    passed = sum(c.state is State.PASSED for c in checks)
    if item.points_each is not None:
        points = passed * item.points_each
        if item.cap is not None:
            points = min(points, item.cap)
    else:
        points = item.points if passed == len(checks) else 0.0
    points = _round(points)
    if passed == len(checks):
        state = State.PASSED
    elif all(c.state is State.NOT_EVALUATED for c in checks):
        state = State.NOT_EVALUATED
    elif points > 0:
        state = State.PARTIAL if points < item.max_points else State.PASSED
    else:
        state = State.FAILED
    return ItemScore(item, points, state, checks)


def score(rubric: Rubric, outcome: SubmissionOutcome) -> SubmissionScore:
    """Every item of ``rubric`` scored against ``outcome``; a graded submission with a check
    that could not be evaluated through no failure of its own is ``partly evaluated``."""
    targets = []
    for target in rubric.targets:
        target_outcome = outcome.target(target.name)
        targets.append(TargetScore(target, target_outcome,
                                   [score_item(item, target, target_outcome, rubric.strict)
                                    for item in target.items]))
    scored = SubmissionScore(outcome.status, targets)
    if rubric.charge_once:
        _charge_once(scored.targets)
    if scored.status is RunStatus.GRADED and scored.unevaluated:
        scored.status = RunStatus.PARTLY_EVALUATED
    return scored


def same_bug(hint: str) -> str:
    """What makes two hints of no known kind one: their words, numbers aside ("sqrt(6)" and
    "sqrt(8)")."""
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", hint)


def bug_of(result: CheckResult) -> str | None:
    """The mistake ``result`` names: its kind (the same from every check naming it, see
    :class:`conformance.model.results.Hint`), else its hint's words, numbers aside; None where
    it names none."""
    if result.bug:
        return f"kind: {result.bug}"
    return same_bug(result.hint) if result.hint else None


def _bugs(item: ItemScore) -> set[str] | None:
    """The bugs ``item``'s failed checks name, or None where one names none (charged where it
    is)."""
    failed = [c for c in item.checks if c.state is State.FAILED]
    bugs = {bug_of(c.result) if c.result is not None else None for c in failed}
    return None if not failed or None in bugs else bugs


def _lost(check: CheckScore) -> bool:
    """Whether ``check`` failed: as scored, or run without what a failed prerequisite judges
    (``requires``: blocked) and failed there too, evidence the diagnosis reads all the same."""
    return check.result is not None and (
        check.state is State.FAILED
        or (check.blocked and check.result.status is Status.FAILED))


def _failed(items: list[ItemScore]) -> list[tuple[ItemScore, CheckScore]]:
    return [(item, check) for item in items if item.points < item.max_points
            for check in item.checks if _lost(check)]


def diagnose(items: list[ItemScore]) -> dict[int, ItemScore]:
    """Which item each failed check of ``items`` is charged to, where a bug explains it
    (keyed by the check's ``id``; see the module docstring): the bugs with a reach first, the
    one that explains the most failures first; then the mask's, for the failures gone without
    the mask."""
    failed = _failed(items)
    charged: dict[int, ItemScore] = {}

    def explained(kind: str) -> list[CheckScore]:
        return [check for _, check in failed if check.check in reach(kind).checks
                and check.result.bug in (None, kind)]

    kinds = [kind for kind in dict.fromkeys(check.result.bug for _, check in failed)
             if reach(kind) is not None]
    for kind in sorted(kinds, key=lambda kind: -len(explained(kind))):
        home = next((item for item, check in failed if check.check == reach(kind).home),
                    None) or next(item for item, check in failed if check.result.bug == kind)
        for check in explained(kind):
            charged.setdefault(id(check), home)
    judge = next(((item, check) for item, check in failed if check.check == MASK_JUDGE), None)
    if judge is not None:
        home = charged.get(id(judge[1]), judge[0])
        for _, check in failed:
            if check.result.unmasked is not None and check.result.unmasked is not Status.FAILED:
                charged.setdefault(id(check), home)
    return charged


def _charge_once(targets: list[TargetScore]) -> None:
    """Excuse each item whose failures the diagnosis of its target charges to another item,
    then, in order, each item that lost points only through bugs an earlier item (of any
    target) lost points for (see the module docstring)."""
    charged_to: dict[int, ItemScore] = {}
    for target in targets:  # what a bug's symptoms reach is its own class's
        charged_to.update(diagnose(target.items))
    items = [item for target in targets for item in target.items]
    for item in items:
        failed = [check for check in item.checks if _lost(check)]
        if item.points >= item.max_points or not failed or any(
                check.state is State.NOT_EVALUATED and not _lost(check)
                for check in item.checks):
            continue
        homes = [charged_to.get(id(check)) for check in failed]
        if None not in homes and all(home is not item for home in homes):
            item.charged_to = homes[0].item
            item.points, item.state = item.max_points, State.EXCUSED
    charged: dict[str, Item] = {}
    for item in items:
        if item.points >= item.max_points:
            continue
        bugs = _bugs(item)
        if bugs is not None and bugs <= charged.keys():
            item.charged_to = charged[min(bugs)]
            item.points, item.state = item.max_points, State.EXCUSED
            continue
        for bug in bugs or ():
            charged.setdefault(bug, item.item)
