"""The bundled Triton kernel (``conformance/implementations/triton_attention.py``) and its twin,
run on this CPU under Triton's interpreter: proved against a float64 oracle written here, then
checked bare through the command line, as a kernel author would, the twin failing the check
named for its bug. Each runs in a fresh interpreter with ``TRITON_INTERPRET=1`` set from its
start (Triton reads it when ``triton.language`` is imported: a process that imported Triton
before can't switch). Where Triton is not installed these skip, saying so; on a GPU,
``benchmarks/gpu_acceptance.sh`` checks them on CUDA."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conformance.implementations import triton_attention as kernel
from conformance.inference import InferenceError, infer_function

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="Triton is not installed (pip install triton)")

ROOT = Path(__file__).resolve().parent.parent
INTERPRETED = {**os.environ, "TRITON_INTERPRET": "1"}

ORACLE = textwrap.dedent('''
    import json, sys
    import torch
    from conformance.implementations import triton_attention as kernel

    def oracle(q, k, v, causal):
        """softmax(q k^T / sqrt(D)) v in float64, causal bottom-right; no key: 0."""
        q, k, v = (t.double() for t in (q, k, v))
        logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if causal:
            lq, lk = q.shape[-2], k.shape[-2]
            seen = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
            logits = logits.masked_fill(~seen, float("-inf"))
        return (torch.softmax(logits, -1).nan_to_num(0.0)) @ v

    errors = {}
    for q_len, kv_len, causal in json.loads(sys.argv[1]):
        generator = torch.Generator().manual_seed(q_len * 100 + kv_len)
        q, k, v = (torch.randn(2, 3, n, 8, generator=generator).half()
                   for n in (q_len, kv_len, kv_len))
        expected = oracle(q, k, v, causal)
        errors[f"{q_len}-{kv_len}-{causal}"] = [
            float((f(q, k, v, causal=causal).double() - expected).abs().max())
            for f in (kernel.triton_attention, kernel.triton_attention_tail_unmasked)]
    print(json.dumps(errors))
''')

SHAPES = [(5, 5, False), (20, 37, False), (3, 37, True), (33, 33, True), (2, 1, True)]


def test_the_kernel_is_attention_and_its_twin_is_not_past_the_last_full_block():
    done = subprocess.run([sys.executable, "-c", ORACLE, json.dumps(SHAPES)], cwd=ROOT,
                          env=INTERPRETED, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout)
    for q_len, kv_len, causal in SHAPES:
        right, twin = errors[f"{q_len}-{kv_len}-{causal}"]
        assert right < 2e-3
        # The twin is wrong exactly where keys run past the last full block, not causal.
        assert (twin > 0.05) == (kv_len % kernel.BLOCK != 0 and not causal)


def _checked(function: str, checks: list[str]) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "check",
         f"conformance.implementations.triton_attention:{function}", "--no-isolate",
         # No time budget: the interpreter's pace on a busy machine is no verdict on the kernel.
         *(f"--check={c}" for c in checks), "--time-budget=0", "--json", "-"], cwd=ROOT,
        env=INTERPRETED, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    report = json.loads(done.stdout)
    return {r["check"]: r["status"] for r in report["results"]}


def test_checked_bare_it_passes_and_its_twin_fails_reference():
    checks = ["gate", "row_stochastic", "reference", "causal", "kernel"]
    assert _checked("triton_attention", checks) == dict.fromkeys(checks, "passed")
    assert _checked("triton_attention_tail_unmasked", ["reference"]) == {"reference": "failed"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel runs on CUDA")
def test_without_cuda_or_the_interpreter_it_runs_nowhere_here_in_one_line(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernel._kernel.cache_clear()
    with pytest.raises(InferenceError, match="runs nowhere here: on cpu it raises in every dtype"):
        infer_function(kernel.triton_attention)
    assert "TRITON_INTERPRET=1" in kernel.triton_available()
