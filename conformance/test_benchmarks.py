"""pytest-benchmark fixtures for attention implementations, beside SDPA in the same group.

Run with ``pytest --pyargs conformance --attention-impl IMPL --attention-bench --benchmark-only``
(``--attention-bench-lengths 128,512``, ``--attention-bench-dtype``, ``--benchmark-json``,
``--benchmark-compare`` as usual). Without ``--attention-bench`` or ``--benchmark-only`` these
are skipped: benchmarks never run in a default test run.
"""

from __future__ import annotations


def test_forward(attention_bench_case, benchmark):
    """Forward in eval mode under no_grad."""
    instance, inputs, _ = attention_bench_case.prepare()
    benchmark.group = attention_bench_case.group("forward")
    output = benchmark(instance.forward, inputs)
    assert output.shape[:2] == inputs.query.shape[:2]


def test_forward_backward(attention_bench_case, benchmark):
    """Forward and backward of sum(output * cotangent) with respect to inputs and parameters."""
    instance, inputs, cotangent = attention_bench_case.prepare()
    benchmark.group = attention_bench_case.group("forward+backward")
    gradients = benchmark(instance.gradients, inputs, cotangent)
    assert gradients.output.shape == cotangent.shape
