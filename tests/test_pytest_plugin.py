"""The pytest plugin: the catalogue as tests, readable ids, xfails, skips, stable profiles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider",
         "-rA", *args],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})})


def test_catalogue_runs_as_parametrized_tests_with_readable_ids():
    done = pytest_run("-v", "--attention-impl", "seed002-MultiHeadAttention",
                      "--attention-impl", "seed004-MultiHeadAttention",
                      "-k", "gate or contract or padding")
    out = done.stdout
    assert done.returncode == 0, out
    assert "attention-conformance: implementations under test: seed002-MultiHeadAttention, " \
           "seed004-MultiHeadAttention" in out
    assert "PASSED conformance/test_conformance.py::test_padding[seed002-MultiHeadAttention]" in out
    assert "XFAIL conformance/test_conformance.py::test_contract[seed004-MultiHeadAttention]" in out
    assert "test_padding[seed002-MultiHeadAttention-cuda] SKIPPED" in out  # absent: clean skip
    assert "cuda is not available on this machine" in out


def test_a_failure_explains_itself():
    done = pytest_run("--attention-impl", "tests/fixtures/user_impls.py::wrong_scale",
                      "-k", "head_split")
    assert done.returncode == 1
    assert "FAILED conformance/test_conformance.py::test_head_split[user-wrong-scale]" in done.stdout
    assert "Falsifying example: head_split(\n      case=Case(" in done.stdout


def _replay_line(stdout: str) -> str:
    # One command, though it may be printed twice: under CI pytest's short summary repeats the
    # whole failure message untruncated.
    (line,) = {line for line in stdout.splitlines() if line.startswith("  replay it: pytest ")}
    return line.removeprefix("  replay it: ")


def test_a_falsifying_example_replays_from_its_one_line():
    """The failure prints the shrunk case as hypothesis prints a falsifying example, and one line
    that runs that test again on exactly that case."""
    done = pytest_run("--attention-impl", "tests/fixtures/user_impls.py::wrong_scale",
                      "-k", "test_padding")
    assert done.returncode == 1
    command = _replay_line(done.stdout)
    # (the id quoted: a shell would read its brackets as a pattern)
    assert command.startswith("pytest 'conformance/test_conformance.py::test_padding[user-wrong-"
                              "scale]' --attention-impl tests/fixtures/user_impls.py::wrong_scale "
                              '--attention-replay "Case(')
    import shlex

    args = shlex.split(command)[1:]
    again = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                           capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 1 and "1 failed" in again.stdout
    assert "replaying Case(" in again.stdout                  # the header says so
    reason = [line for line in done.stdout.splitlines() if "masked positions changed" in line]
    assert reason and reason[0] in again.stdout               # the same failure, the same numbers


def test_bad_impl_is_a_usage_error():
    done = pytest_run("--attention-impl", "no-such-impl")
    assert done.returncode == 4
    assert "no implementation named 'no-such-impl'" in done.stderr


def test_profiles_hold_under_ci_and_foreign_hypothesis_profiles():
    code = ("import conformance.generation.profiles as p; s = p.PROFILES['quick']; "
            "print(s.max_examples, s.derandomize, s.database)")
    for env in ({"CI": "true"}, {}):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, **env}, check=True).stdout.split()
        assert out == ["25", "True", "None"]
    done = pytest_run("--attention-impl", "seed000-MultiHeadAttention", "-k", "padding",
                      "--hypothesis-profile", "ci", env={"CI": "true"})
    assert done.returncode == 0
    assert "profile quick" in done.stdout
    done = pytest_run("--attention-impl", "seed000-MultiHeadAttention", "-k", "gate",
                      "--hypothesis-profile", "attention-conformance-thorough")
    assert "profile thorough" in done.stdout


def test_the_plugin_costs_nothing_until_used(tmp_path):
    """An unrelated test run in an environment where the suite is installed imports neither
    torch, nor hypothesis' engine, nor the suite (the plugin's hooks load only for a run about
    the catalogue): its overhead is the plugin module itself and its options' table (standard
    library only: ``frontends/run_flags``; benchmarks/plugin_overhead.py)."""
    (tmp_path / "test_unrelated.py").write_text("def test_sum():\n    assert 1 + 1 == 2\n")
    (tmp_path / "conftest.py").write_text(
        "import sys\n\n\n"
        "def pytest_sessionfinish(session):\n"
        "    loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('conformance'))\n"
        "    print('LOADED', loaded, 'hypothesis.core' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The plugin was loaded (pytest11) with its options' table, and nothing else of the suite,
    # nor torch.
    loaded = ("LOADED ['conformance', 'conformance._version', 'conformance.frontends', "
              "'conformance.frontends.pytest_options', 'conformance.frontends.pytest_plugin', "
              "'conformance.frontends.run_flags'] False")
    assert loaded in done.stdout


def test_the_plugins_profile_names_are_the_suites():
    from conformance.frontends import pytest_options
    from conformance.generation import profiles

    assert pytest_options.PROFILE_NAMES == profiles.PROFILE_NAMES


def test_hypothesis_options_reach_the_suites_searches(tmp_path):
    """--hypothesis-show-statistics, --hypothesis-verbosity, --hypothesis-seed and a profile the
    user registered all act on the searches the checks run inside their tests."""
    stats = pytest_run("--attention-impl", "seed002-MultiHeadAttention", "-k", "test_padding",
                       "--hypothesis-show-statistics")
    section = stats.stdout.split("Hypothesis Statistics")[1]
    assert "test_padding[seed002-MultiHeadAttention]" in section
    assert "passing" in section and "during generate phase" in section
    verbose = pytest_run("--attention-impl", "tests/fixtures/user_impls.py::wrong_scale", "-k",
                         "test_scale", "--hypothesis-verbosity", "verbose", "-s")
    assert "Test case: property_holds(" in verbose.stdout   # each example, as hypothesis says it
    seeded = pytest_run("--attention-impl", "seed002-MultiHeadAttention", "-k", "test_gate",
                        "--hypothesis-seed", "7")
    assert "attention-conformance: profile quick; seed 7;" in seeded.stdout
    (tmp_path / "conftest.py").write_text(
        "from hypothesis import settings\n"
        "settings.register_profile('tiny', max_examples=3)\n")
    tiny = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--attention-impl",
         "seed002-MultiHeadAttention", "-k", "test_padding", "--hypothesis-profile", "tiny",
         "--hypothesis-show-statistics", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path)
    assert "attention-conformance: profile hypothesis:tiny" in tiny.stdout, tiny.stdout[-2000:]
    assert "3 passing" in tiny.stdout.split("Hypothesis Statistics")[1]
