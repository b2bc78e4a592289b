"""Running submissions in the sandboxed worker: a graded class, and broken or hostile code
ending with the status its behaviour earns (time, crashes, memory, global state), mapped onto
the grader's statuses. The worker's own containment is tested in tests/test_worker*.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from worker_support import FILESYSTEM_SANDBOXES

from conformance.grading.run import execution
from conformance.grading.run.execution import run_submission
from conformance.grading.score.outcome import RunStatus
from conformance.grading.score.rubric_file import load
from conformance.grading.score.scoring import score
from conformance.model.results import Status

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


CORRECT = """
def forward(self, x, mask=None):
    return self.core(x, mask)
"""


@pytest.mark.parametrize("sandbox", ["filesystem", *FILESYSTEM_SANDBOXES])
def test_a_correct_class_is_graded_through_the_worker(tmp_path, sandbox):
    graded_rubric = rubric(tmp_path)
    outcome = run_submission(submission(tmp_path, CORRECT, "print('imported')\n"), graded_rubric,
                             sandbox=sandbox)
    assert outcome.status is RunStatus.GRADED
    (target,) = outcome.targets
    assert [r.check for r in target.results] == ["gate", "padding", "scale"]
    assert all(r.status is Status.PASSED for r in target.results)
    assert "mask: bool mask, True = attend, shape (B, Lk) (declared)" in target.interface
    assert "imported" in outcome.output                      # captured, not on our terminal
    assert outcome.isolation == "worker" and "own session" in outcome.protections
    assert outcome.sandbox in ("bwrap", "landlock") and sandbox in ("filesystem", outcome.sandbox)
    assert outcome.output == "imported\n"  # nothing else: the sandbox refused torch nothing
    assert score(graded_rubric, outcome).total == 3


def test_global_monkey_patching_stays_in_the_submissions_process(tmp_path):
    import torch

    graded_rubric = rubric(tmp_path)
    patched = run_submission(submission(tmp_path, CORRECT,
                                        "torch.allclose = lambda *a, **k: True\n"
                                        "torch.Tensor.__sub__ = lambda a, b: a * 0\n"),
                             graded_rubric)
    # Its own arithmetic is unaffected by patching functions it doesn't call; the checker's
    # comparisons are the checker's: the verdicts are those of the numbers it returns.
    assert patched.status is RunStatus.GRADED
    assert torch.allclose(torch.zeros(2), torch.ones(2)) is False
    assert (torch.ones(2) - torch.ones(2)).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("forward,tail,status,message", [
    ("""
     def forward(self, x, mask=None):
         import os
         os._exit(3)
     """, "", RunStatus.CRASHED, "exit"),
    ("""
     def forward(self, x, mask=None):
         return self.core(x, mask) + torch.ones(2**31)[0]  # 8 GiB
     """, "", RunStatus.OUT_OF_MEMORY, ""),
    (CORRECT, "import sys\nsys.exit(4)\n", RunStatus.CRASHED, "sys.exit(4)"),
    (CORRECT, "import natten\n", RunStatus.MISSING_PACKAGE,
     "needs package 'natten', which is not installed here"),
    (CORRECT, "import not_a_module_anyone_has\n", RunStatus.IMPORT_ERROR,
     "not_a_module_anyone_has.py not submitted"),
    (CORRECT, "raise ImportError('cannot import name X')\n", RunStatus.IMPORT_ERROR,
     "ImportError: cannot import name X"),
])
def test_broken_submissions_end_with_a_status(tmp_path, forward, tail, status, message):
    outcome = run_submission(submission(tmp_path, forward, tail), rubric(tmp_path))
    assert outcome.status is status, outcome.to_dict()
    assert message in outcome.message


def test_a_forward_that_never_returns_is_stopped_by_the_check_limit(tmp_path):
    looping = """
    calls = 0
    def forward(self, x, mask=None):
        type(self).calls += 1
        # After inference and the gate: ~30 configurations probed, the declared features
        # tried, float64's precision measured (rounding noise, the gap to the reference):
        # 90 to 110 calls in all.
        if type(self).calls > 160:
            while True:
                pass
        return self.core(x, mask)
    """
    outcome = run_submission(submission(tmp_path, looping), rubric(tmp_path, check=2))
    (target,) = outcome.targets
    assert outcome.status is RunStatus.TIMEOUT
    assert target.results[0].status is Status.PASSED          # what finished is kept
    assert any(r.status is Status.FAILED and "timeout" in r.reason for r in target.results)
    assert outcome.seconds < 30


def test_a_forward_that_never_returns_without_a_mask_is_named_while_loading(tmp_path):
    """A loop where the mask is None: the load stops, saying which call never returned."""
    looping = """
    def forward(self, x, mask=None):
        while mask is None:
            pass
        return self.core(x, mask)
    """
    outcome = run_submission(submission(tmp_path, looping), rubric(tmp_path, check=2))
    assert outcome.status is RunStatus.TIMEOUT
    assert "the forward with no mask, batch 2, " in outcome.message, outcome.message
    assert "never returned" in outcome.message


def test_a_missing_class_or_a_syntax_error_never_starts_a_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(execution, "IsolatedSubject",
                        lambda *a, **k: pytest.fail("started a worker"))
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "attention.py").write_text("class Atn:\n    pass\n")
    outcome = run_submission(folder, rubric(tmp_path))
    assert outcome.status is RunStatus.NOT_FOUND and outcome.targets[0].near_misses == ["Atn"]
    (folder / "attention.py").write_text("class Attn(:\n")
    outcome = run_submission(folder, rubric(tmp_path))
    assert outcome.status is RunStatus.SYNTAX_ERROR


def test_a_class_found_in_the_source_but_not_after_import_gets_the_workers_near_misses(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "attention.py").write_text("class Atn:\n    pass\n\n\nAttn = None\n"
                                         "print('printed while loading')\n")
    outcome = run_submission(folder, rubric(tmp_path))
    assert outcome.status in (RunStatus.NOT_FOUND, RunStatus.INTERFACE_MISMATCH)
    assert "printed while loading" in outcome.output


def _interface_rubric(tmp_path: Path, extra: str, mask: str = "keep_bool:key_padding"):
    path = tmp_path / "interface.toml"
    path.write_text(RUBRIC.format(check=20, submission=120).replace(
        'interface = { call = "self", mask = "keep_bool:key_padding", causal = "never" }',
        f'interface = {{ call = "self", mask = "{mask}", causal = "never", width-arg = "d_model", '
        f'heads-arg = "num_heads", {extra} }}'))
    return load(path)


RETURNS_A_TUPLE = """
def forward(self, x, mask=None):
    return self.core(x, mask), None
"""

RETURNS_A_SUBCLASS = """
def forward(self, x, mask=None):
    return self.core(x, mask).as_subclass(Marked)
"""


@pytest.mark.parametrize("forward,tail,evidence", [
    (RETURNS_A_TUPLE, "", "forward returned tuple, not a tensor"),
    (RETURNS_A_SUBCLASS, "class Marked(torch.Tensor):\n    pass\n",
     "forward returned Marked (a subclass of torch.Tensor), not a plain tensor"),
])
def test_a_declared_one_tensor_return_broken_is_an_interface_mismatch_worth_zero(
        tmp_path, forward, tail, evidence):
    graded_rubric = _interface_rubric(tmp_path, 'returns = "tensor"')
    outcome = run_submission(submission(tmp_path, forward, tail), graded_rubric)
    (target,) = outcome.targets
    assert outcome.status is RunStatus.INTERFACE_MISMATCH, outcome.to_dict()
    assert target.message.startswith("forward must return one tensor, nothing else")
    assert evidence in target.message
    assert [r.check for r in target.results] == ["gate"]     # nothing else ran
    assert score(graded_rubric, outcome).total == 0
    # Without the condition the tuple's first element is the output: full marks.
    lenient = run_submission(submission(tmp_path, RETURNS_A_TUPLE), rubric(tmp_path))
    assert lenient.status is RunStatus.GRADED and score(rubric(tmp_path), lenient).total == 3


KEYWORD_ONLY = '''
import math
import torch
from torch import nn


class Attn(nn.Module):
    def __init__(self, *, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.h, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        return self.out_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(b, n, -1))
'''


def test_the_constructor_must_work_in_every_listed_form(tmp_path):
    both = _interface_rubric(tmp_path, 'constructor = ["positional", "keyword"]')
    assert both.targets[0].constructor_forms == ("positional", "keyword")
    outcome = run_submission(submission(tmp_path, CORRECT), both)
    assert outcome.status is RunStatus.GRADED and score(both, outcome).total == 3
    assert any("constructed positionally: Attn(d_model, num_heads)" in note
               for note in outcome.targets[0].interface)

    folder = tmp_path / "keyword_only"
    folder.mkdir()
    (folder / "attention.py").write_text(KEYWORD_ONLY)
    keyword_first = _interface_rubric(tmp_path, 'constructor = ["keyword", "positional"]')
    outcome = run_submission(folder, keyword_first)
    (target,) = outcome.targets
    assert outcome.status is RunStatus.INTERFACE_MISMATCH, outcome.to_dict()
    assert target.message.startswith(
        "the constructor must also work with positional arguments (Attn):")
    assert "takes 1 positional argument" in target.message
    assert target.results == [] and score(keyword_first, outcome).total == 0
    keyword = _interface_rubric(tmp_path, 'constructor = "keyword"')
    assert run_submission(folder, keyword).status is RunStatus.GRADED


def test_an_int32_mask_is_a_format_a_rubric_can_prescribe(tmp_path):
    graded_rubric = _interface_rubric(tmp_path, 'mask-formats = ["keep_int32:key_padding"]',
                                      mask="keep_int32:key_padding")
    folder = tmp_path / "int32"
    folder.mkdir()
    (folder / "attention.py").write_text(KEYWORD_ONLY.replace("*, ", ""))
    outcome = run_submission(folder, graded_rubric)
    assert outcome.status is RunStatus.GRADED
    assert "mask: int32 mask, 0 = masked, shape (B, Lk) (declared)" in outcome.targets[0].interface
    assert score(graded_rubric, outcome).total == 3
    # `~mask` on an int32 mask is a bitwise not, not a logical one: the padding check fails.
    outcome = run_submission(submission(tmp_path, CORRECT), graded_rubric)
    assert outcome.targets[0].result("padding").status is not Status.PASSED


def test_a_class_graded_in_threads_parses_one_source_at_a_time():
    """CPython 3.11's parser shares its recursion depth between threads: while a class is
    graded in threads, ast.parse takes a lock (re-entrant), and is itself again after."""
    import ast
    import threading

    from conformance.grading.run.parsing import _LOCK, one_parse_at_a_time

    original = ast.parse
    inside = []
    with one_parse_at_a_time():
        assert ast.parse is not original
        assert isinstance(ast.parse("x = 1"), ast.Module)
        with _LOCK:  # another thread's parse waits while this one holds the parser
            worker = threading.Thread(target=lambda: inside.append(ast.parse("y = 2")))
            worker.start()
            worker.join(timeout=0.2)
            assert worker.is_alive() and not inside
        worker.join()
        assert inside
    assert ast.parse is original
