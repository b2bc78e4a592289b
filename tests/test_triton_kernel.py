"""The bundled Triton kernel (``conformance/implementations/triton_attention.py``) and its twin,
run on this CPU under Triton's interpreter: proved against a float64 oracle written here, then
checked bare, as a kernel author would, the twin failing the check named for its bug. Where
Triton is not installed these skip, saying so; on a GPU, ``benchmarks/gpu_acceptance.sh`` checks
them on CUDA."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conformance import Status, check
from conformance.implementations import triton_attention as kernel
from conformance.inference import InferenceError, infer_function

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed (pip install triton)")


@pytest.fixture
def interpreted(monkeypatch):
    """Triton's interpreter on: kernels run on CPU tensors (decorated afresh)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel._kernel.cache_clear()
    yield
    kernel._kernel.cache_clear()


def oracle(q, k, v, causal):
    """softmax(q k^T / sqrt(D)) v in float64, causal bottom-right; a row with no key gives 0."""
    q, k, v = (t.double() for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        lq, lk = q.shape[-2], k.shape[-2]
        seen = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        logits = logits.masked_fill(~seen, float("-inf"))
    weights = torch.softmax(logits, -1).nan_to_num(0.0)
    return weights @ v


@pytest.mark.parametrize(("q_len", "kv_len", "causal"),
                         [(5, 5, False), (20, 37, False), (3, 37, True), (33, 33, True),
                          (2, 1, True)])
def test_the_kernel_is_attention_and_its_twin_is_not_past_the_last_full_block(
        interpreted, q_len, kv_len, causal):
    generator = torch.Generator().manual_seed(q_len * 100 + kv_len)
    q, k, v = (torch.randn(2, 3, n, 8, generator=generator).half()
               for n in (q_len, kv_len, kv_len))
    expected = oracle(q, k, v, causal)
    assert float((kernel.triton_attention(q, k, v, causal=causal).double() - expected)
                 .abs().max()) < 2e-3
    off = float((kernel.triton_attention_tail_unmasked(q, k, v, causal=causal).double()
                 - expected).abs().max())
    assert (off > 0.05) == (kv_len % kernel.BLOCK != 0 and not causal)


def test_checked_bare_it_passes_and_its_twin_fails_reference(interpreted):
    inferred = infer_function(kernel.triton_attention)
    caps = inferred.implementation.capabilities
    assert caps.dtypes == (torch.float16,) and caps.forward_only
    assert caps.causal == "optional"
    checks = ["gate", "row_stochastic", "reference", "causal", "kernel"]
    results = check(kernel.triton_attention, devices=["cpu"], checks=checks)
    assert {r.check: r.status for r in results} == dict.fromkeys(checks, Status.PASSED)
    (twin,) = check(kernel.triton_attention_tail_unmasked, devices=["cpu"], checks=["reference"])
    assert twin.status is Status.FAILED and "float64 reference" in twin.reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel runs on CUDA")
def test_without_cuda_or_the_interpreter_it_runs_nowhere_here_in_one_line(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernel._kernel.cache_clear()
    with pytest.raises(InferenceError, match="runs nowhere here: on cpu it raises in every dtype"):
        infer_function(kernel.triton_attention)
    assert "TRITON_INTERPRET=1" in kernel.triton_available()
