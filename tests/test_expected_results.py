"""The suite reproduces exactly the verdict matrix in implementations/expected_results.toml."""

from __future__ import annotations

import importlib

import pytest

from conformance import CHECK_NAMES, Runner, Status
from conformance.adapter import InProcessSubject
from implementations import bundled, expected_results
from implementations.mutants import MUTANT_MODULES

IMPLEMENTATIONS = {impl.name: impl for impl in bundled()}
CORRECT = ["reference-sdpa", "reference-torch-mha", "textbook", "textbook-causal"]


@pytest.fixture(scope="module")
def matrix() -> dict[str, dict[str, Status]]:
    """Raw verdicts (expected failures not applied) of every bundled implementation on the CPU."""
    runner = Runner("quick")
    verdicts = {}
    for name, impl in IMPLEMENTATIONS.items():
        subject = InProcessSubject(impl)
        subject.expected_failures = {}  # raw verdicts: the test compares them with the file
        verdicts[name] = {r.check: r.status for r in runner.run(subject, devices=["cpu"])}
    return verdicts


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_failures_are_exactly_the_expected_ones(matrix, name):
    expected = set(expected_results().get(name, {}))
    failed = {check for check, status in matrix[name].items() if status is Status.FAILED}
    assert failed == expected
    assert all(status in (Status.PASSED, Status.SKIPPED, Status.FAILED)
               for status in matrix[name].values())


@pytest.mark.parametrize("name", CORRECT)
def test_correct_implementations_pass_every_check_they_can_take(matrix, name):
    verdicts = matrix[name]
    assert all(status is not Status.FAILED for status in verdicts.values())
    skipped = {check for check, status in verdicts.items() if status is Status.SKIPPED}
    causal = IMPLEMENTATIONS[name].capabilities.causal != "never"
    assert skipped == (set() if causal else {"causal"})


@pytest.mark.parametrize("module", MUTANT_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_mutant_is_caught_by_the_check_it_targets(matrix, module):
    assert module.CATCHES in CHECK_NAMES
    assert matrix[module.IMPLEMENTATION.name][module.CATCHES] is Status.FAILED


def test_every_check_fails_on_some_bundled_implementation(matrix):
    caught = {check for verdicts in matrix.values()
              for check, status in verdicts.items() if status is Status.FAILED}
    assert caught == set(CHECK_NAMES)


def test_every_expected_failure_has_a_reason():
    for name, checks in expected_results().items():
        assert name in IMPLEMENTATIONS
        for check, reason in checks.items():
            assert check in CHECK_NAMES, (name, check)
            assert len(reason.split()) >= 5, (name, check)


SEED_MODULES = {
    "000": "seed000_multihead_self_attention",
    "001": "seed001_self_attention_steps",
    "002": "seed002_multihead_attention_qkv",
    "003": "seed003_causal_multihead_attention",
    "004": "seed004_multihead_attention_q_length",
}


@pytest.mark.parametrize("number,module", SEED_MODULES.items())
def test_each_seed_module_names_the_seed_file_it_reproduces(number, module):
    doc = importlib.import_module(f"implementations.{module}").__doc__
    assert f"``{number}_" in doc
