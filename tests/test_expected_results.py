"""The suite reproduces exactly the verdict matrix in implementations/expected_results.toml."""

from __future__ import annotations

import importlib

import pytest

from conformance import CHECK_NAMES, CheckResult, Status
from conformance.catalogue import check_many
from conformance.kernels import PLATFORM_NOTE
from implementations import bundled, expected_results, expected_warnings
from implementations.mutants import MUTANT_MODULES

IMPLEMENTATIONS = {impl.name: impl for impl in bundled()}
MODERN = {"kv_groups", "position_shift", "alibi", "sliding_window", "kv_cache", "packed"}
"""The modern-form checks: a classic implementation declares none of their forms."""
POSITIONAL = {"permutation"}
"""What a module with a relative position encoding inside skips: order matters by design (the
float64 reference applies its RoPE or ALiBi, so every reference check runs)."""
CORRECT = {  # correct implementations, and the checks they declare they can't take part in
    "reference-sdpa": MODERN,
    "reference-torch-mha": MODERN,
    "textbook": {"causal"} | MODERN,
    "textbook-causal": {"permutation"} | MODERN,
    # Causal and without dropout: permutation and dropout never apply; one mask format.
    "modern-llama": POSITIONAL | {"dropout", "mask_formats", "alibi", "sliding_window",
                                  "packed"},
    "modern-mistral": POSITIONAL | {"dropout", "mask_formats", "alibi", "packed"},
    "modern-sliding-window": {"permutation", "dropout", "mask_formats", "alibi",
                              "position_shift"},
    "modern-alibi": POSITIONAL | {"dropout", "mask_formats", "kv_groups", "sliding_window",
                                  "packed"},
    # No mask: padding and fully_masked don't apply.
    "modern-llama-sdpa": POSITIONAL | {"dropout", "mask_formats", "padding", "fully_masked",
                                       "alibi", "sliding_window", "packed", "position_shift"},
    "modern-varlen": {"permutation", "dropout", "mask_formats", "padding", "fully_masked",
                      "alibi", "sliding_window", "kv_cache", "position_shift"},
}


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, CheckResult]]:
    """Every bundled implementation's verdicts on the CPU (quick profile, both cores)."""
    verdicts: dict[str, dict[str, CheckResult]] = {}
    for result in check_many(list(IMPLEMENTATIONS.items()), devices=["cpu"], jobs=2):
        verdicts.setdefault(result.implementation, {})[result.check] = result
    return verdicts


@pytest.fixture(scope="module")
def matrix(results) -> dict[str, dict[str, Status]]:
    """Raw verdicts: FAILED where the check failed, expected or not."""
    return {name: {check: Status.FAILED if r.status is Status.EXPECTED_FAILURE
                   else Status.PASSED if r.reason.startswith("expected to fail")
                   else r.status for check, r in by_check.items()}
            for name, by_check in results.items()}


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_failures_and_warnings_are_exactly_the_expected_ones(results, matrix, name):
    unexpected = [f"{r.check}: {r.reason}" for r in results[name].values()
                  if r.status is Status.FAILED]
    assert unexpected == []
    failed = {check for check, status in matrix[name].items() if status is Status.FAILED}
    assert failed == set(expected_results().get(name, {}))
    # A warning the suite attributes to the platform's kernels depends on the CPU.
    warned = {check for check, r in results[name].items()
              if r.status is Status.WARNED and not r.reason.startswith(PLATFORM_NOTE)}
    assert warned == set(expected_warnings().get(name, {}))


@pytest.mark.parametrize("name", CORRECT)
def test_correct_implementations_pass_every_check_they_can_take(matrix, name):
    verdicts = matrix[name]
    assert all(status is not Status.FAILED for status in verdicts.values())
    skipped = {check for check, status in verdicts.items() if status is Status.SKIPPED}
    assert skipped == CORRECT[name]


@pytest.mark.parametrize("module", MUTANT_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_mutant_is_caught_by_the_check_it_targets(matrix, module):
    assert module.CATCHES in CHECK_NAMES
    assert matrix[module.IMPLEMENTATION.name][module.CATCHES] is Status.FAILED
    documented = expected_results()[module.IMPLEMENTATION.name]
    assert not documented[module.CATCHES].startswith("follows from the same bug")


def test_the_zoo_is_large_and_documented():
    assert len(MUTANT_MODULES) >= 25
    for module in MUTANT_MODULES:
        for part in ("Bug:", "Symptom:", "Caught by:"):
            assert part in module.__doc__, (module.__name__, part)


def test_every_check_fails_on_some_bundled_implementation(matrix):
    caught = {check for verdicts in matrix.values()
              for check, status in verdicts.items() if status is Status.FAILED}
    assert caught == set(CHECK_NAMES)


def test_every_expected_failure_and_warning_has_a_reason():
    for name, checks in [*expected_results().items(), *expected_warnings().items()]:
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
