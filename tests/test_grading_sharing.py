"""A submission's checks shared over the cores a grading run leaves idle
(conformance.grading.run.sharing): the outcome is the one the checks give one after another,
whether they pass, fail, depend on a failed prerequisite or crash the worker."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from conformance.grading.run import sharing
from conformance.grading.run.cores import Cores
from conformance.grading.run.execution import run_submission
from conformance.grading.score.outcome import RunStatus, SubmissionOutcome
from conformance.grading.score.rubric_file import load
from conformance.run.runner import Runner
from tests.verdicts import seen

HEAD = '''
import math
import torch
from torch import nn

print("imported once per worker")


class Attn(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.h, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
'''
SUBMISSIONS = {
    "correct": """
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    """,
    # The mask read the other way and no scaling: padding fails, and the checks that require
    # it run without the mask (charged once), the scale and reference checks fail.
    "inverted-unscaled": """
        s = q @ k.transpose(-1, -2)
        if mask is not None:
            s = s.masked_fill(mask[:, None, None, :], float("-inf"))
    """,
}
TAIL = """
        return self.out_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, -1))
"""
RUBRIC = """
[assignment]
seed = 5
[limits]
check_seconds = 60
submission_seconds = 240
memory_mb = 1024
[[targets]]
class = "Attn"
interface = { call = "self", mask = "keep_bool:key_padding", causal = "never" }
[[targets.items]]
check = "gate"
points = 0
[[targets.items]]
check = "padding"
points = 2
[[targets.items]]
check = "reference"
points = 2
requires = ["padding"]
[[targets.items]]
group = "properties"
checks = ["row_stochastic", "scale", "head_split", "autograd", "batch_independence"]
points = 5
"""


def _outcome(tmp_path: Path, name: str, cores: int, shares: list) -> SubmissionOutcome:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    body = HEAD + textwrap.indent(textwrap.dedent(SUBMISSIONS[name]), "        ")
    (folder / "attention.py").write_text(body + TAIL)
    rubric_path = tmp_path / "rubric.toml"
    rubric_path.write_text(RUBRIC)
    with Cores(cores).held() as held:
        return run_submission(folder, load(rubric_path), sandbox="none", cores=held)


@pytest.fixture
def shares(monkeypatch) -> list:
    """What each shared run gave (a silent fall back to one after another would leave it
    empty)."""
    found: list = []
    original = sharing.run

    def counted(*args, **kwargs):
        shared = original(*args, **kwargs)
        found.append(shared)
        return shared

    monkeypatch.setattr(sharing, "run", counted)
    return found


@pytest.fixture
def dies_in_head_split(monkeypatch) -> None:
    """The worker is killed as ``head_split`` starts, wherever it runs: a crash met by one check
    (after it, the worker is started again: what follows depends on how often it was)."""
    original = Runner.run_check

    def killing(self, subject, name, device, **kwargs):
        if name == "head_split":
            os.kill(subject._worker.pid, signal.SIGKILL)
        return original(self, subject, name, device, **kwargs)

    monkeypatch.setattr(Runner, "run_check", killing)


def _shown(outcome: SubmissionOutcome) -> tuple:
    return (outcome.status, outcome.message,
            [(t.target, t.status, t.message, seen(t.results)) for t in outcome.targets])


@pytest.mark.parametrize("name", list(SUBMISSIONS))
def test_two_cores_give_the_outcome_of_one(tmp_path, shares, name):
    alone = _outcome(tmp_path, name, 1, shares)
    assert shares == [None]  # one core: nothing to lend
    shares.clear()
    shared = _outcome(tmp_path, name, 2, shares)
    assert len(shares) == 1 and shares[0] is not None and shares[0].twins == 1
    assert _shown(shared) == _shown(alone)
    statuses = {r.check: r.status.value for r in alone.targets[0].results}
    if name == "correct":
        assert alone.status is RunStatus.GRADED and set(statuses.values()) == {"passed"}
    elif name == "inverted-unscaled":
        assert statuses["padding"] == statuses["scale"] == "failed"
        reference = alone.targets[0].result("reference")
        assert any("run without mask" in note for note in reference.observations)
    # The twin loaded the submission again: its import-time output is not shown twice.
    assert shared.output.count("imported once per worker") == alone.output.count(
        "imported once per worker")


def test_idle_cores_are_lent_and_come_back():
    cores = Cores(3)
    with cores.held():
        assert cores.idle == 2
        assert cores.borrow(5) == 2 and cores.idle == 0
        assert cores.borrow(1) == 0
        cores.release(2)
        with cores.held():  # another submission starts: one fewer to lend
            assert cores.borrow(5) == 1
            cores.release(1)
    assert cores.idle == 3
    with pytest.raises(ValueError):
        Cores(0)


def test_a_crash_while_shared_runs_the_rest_as_one_after_another(tmp_path, shares,
                                                                  dies_in_head_split):
    alone = _outcome(tmp_path, "correct", 1, shares)
    shares.clear()
    shared = _outcome(tmp_path, "correct", 2, shares)
    assert shares[0].done["head_split"].troubled  # met while shared, then run again
    assert _shown(shared) == _shown(alone)
    assert alone.status is RunStatus.CRASHED and alone.message.startswith("Attn: head_split: ")
    statuses = {r.check: r.status.value for r in alone.targets[0].results}
    assert statuses["head_split"] == "failed"
    assert statuses["batch_independence"] == statuses["autograd"] == "passed"  # restarted
