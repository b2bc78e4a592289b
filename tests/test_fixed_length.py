"""A module that takes one input length (conformance.inference.construction.fixed_length): found by
trial, built small, every case and probe at that length, the checks that need another skip
saying so; and a load that runs out of time says that the time covers the suite's probing."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from torch import nn

from conformance.checks.catalogue import GATE
from conformance.generation.base_case import base_case
from conformance.generation.strategies import cases
from conformance.inference.infer import infer
from conformance.loading.registry import resolve
from conformance.model.remedies import texts
from conformance.model.results import Status
from conformance.model.spec import Capabilities
from conformance.run.isolated import not_loaded
from conformance.run.many import check_many
from conformance.worker.errors import LoadError, WorkerStatus
from tests.fixtures import new_designs as designs


class SixteenTokens(nn.Module):
    """Takes exactly 16 tokens: a learned bias per pair of positions (16 x 16) added to the
    logits of a plain single-head softmax attention; nothing sets the length, the table fixes it
    (any other length fails to broadcast)."""

    def __init__(self, d_model):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(16, 16) / 4)
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + self.bias
        return torch.softmax(logits, dim=-1) @ v


def test_a_window_that_sets_the_length_is_built_small_and_checked_at_it():
    found = infer(designs.WindowAttention)
    caps = found.implementation.capabilities
    assert caps.length == 9 and caps.window is None
    said = " ".join(texts(found.notes))
    assert "window_size=1: 1, window_size=2: 4, window_size=3: 9" in said
    assert "checked at 9 tokens only" in said
    assert "1024" not in said  # never built wider than any sequence
    assert "9 tokens only" in caps.describe()


def test_a_length_nothing_sets_is_found_by_trial_and_checked_there():
    caps = infer(SixteenTokens).implementation.capabilities
    assert caps.length == 16
    results = check_many([("tests.test_fixed_length:SixteenTokens",
                           resolve("tests.test_fixed_length:SixteenTokens")[0])], devices=["cpu"])
    assert not [r for r in results if r.status in (Status.FAILED, Status.SUITE_ERROR)]
    assert sum(r.status is Status.PASSED for r in results) >= 8
    low = next(r for r in results if r.check == "low_precision")
    assert any("16 tokens only" in said for said in low.observations)


def test_a_module_of_any_length_takes_no_fixed_one():
    assert infer(designs.SinkAttention).implementation.capabilities.length is None


@settings(max_examples=20, deadline=None, database=None)
@given(cases(Capabilities(length=9), "cpu", masks="kept", min_len=10, max_len=20),
       cases(Capabilities(), "cpu", max_len=5))
def test_every_case_has_the_one_length_whatever_range_is_asked(fixed, free):
    assert fixed.q_len == fixed.kv_len == 9 and max(fixed.kept) <= 9
    assert free.q_len <= 5


def test_the_gate_case_and_a_preferred_length_give_way_to_it():
    caps = Capabilities(length=9)
    case = base_case(caps, torch.float32, "cpu", q_len=3, kv_len=3, kept=(12, 2))
    assert (case.q_len, case.kv_len, case.kept) == (9, 9, (9, 2))
    assert caps.length_near(512) == 9 and Capabilities(max_len=7).length_near(512) == 7
    assert "9 tokens only" in caps.fixed_length_skip("a prefix")
    assert Capabilities().fixed_length_skip("a prefix") is None


def test_a_load_that_runs_out_of_time_says_what_that_time_covers():
    timed_out = LoadError(WorkerStatus.TIMEOUT, "load did not return within 60 s")
    results = not_loaded("layer", timed_out, ["cpu"], None)
    gate = next(r for r in results if r.check == GATE.name)
    assert gate.status is Status.FAILED  # a constructor that hangs is the layer's
    assert "inferring its interface by probing it: if it is only slow" in gate.reason
    assert all(r.status is Status.SKIPPED for r in results if r.check != GATE.name)
