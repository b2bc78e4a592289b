"""`check` never hangs in silence: a call that hangs, a constructor that sleeps, a segfault and an
os._exit each end with a FAIL and its evidence, the rest of the run completes, and no process is
left behind (the implementations run isolated, in worker processes the checker can kill)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from worker_support import left_behind

from conformance.frontends.progress_line import ProgressLine
from conformance.model.results import CheckResult, Status

HERE = Path(__file__).parent / "fixtures" / "containment"
USER = Path(__file__).parent / "fixtures" / "user_impls.py"
LIVENESS = 300
"""Seconds after which a run is taken to hang (every limit here is a few seconds)."""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    report = tmp_path_factory.mktemp("containment") / "report.json"
    with left_behind() as left:
        done = subprocess.run(
            [sys.executable, "-m", "conformance", "check",
             "loops_at_one_length.py::LoopsAtSeven", "sleeps_in_init.py::SleepsInInit",
             "segfaults.py::Segfaults", "exits.py::Exits", f"{USER}::plain",
             "--call-timeout", "2", "--jobs", "2", "--check", "gate", "--check", "padding",
             "--check", "permutation", "--json", str(report), "--progress"],
            cwd=HERE, capture_output=True, text=True, timeout=LIVENESS)
    results = {(r["implementation"], r["check"]): r
               for r in json.loads(report.read_text())["results"]}
    return done, results, left


def test_each_misbehaving_module_fails_with_its_evidence(run):
    done, results, _ = run
    assert done.returncode == 1, done.stderr
    loops = results[("loops_at_one_length.py::LoopsAtSeven", "padding")]
    assert loops["status"] == "failed"
    assert loops["reason"] == "the implementation failed: forward did not return within 2 s"
    assert "q_len=7" in loops["counterexample"]  # the case that hung, not a shrunk stand-in
    sleeps = results[("sleeps_in_init.py::SleepsInInit", "gate")]
    assert sleeps["status"] == "failed" and sleeps["reason"].startswith("timeout: ")
    segfaults = results[("segfaults.py::Segfaults", "gate")]
    assert segfaults["status"] == "failed" and "signal 11 (segfault)" in segfaults["reason"]
    exits = results[("exits.py::Exits", "gate")]
    assert exits["status"] == "failed" and "exited with status 0" in exits["reason"]


def test_the_rest_of_the_run_completes(run):
    _, results, _ = run
    assert results[("loops_at_one_length.py::LoopsAtSeven", "gate")]["status"] == "passed"
    for check in ("gate", "padding", "permutation"):
        assert results[("user-plain", check)]["status"] == "passed"


def test_no_process_is_left_behind(run):
    _, _, left = run
    assert left == []


def test_the_progress_line_and_a_final_line_per_implementation(run):
    done, _, _ = run
    assert "user-plain: 3 passed in " in done.stderr
    assert "segfaults.py::Segfaults: 0 passed, 1 failed, 2 skipped in " in done.stderr
    # (the line is redrawn after a carriage return, read here as a newline)
    assert "\x1b[K[" in done.stderr and "implementations checked · " in done.stderr


def test_a_line_per_check_when_not_a_terminal():
    """In a CI log or a pipe, no line rewritten in place, but a line per finished check, so a
    slow run shows it is alive, and one per implementation."""
    class Stream:
        written = ""

        def write(self, text):
            Stream.written += text

        def flush(self):
            pass

        def isatty(self):
            return False

    line = ProgressLine(Stream(), total=2)
    line.check("attention", "padding")
    line.example()
    result = CheckResult("attention", "padding", "cpu", Status.PASSED, seconds=0.25)
    line.checked(result)
    line.finished("attention", [result], 1.0)
    line.close()
    assert "\r" not in Stream.written and "\x1b" not in Stream.written
    assert Stream.written.splitlines() == ["attention · padding: passed (0.2 s)",
                                           "attention: 1 passed in 1.0 s"]


def test_a_hung_call_ends_a_pytest_test_with_the_evidence():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs",
         "conformance", "--attention-impl", "loops_at_one_length.py::LoopsAtSeven",
         "--attention-isolate", "--attention-call-timeout", "2", "-k", "padding or gate"],
        cwd=HERE, capture_output=True, text=True, timeout=LIVENESS)
    assert "1 failed, 1 passed" in done.stdout, done.stdout[-2000:]
    assert "forward did not return within 2 s" in done.stdout
    assert "q_len=7" in done.stdout
