"""The tiers: ``make test`` runs the whole-catalogue proofs on a sample that keeps every form of
the bundled catalogue (``tests/sample.py``), ``make test-all`` on every implementation."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from conformance.implementations import bundled
from tests.conftest import MOVED_TO_SLOW
from tests.sample import bundled_sample, forms, sample

ROOT = Path(__file__).resolve().parent.parent


def test_the_sample_keeps_every_form_of_the_catalogue_and_is_a_sample():
    catalogue = bundled()
    chosen = [impl for impl in catalogue if impl.name in bundled_sample()]
    assert set().union(*map(forms, chosen)) == set().union(*map(forms, catalogue))
    assert len(chosen) <= len(catalogue) // 2
    kinds = {kind for impl in catalogue for kind, _ in forms(impl)}
    assert kinds == {"family", "call", "declares", "caught by", "warned by"}


def _factory(config):  # a family of its own: this module
    raise NotImplementedError


def test_a_new_form_is_sampled_the_day_it_is_bundled():
    catalogue = bundled()
    newcomer = replace(catalogue[0], name="newcomer", factory=_factory)
    assert ("family", __name__) in forms(newcomer)
    assert "newcomer" in sample([*catalogue, newcomer])
    assert "newcomer" not in sample([*catalogue, replace(catalogue[0], name="newcomer")])


def test_every_test_moved_to_the_slow_tier_is_one_of_its_files():
    for (file, name), why in MOVED_TO_SLOW.items():
        source = (ROOT / "tests" / f"{file}.py").read_text()
        assert f"def {name.split('[')[0]}(" in source, (file, name)
        assert why


def _collected(marks: str, path: str) -> set[str]:
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marks,
                             path], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line.split("[", 1)[1].rstrip("]") for line in listed.splitlines() if "[" in line}


def test_make_test_runs_the_matrix_on_the_sample_and_make_test_all_on_every_one():
    matrix = "tests/test_expected_results.py::test_failures_and_warnings_are_exactly_the_expected_ones"
    assert _collected("not slow", matrix) == set(bundled_sample())
    assert _collected("", matrix) == {impl.name for impl in bundled()}
