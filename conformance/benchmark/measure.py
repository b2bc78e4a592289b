"""Measuring one piece of work: time (interleaved with the baseline), FLOPs, peak memory."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from conformance.model.spec import Config

WARMUP = 2
"""Untimed calls of each workload before the timed rounds."""

BACKWARD_FACTOR = 2.5
"""Backward costs about 2.5 x the forward (two matmuls per forward one, plus the softmax)."""


def attention_flops(config: Config, *, backward: bool, causal: bool = False) -> float:
    """Floating-point operations of one call.

    Forward: the attention core 4 * B * H * Lq * Lk * Dh (q @ k^T and weights @ v, a multiply and
    an add each; half of it causal, the work a causal kernel need do, as FlashAttention's own
    benchmarks count) plus the four projections 2 * B * L * d_model^2 each (q and the output over
    Lq, k and v over Lk). Forward + backward: (1 + 2.5) x the forward.
    """
    b, lq, lk, d = config.batch, config.q_len, config.kv_len, config.d_model
    core = 4 * b * config.num_heads * lq * lk * config.head_dim / (2 if causal else 1)
    projections = 2 * b * (2 * lq + 2 * lk) * d * d
    forward = core + projections
    return forward * (1 + BACKWARD_FACTOR) if backward else forward


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and quartiles over ``rounds`` timed calls."""

    median: float
    q1: float
    q3: float
    rounds: int

    @classmethod
    def of(cls, seconds: list[float]) -> Timing:
        if len(seconds) < 2:
            return cls(seconds[0], seconds[0], seconds[0], len(seconds))
        q1, _, q3 = statistics.quantiles(seconds, n=4)
        return cls(statistics.median(seconds), q1, q3, len(seconds))


def time_interleaved(calls: Mapping[str, Callable[[], object]], *, device: str = "cpu",
                     rounds: int = 7, warmup: int = WARMUP,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Time each call ``rounds`` times, interleaved (A B, B A, A B, ...) so drift in the machine's
    speed hits all of them alike; ``warmup`` untimed calls each first. ``clock`` reads seconds
    (injectable, so the interleaving can be tested without timing anything)."""
    names = list(calls)
    for name in names:
        for _ in range(warmup):
            calls[name]()
    synchronize(device)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            start = clock()
            calls[name]()
            synchronize(device)
            seconds[name].append(clock() - start)
    return {name: Timing.of(values) for name, values in seconds.items()}


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ layer logs start/stop lines to file descriptor 2; keep them off the
    user's terminal (a Python-level redirect can't catch them)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def peak_memory(call: Callable[[], object], device: str = "cpu") -> int:
    """Peak bytes allocated by torch during ``call`` above what was allocated before it.

    CUDA: ``torch.cuda.max_memory_allocated``. CPU: the profiler's memory accounting (every
    allocation and free by torch, in time order; ``tracemalloc`` sees none of them).
    """
    if device.startswith("cuda"):
        synchronize(device)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        synchronize(device)
        return max(0, torch.cuda.max_memory_allocated() - before)
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                  profile_memory=True) as recorded:
        call()
    current = peak = 0
    for event in sorted(recorded.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak
