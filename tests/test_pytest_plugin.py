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
    assert "falsifying example (hypothesis-shrunk): Case(" in done.stdout


def test_bad_impl_is_a_usage_error():
    done = pytest_run("--attention-impl", "no-such-impl")
    assert done.returncode == 4
    assert "no implementation named 'no-such-impl'" in done.stderr


def test_profiles_hold_under_ci_and_foreign_hypothesis_profiles():
    code = ("import conformance.profiles as p; s = p.PROFILES['quick']; "
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
    the catalogue): its overhead is the plugin module itself (benchmarks/plugin_overhead.py)."""
    (tmp_path / "test_unrelated.py").write_text("def test_sum():\n    assert 1 + 1 == 2\n")
    (tmp_path / "conftest.py").write_text(
        "import sys\n\n\n"
        "def pytest_sessionfinish(session):\n"
        "    loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('conformance'))\n"
        "    print('LOADED', loaded, 'hypothesis.core' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The plugin was loaded (pytest11), and nothing else of the suite, nor torch.
    assert "LOADED ['conformance', 'conformance._version', 'conformance.pytest_plugin'] False" \
        in done.stdout


def test_the_plugins_profile_names_are_the_suites():
    from conformance import profiles, pytest_plugin

    assert pytest_plugin.PROFILE_NAMES == profiles.PROFILE_NAMES
