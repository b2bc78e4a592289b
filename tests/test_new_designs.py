"""What the suite makes of the 2024-26 designs (``tests/fixtures/new_designs.py``, each proved by
its own float64 oracle in ``tests/test_new_designs_are_correct.py``), with nothing declared:
every correct layer checked without a failure, and every broken twin failing the check named
for its bug. Swin's window attention takes one input length, which its ``window_size`` sets:
it is built small and checked at that length.
"""

from __future__ import annotations

import pytest

from conformance import Status
from conformance.inference import infer
from conformance.loading.registry import ResolveError, resolve
from conformance.model.remedies import texts
from conformance.model.results import Route
from conformance.run.many import check_many
from tests.fixtures import new_designs as designs


def spec(cls: type) -> str:
    return f"tests.fixtures.new_designs:{cls.__name__}"


@pytest.fixture(scope="module")
def checked():
    targets, unloadable = [], {}
    for cls in [*designs.CORRECT, *designs.BROKEN]:
        try:
            targets.append((spec(cls), resolve(spec(cls))[0]))
        except ResolveError as error:
            unloadable[cls.__name__] = str(error)
    by_name: dict[str, dict] = {name: {"load": why} for name, why in unloadable.items()}
    for result in check_many(targets, devices=["cpu"], jobs=2):
        by_name.setdefault(result.implementation.split(":")[-1], {})[result.check] = result
    return by_name


@pytest.mark.parametrize("cls", designs.CORRECT, ids=lambda c: c.__name__)
def test_no_correct_layer_fails(checked, cls):
    results = checked[cls.__name__]
    assert "load" not in results, results["load"]
    failed = {name: r.reason for name, r in results.items()
              if r.status in (Status.FAILED, Status.SUITE_ERROR)}
    assert not failed
    assert sum(r.status is Status.PASSED for r in results.values()) >= 8


@pytest.mark.parametrize(("cls", "check"), list(designs.BROKEN.items()),
                         ids=lambda v: getattr(v, "__name__", v))
def test_each_twin_fails_the_check_named_for_its_bug(checked, cls, check):
    results = checked[cls.__name__]
    assert "load" not in results, results["load"]
    assert results[check].status is Status.FAILED, results[check]


DESCRIBED = {
    "ChunkedTemperatureAttention": "a temperature of the position",
    "LearnedTemperatureAttention": "a learned temperature",
    "CrossHeadQKNormAttention": "a QK-norm",
    "TalkingHeadsAttention": "talking heads",
}
"""The designs whose core departs from one softmax of per-head q·kᵀ, and the words that say
how: no per-head weights hold them, so the checks that can judge them through their core do."""


@pytest.mark.parametrize("name", list(DESCRIBED))
def test_a_core_of_its_own_design_is_described_and_judged_there(checked, name):
    scale = checked[name]["scale"]
    assert scale.route is Route.CORE and scale.status is Status.PASSED
    for check in ("row_stochastic", "reference"):
        assert checked[name][check].route is Route.CORE
        assert checked[name][check].status is Status.PASSED
    notes = texts(infer(getattr(designs, name)).notes)
    assert any(DESCRIBED[name] in note and "judge it through its" in note for note in notes)


def test_a_scale_setting_is_followed_and_one_ignored_fails_for_it(checked):
    assert checked["SettingScaledAttention"]["reference"].status is Status.PASSED
    assert "attention_multiplier is ignored" in checked["MultiplierIgnored"]["scale"].reason
