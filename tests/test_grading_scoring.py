"""Scoring from constructed CheckResults: independent of how results were obtained."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from conformance.grading.score.outcome import (
    RunStatus,
    SubmissionOutcome,
    TargetOutcome,
    overall_status,
    result_from_dict,
)
from conformance.grading.score.rubric_file import load
from conformance.grading.score.scoring import State, score
from conformance.model.results import CheckResult, Status

RUBRIC = """
[[targets]]
class = "MHA"
[[targets.items]]
check = "gate"
points = 0
[[targets.items]]
check = "contract"
points = 1
[[targets.items]]
check = "padding"
points = 2
requires = ["contract"]
[[targets.items]]
check = "head_split"
points = 2
[[targets.items]]
group = "numerics"
checks = ["reference", "scale"]
points = 3
[[targets.items]]
group = "robustness"
checks = ["batch_independence", "autograd", "determinism"]
points_each = 1
cap = 2
[[targets]]
class = "Causal"
[[targets.items]]
check = "causal"
points = 2
"""

P, F, S = Status.PASSED, Status.FAILED, Status.SKIPPED


@pytest.fixture
def rubric(tmp_path):
    path = tmp_path / "rubric.toml"
    path.write_text(textwrap.dedent(RUBRIC))
    return load(path)


def results(target: str, **statuses: Status) -> list[CheckResult]:
    return [CheckResult(target, check, "cpu", status,
                        reason="" if status is P else f"{check} went wrong")
            for check, status in statuses.items()]


def outcome(mha: dict, causal: dict | None = None,
            mha_status: RunStatus = RunStatus.GRADED) -> SubmissionOutcome:
    targets = [TargetOutcome("MHA", mha_status, results=results("MHA", **mha))]
    if causal is not None:
        targets.append(TargetOutcome("Causal", RunStatus.GRADED, results=results("Causal", **causal)))
    else:
        targets.append(TargetOutcome("Causal", RunStatus.NOT_FOUND, "no class Causal"))
    return SubmissionOutcome(overall_status(targets), "", targets)


ALL_PASS = dict(gate=P, contract=P, padding=P, head_split=P, reference=P, scale=P,
                batch_independence=P, autograd=P, determinism=P)


def test_everything_passing_gets_full_marks(rubric):
    graded = score(rubric, outcome(ALL_PASS, {"gate": P, "causal": P}))
    assert graded.total == graded.max_points == 12
    assert graded.percent == 100.0
    assert all(item.state is State.PASSED for item in graded.items)


def test_groups_all_or_nothing_and_capped(rubric):
    graded = score(rubric, outcome({**ALL_PASS, "scale": F, "autograd": F}, {"gate": P, "causal": P}))
    assert graded.item("MHA.numerics").points == 0          # one of two failed: nothing
    assert graded.item("MHA.numerics").state is State.FAILED
    assert graded.item("MHA.robustness").points == 2       # 2 of 3 passed, capped at 2 anyway
    assert graded.item("MHA.robustness").state is State.PASSED
    graded = score(rubric, outcome({**ALL_PASS, "autograd": F, "determinism": F}, {"gate": P, "causal": P}))
    assert graded.item("MHA.robustness").points == 1
    assert graded.item("MHA.robustness").state is State.PARTIAL
    assert graded.total == 11


def test_a_failed_prerequisite_marks_dependents_not_evaluated_once(rubric):
    graded = score(rubric, outcome({**ALL_PASS, "contract": F, "padding": F}, {"gate": P, "causal": P}))
    padding = graded.item("MHA.padding")
    assert padding.points == 0 and padding.state is State.NOT_EVALUATED
    assert padding.checks[0].why == "requires contract, which did not pass"
    assert graded.item("MHA.contract").state is State.FAILED
    # A dependent that passed keeps its points: it was evaluated.
    graded = score(rubric, outcome({**ALL_PASS, "contract": F}, {"gate": P, "causal": P}))
    assert graded.item("MHA.padding").points == 2


def test_a_failed_gate_blocks_every_check_of_its_target(rubric):
    blocked = {name: S for name in ALL_PASS}
    blocked["gate"] = F
    graded = score(rubric, outcome(blocked, {"gate": P, "causal": P}))
    mha = [i for i in graded.items if i.item.target == "MHA"]
    assert mha[0].state is State.FAILED                      # the gate itself
    assert all(i.state is State.NOT_EVALUATED for i in mha[1:])
    assert {c.why for i in mha[1:] for c in i.checks} == {"requires gate, which did not pass"}
    assert graded.total == 2                                 # the other target is unaffected


def test_a_missing_target_scores_nothing_with_its_reason(rubric):
    graded = score(rubric, outcome(ALL_PASS))
    causal = graded.item("Causal.causal")
    assert causal.state is State.NOT_EVALUATED and causal.points == 0
    assert causal.checks[0].why == "not found: no class Causal"
    assert graded.total == 10 and graded.status is RunStatus.NOT_FOUND


def test_a_run_that_stopped_early_keeps_what_it_finished(rubric):
    partial = dict(gate=P, contract=P, padding=P)
    graded = score(rubric, outcome(partial, {"gate": P, "causal": P}, mha_status=RunStatus.TIMEOUT))
    assert graded.item("MHA.padding").points == 2
    head_split = graded.item("MHA.head_split")
    assert head_split.state is State.NOT_EVALUATED and head_split.checks[0].why.startswith("timeout")


def test_a_skipped_check_is_not_evaluated_and_another_status_is_not_a_pass(rubric):
    graded = score(rubric, outcome({**ALL_PASS, "head_split": S},
                                   {"gate": P, "causal": Status.EXPECTED_FAILURE}))
    assert graded.item("MHA.head_split").state is State.NOT_EVALUATED
    causal = graded.item("Causal.causal")
    assert causal.points == 0 and causal.checks[0].label == "expected-failure"


def test_nothing_scores_zero_silently(rubric):
    """A check that could not run is its own status; a failed prerequisite is not (it is the
    student's failure, reported once where it failed)."""
    graded = score(rubric, outcome({**ALL_PASS, "head_split": S}, {"gate": P, "causal": P}))
    assert graded.status is RunStatus.PARTLY_EVALUATED
    assert [(key, check.check) for key, check in graded.unevaluated] == [
        ("MHA.head_split", "head_split")]
    blocked = score(rubric, outcome({**ALL_PASS, "contract": F, "padding": S},
                                    {"gate": P, "causal": P}))
    assert blocked.status is RunStatus.GRADED and blocked.unevaluated == []
    assert blocked.item("MHA.padding").checks[0].blocked
    # A target that never ran says so in its own status, not as partly evaluated.
    assert score(rubric, outcome(ALL_PASS)).status is RunStatus.NOT_FOUND


def test_a_status_this_version_does_not_know_comes_back_as_not_passed():
    data = CheckResult("MHA", "padding", "cpu", P).to_dict()
    data["status"] = "from-a-later-version"  # stored by a newer suite
    data["reason"] = "slow"
    result = result_from_dict(data)
    assert result.status is Status.FAILED and result.reason == "[from-a-later-version] slow"


def test_only_passed_and_warnings_earn_points_and_strict_withholds_warnings(rubric):
    """A warning (beyond the contract's normal range) is not a bug: it earns the check's points
    unless the rubric is strict; every other status earns nothing."""
    for status in Status:
        if status is Status.PASSED:
            continue
        graded = score(rubric, outcome({**ALL_PASS, "head_split": status}, {"gate": P, "causal": P}))
        item = graded.item("MHA.head_split")
        if status is Status.WARNED:
            assert item.points > 0 and item.state is State.PASSED
            continue
        assert item.points == 0 and item.state is not State.PASSED, status
        assert graded.total == 10
    strict = dataclasses.replace(rubric, strict=True)
    graded = score(strict, outcome({**ALL_PASS, "head_split": Status.WARNED},
                                   {"gate": P, "causal": P}))
    assert graded.item("MHA.head_split").points == 0


def test_overall_status_is_the_most_serious(rubric):
    targets = [TargetOutcome("a", RunStatus.GRADED), TargetOutcome("b", RunStatus.NOT_FOUND),
               TargetOutcome("c", RunStatus.TIMEOUT)]
    assert overall_status(targets) is RunStatus.TIMEOUT
    assert overall_status(targets[:1]) is RunStatus.GRADED


def test_an_outcome_round_trips_through_json(rubric):
    original = outcome({**ALL_PASS, "padding": F}, {"gate": P, "causal": P})
    original.targets[0].results[2].details = ["numbers"]
    again = SubmissionOutcome.from_dict(original.to_dict())
    assert again.to_dict() == original.to_dict()
    assert score(rubric, again).total == score(rubric, original).total


def test_example_expected_grades_are_consistent_with_the_rubric():
    """The committed grades.csv adds up: each total is the sum of its item columns."""
    import csv

    example = Path(__file__).parents[1] / "examples" / "attention-assignment"
    rubric = load(example / "rubric.toml")
    rows = list(csv.DictReader((example / "expected" / "grades.csv").open()))
    keys = [item.key for item in rubric.items]
    for row in rows:
        assert float(row["total"]) == pytest.approx(sum(float(row[k]) for k in keys))
    assert rows[0]["id"] == "Points Possible" and float(rows[0]["total"]) == rubric.max_points


def test_a_suite_error_is_never_charged_to_the_student(rubric):
    graded = score(rubric, outcome({**ALL_PASS, "head_split": Status.SUITE_ERROR},
                                   {"gate": P, "causal": P}))
    item = graded.item("MHA.head_split")
    assert item.state is State.NOT_EVALUATED and item.points == 0
    assert item.checks[0].why.startswith("the grader's own error")
    assert graded.status is RunStatus.PARTLY_EVALUATED  # a person looks at it


def test_a_submission_every_check_of_which_skipped_is_not_evaluated_never_full_marks(rubric):
    """A device the grader could not use (every check skipped, the gate too) checked nothing:
    no points, and the submission says it was only partly evaluated."""
    skipped = {check: S for check in ALL_PASS}
    graded = score(rubric, outcome(skipped, {"gate": S, "causal": S}))
    assert graded.total == 0 and graded.status is RunStatus.PARTLY_EVALUATED
    assert all(item.state is State.NOT_EVALUATED for item in graded.items)


def _with_hints(graded_outcome: SubmissionOutcome, hints: dict[str, str]) -> SubmissionOutcome:
    for target in graded_outcome.targets:
        for result in target.results:
            if result.check in hints:
                result.hint = hints[result.check]
    return graded_outcome


SCALE = "the scale is 1/sqrt(d_model) = 1/sqrt(8): did you divide by sqrt(hidden_dim)?"


def test_one_mistake_is_charged_once_in_the_first_item_that_loses_points_for_it(rubric):
    """Scaled by sqrt(d_model): head_split and the numerics group both fail naming that bug.
    head_split (first in rubric order) is charged; numerics is excused, keeps its points, and
    says where the bug is charged."""
    failing = {**ALL_PASS, "head_split": F, "reference": F, "scale": F}
    hints = {"head_split": SCALE, "reference": SCALE.replace("8", "16"), "scale": SCALE}
    graded = score(rubric, _with_hints(outcome(failing, {"gate": P, "causal": P}), hints))
    assert graded.item("MHA.head_split").points == 0
    numerics = graded.item("MHA.numerics")
    assert (numerics.state, numerics.points, numerics.charged_to.key) == (
        State.EXCUSED, 3, "MHA.head_split")
    assert graded.total == 10
    # A failure naming no bug, or another bug, is charged where it is.
    unnamed = score(rubric, _with_hints(outcome(failing, {"gate": P, "causal": P}),
                                        {"head_split": SCALE, "reference": SCALE}))
    assert unnamed.item("MHA.numerics").state is State.FAILED  # scale names none
    # The rubric can turn it off.
    strict = dataclasses.replace(rubric, charge_once=False)
    assert score(strict, _with_hints(outcome(failing, {"gate": P, "causal": P}),
                                     hints)).total == 7


def test_an_excused_item_says_where_its_bug_is_charged(rubric):
    from conformance.grading.report.feedback import item_markdown

    failing = {**ALL_PASS, "head_split": F, "reference": F, "scale": F}
    graded = score(rubric, _with_hints(outcome(failing, {"gate": P, "causal": P}),
                                       dict.fromkeys(("head_split", "reference", "scale"),
                                                     SCALE)))
    text = item_markdown(graded.item("MHA.numerics"))
    assert text.startswith("**excused**: 3 / 3 point(s)")
    label = graded.item("MHA.head_split").item.label
    assert f'the same mistake as "{label}", where its points were taken' in text


def _with(graded_outcome: SubmissionOutcome, target: str, **fields: dict) -> SubmissionOutcome:
    """``fields[check]`` set on that check's result of ``target`` (a bug, a status without the
    mask)."""
    for result in next(t for t in graded_outcome.targets if t.target == target).results:
        for name, value in fields.get(result.check, {}).items():
            setattr(result, name, value)
    return graded_outcome


SPLIT = {"bug": "heads split without transpose"}


def test_the_diagnosis_charges_a_named_bug_once_to_the_item_named_for_it(rubric):
    """Heads split without a transpose: head_split and reference name it; padding, scale and
    two robustness checks fail naming nothing. The bug is charged to head_split alone, every
    symptom of it excused, saying so; another class's failure is its own."""
    failing = {**ALL_PASS, "padding": F, "head_split": F, "reference": F, "scale": F,
               "autograd": F, "determinism": F}
    graded = score(rubric, _with(outcome(failing, {"gate": P, "causal": F}), "MHA",
                                 head_split=SPLIT, reference=SPLIT))
    lost = {item.item.key: item.points for item in graded.items
            if item.points < item.max_points}
    assert lost == {"MHA.head_split": 0, "Causal.causal": 0}
    for key in ("MHA.padding", "MHA.numerics", "MHA.robustness"):
        item = graded.item(key)
        assert (item.state, item.charged_to.key) == (State.EXCUSED, "MHA.head_split"), key


def test_a_failure_gone_without_the_mask_is_the_masks_and_one_that_stays_is_its_own(rubric):
    """Padding failed. reference passed when run again without the mask: the mask's, so the
    numerics item is excused and charged to padding. head_split failed without the mask too:
    a bug of its own, charged where it is."""
    failing = {**ALL_PASS, "padding": F, "head_split": F, "reference": F}
    graded = score(rubric, _with(outcome(failing, {"gate": P, "causal": P}), "MHA",
                                 reference={"unmasked": P}, head_split={"unmasked": F}))
    numerics = graded.item("MHA.numerics")
    assert (numerics.state, numerics.charged_to.key) == (State.EXCUSED, "MHA.padding")
    assert graded.item("MHA.padding").points == 0
    assert graded.item("MHA.head_split").state is State.FAILED
    assert graded.total == graded.max_points - 4


def test_the_evidence_without_the_mask_survives_the_json():
    kept = CheckResult("MHA", "reference", "cpu", F, unmasked=P)
    assert result_from_dict(kept.to_dict()).unmasked is P
    assert "unmasked" not in CheckResult("MHA", "reference", "cpu", F).to_dict()
