"""Running submissions: the worker contract (with a fake worker), and the temporary trusted
path's containment of broken and hostile code (time, crashes, memory, global state)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conformance.grading import execution
from conformance.grading.execution import Isolation, WorkerUnavailable, run_submission
from conformance.grading.outcome import RunStatus
from conformance.grading.rubric import load
from conformance.grading.scoring import score
from conformance.results import Status
from tests.fixtures import fake_worker

ATTENTION = '''
import math
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    def core(self, x, mask=None):
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.h, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
        return self.out_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, -1))
'''

RUBRIC = """
[assignment]
seed = 3
[limits]
check_seconds = {check}
submission_seconds = {submission}
memory_mb = 1024
[[targets]]
class = "Attn"
interface = {{ call = "self", mask = "keep_bool:key_padding", causal = "never" }}
[[targets.items]]
check = "gate"
points = 0
[[targets.items]]
check = "padding"
points = 2
[[targets.items]]
check = "scale"
points = 1
"""


def submission(tmp_path: Path, forward: str, module_tail: str = "") -> Path:
    folder = tmp_path / "submission"
    folder.mkdir(exist_ok=True)
    body = ATTENTION + textwrap.indent(textwrap.dedent(forward), "    ") + textwrap.dedent(module_tail)
    (folder / "attention.py").write_text(body)
    return folder


def rubric(tmp_path: Path, check: float = 20, submission_seconds: float = 60):
    path = tmp_path / "rubric.toml"
    path.write_text(RUBRIC.format(check=check, submission=submission_seconds))
    return load(path)


def trusted(folder: Path, graded_rubric):
    return run_submission(folder, graded_rubric, isolation=Isolation.TRUSTED_UNSANDBOXED)


CORRECT = """
def forward(self, x, mask=None):
    return self.core(x, mask)
"""


def test_the_trusted_path_grades_a_correct_class_in_its_own_process(tmp_path):
    graded_rubric = rubric(tmp_path)
    outcome = trusted(submission(tmp_path, CORRECT, "print('imported')\n"), graded_rubric)
    assert outcome.status is RunStatus.GRADED
    (target,) = outcome.targets
    assert [r.check for r in target.results] == ["gate", "padding", "scale"]
    assert all(r.status is Status.PASSED for r in target.results)
    assert "mask: bool mask, True = attend, shape (B, Lk) (declared)" in target.interface
    assert outcome.output == "imported\n"                    # captured, not on our terminal
    assert outcome.isolation == "trusted-unsandboxed" and "NO SANDBOX" in outcome.protections
    assert score(graded_rubric, outcome).total == 3


def test_global_monkey_patching_stays_in_the_submissions_process(tmp_path):
    import torch

    graded_rubric = rubric(tmp_path)
    hostile = trusted(submission(tmp_path, CORRECT, "torch.softmax = lambda *a, **k: 0\n"),
                      graded_rubric)
    assert hostile.targets[0].results[0].status is Status.FAILED   # it broke only itself
    assert torch.softmax(torch.zeros(2), -1).tolist() == [0.5, 0.5]
    assert trusted(submission(tmp_path, CORRECT), graded_rubric).status is RunStatus.GRADED


@pytest.mark.parametrize("forward,tail,status,message", [
    ("""
     def forward(self, x, mask=None):
         import os
         os._exit(3)
     """, "", RunStatus.CRASHED, "exited (status 3)"),
    ("""
     def forward(self, x, mask=None):
         return self.core(x, mask) + torch.ones(2**31)[0]  # 8 GiB
     """, "", RunStatus.OUT_OF_MEMORY, "can't allocate memory"),
    (CORRECT, "import sys\nsys.exit(4)\n", RunStatus.IMPORT_ERROR, "called sys.exit(4)"),
    (CORRECT, "import not_a_module_anyone_has\n", RunStatus.IMPORT_ERROR,
     "ModuleNotFoundError: No module named 'not_a_module_anyone_has' (attention.py:"),
    ("""
     def forward(self, x, mask=None):
         raise SystemExit(0)
     """, "", RunStatus.CRASHED, "the submission raised SystemExit(0)"),
])
def test_broken_submissions_end_with_a_status(tmp_path, forward, tail, status, message):
    outcome = trusted(submission(tmp_path, forward, tail), rubric(tmp_path))
    assert outcome.status is status, outcome.to_dict()
    assert message in outcome.message


def test_a_forward_that_never_returns_is_stopped_by_the_check_limit(tmp_path):
    looping = """
    calls = 0
    def forward(self, x, mask=None):
        type(self).calls += 1
        if type(self).calls > 40:  # after inference and the gate
            while True:
                pass
        return self.core(x, mask)
    """
    outcome = trusted(submission(tmp_path, looping), rubric(tmp_path, check=2))
    (target,) = outcome.targets
    assert outcome.status is RunStatus.TIMEOUT
    assert target.results[0].status is Status.PASSED          # what finished is kept
    assert any("per-check limit of 2 s" in r.reason for r in target.results)


def test_ignoring_the_alarm_still_ends_at_the_submission_limit(tmp_path):
    stubborn = """
    def forward(self, x, mask=None):
        import signal
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        while True:
            pass
    """
    outcome = trusted(submission(tmp_path, stubborn), rubric(tmp_path, check=1, submission_seconds=4))
    assert outcome.status is RunStatus.TIMEOUT
    assert "submission time limit of 4 s" in outcome.message
    assert outcome.seconds < 15


def test_a_missing_class_or_a_syntax_error_never_starts_a_process(tmp_path, monkeypatch):
    monkeypatch.setattr(execution, "_supervise", lambda *a: pytest.fail("ran a process"))
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "attention.py").write_text("class Atn:\n    pass\n")
    outcome = run_submission(folder, rubric(tmp_path), isolation=Isolation.TRUSTED_UNSANDBOXED)
    assert outcome.status is RunStatus.NOT_FOUND and outcome.targets[0].near_misses == ["Atn"]
    (folder / "attention.py").write_text("class Attn(:\n")
    outcome = run_submission(folder, rubric(tmp_path), isolation=Isolation.TRUSTED_UNSANDBOXED)
    assert outcome.status is RunStatus.SYNTAX_ERROR


# --------------------------------------------------------------------------------------------
# The production path, against a fake worker with the expected contract.


def test_the_worker_path_runs_the_checks_through_the_workers_subject(tmp_path):
    graded_rubric = rubric(tmp_path)
    folder = submission(tmp_path, CORRECT)
    fake_worker.opened.clear()
    outcome = run_submission(folder, graded_rubric, api=fake_worker)
    assert outcome.status is RunStatus.GRADED and outcome.isolation == "worker"
    assert [r.status for r in outcome.targets[0].results] == [Status.PASSED] * 3
    assert outcome.protections == ["fake worker: in-process, for tests"]
    ((directory, limits),) = fake_worker.opened
    assert directory == folder and limits.request_seconds == 20 and limits.submission_seconds == 60
    assert limits.memory_bytes == 1024 * 2**20


def test_the_worker_path_maps_load_errors_and_failures_to_statuses(tmp_path, monkeypatch):
    graded_rubric = rubric(tmp_path)
    folder = submission(tmp_path, CORRECT)

    def refuse(self, spec, **kwargs):
        raise fake_worker.WorkerError("import error", "importing attention.py raised OSError")

    monkeypatch.setattr(fake_worker.FakeWorker, "load", refuse)
    outcome = run_submission(folder, graded_rubric, api=fake_worker)
    assert outcome.status is RunStatus.IMPORT_ERROR and "OSError" in outcome.message
    monkeypatch.undo()

    # A request past its limit: the worker says so after the check; a fatal one stops the rest.
    class Timing(fake_worker.FakeWorker):
        checks = 0

        @property
        def failure(self):
            return (fake_worker.WorkerError("timeout", "padding: over 20 s", fatal=True)
                    if Timing.checks >= 2 else None)

        @failure.setter
        def failure(self, value):
            pass

    from conformance.catalogue import Runner

    original = Runner.run_check

    def counting(self, subject, name, device):
        Timing.checks += 1
        return original(self, subject, name, device)

    monkeypatch.setattr(Runner, "run_check", counting)
    monkeypatch.setattr(fake_worker, "FakeWorker", Timing)
    outcome = run_submission(folder, graded_rubric, api=fake_worker)
    (target,) = outcome.targets
    assert outcome.status is RunStatus.TIMEOUT
    assert [r.check for r in target.results] == ["gate", "padding"]
    assert target.results[1].status is Status.FAILED and "over 20 s" in target.results[1].reason


def test_without_the_worker_student_code_is_not_run(tmp_path, monkeypatch):
    import importlib

    real = importlib.import_module

    def no_worker(name, *args):
        if name == "conformance.worker":
            raise ModuleNotFoundError("No module named 'conformance.worker'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_worker)
    with pytest.raises(WorkerUnavailable, match="only ever run inside it"):
        run_submission(submission(tmp_path, CORRECT), rubric(tmp_path))


def test_the_worker_branchs_isolated_subject_api_is_adapted(tmp_path, monkeypatch):
    """conformance.worker as built on the worker branch (IsolatedSubject per target) is used
    through execution.IsolatedSubjectAPI: limits, closing, statuses, near misses, failures."""
    import importlib

    from conformance.catalogue import Runner
    from tests.fixtures import fake_isolated_worker as fake

    real = importlib.import_module
    monkeypatch.setattr(importlib, "import_module",
                        lambda name, *a: fake if name == "conformance.worker" else real(name, *a))
    assert isinstance(execution.worker_api(), execution.IsolatedSubjectAPI)
    graded_rubric = rubric(tmp_path)
    outcome = run_submission(submission(tmp_path, CORRECT), graded_rubric)
    assert outcome.status is RunStatus.GRADED and outcome.protections == ["fake isolated subject"]
    assert [r.status for r in outcome.targets[0].results] == [Status.PASSED] * 3
    subject = fake.created[-1]
    assert subject.closed
    assert subject.limits == fake.Limits(request_seconds=20, load_seconds=20, lifetime_seconds=60,
                                         memory_bytes=1024 * 2**20)

    # Found in the source, not loadable: the worker's names give the near miss.
    other = tmp_path / "other"
    other.mkdir()
    (other / "attention.py").write_text("class Atn:\n    pass\n\n\nAttn = None\n")
    outcome = run_submission(other, graded_rubric)
    assert outcome.status is RunStatus.NOT_FOUND and outcome.targets[0].near_misses == ["Atn"]
    assert "printed while loading" in outcome.output

    # A fatal failure in a check: that check fails with it; the next ones run on a new worker,
    # unless the worker won't be restarted any more.
    original = Runner.run_check
    inject = {"status": fake.WorkerStatus.TIMEOUT}

    def failing(self, subject, name, device):
        result = original(self, subject, name, device)
        if name == "padding":
            subject.failures.append((name, fake.WorkerError(inject["status"], "padding: over 20 s")))
        return result

    monkeypatch.setattr(Runner, "run_check", failing)
    outcome = run_submission(submission(tmp_path, CORRECT), graded_rubric)
    (target,) = outcome.targets
    assert outcome.status is RunStatus.TIMEOUT and [r.check for r in target.results] == [
        "gate", "padding", "scale"]
    assert target.results[1].status is Status.FAILED and target.results[2].status is Status.PASSED
    inject["status"] = fake.WorkerStatus.RESTART_LIMIT
    outcome = run_submission(submission(tmp_path, CORRECT), graded_rubric)
    assert outcome.status is RunStatus.CRASHED
    assert [r.check for r in outcome.targets[0].results] == ["gate", "padding"]
