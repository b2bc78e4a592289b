"""How fast each bundled implementation is: forward (eval, no grad) and forward + backward.

Run with ``make bench``. ``make test`` runs each benchmark once with timing disabled, so the
fixtures can't rot. Shape: batch 4, length 32, d_model 64, 4 heads (single-head modules: one
head of 64), float32.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conformance.adapter import ImplementationError, InProcessSubject
from conformance.cases import Case
from implementations import bundled

CASE = Case(batch=4, q_len=32, kv_len=32, num_heads=4, head_dim=16, seed=0)
# Seeds, references and the textbook controls; mutants are subjects for the checks, not for speed.
IMPLEMENTATIONS = [impl for impl in bundled() if not impl.name.startswith("mutant-")]


def _ready(impl):
    case = CASE if impl.capabilities.heads is None else replace(
        CASE, num_heads=impl.capabilities.heads, head_dim=CASE.d_model // impl.capabilities.heads)
    instance = InProcessSubject(impl).instantiate(case.config, case.seed)
    inputs = case.inputs(impl.capabilities.call)
    try:
        instance.forward(inputs)
    except ImplementationError as error:
        pytest.skip(f"{impl.name} does not run at the benchmark shape: {error}")
    return instance, inputs


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl.name)
def test_forward(benchmark, impl):
    instance, inputs = _ready(impl)
    output = benchmark(instance.forward, inputs)
    assert output.shape == (CASE.batch, CASE.q_len, CASE.d_model)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda impl: impl.name)
def test_forward_backward(benchmark, impl):
    instance, inputs = _ready(impl)
    cotangent = torch.ones(CASE.batch, CASE.q_len, CASE.d_model)
    gradients = benchmark(instance.gradients, inputs, cotangent)
    assert all(torch.isfinite(g).all() for g in gradients.inputs.values())
