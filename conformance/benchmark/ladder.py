"""The sequence-length ladder: each implementation beside SDPA at doubling lengths, in a budget."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from conformance.benchmark.measure import WARMUP, attention_flops, peak_memory, time_interleaved
from conformance.benchmark.peak import Peak, device_peak
from conformance.generation.cases import Case, dtype_name
from conformance.generation.strategies import fixed_features
from conformance.model.spec import Implementation
from conformance.subject.boundary import ImplementationError
from conformance.subject.in_process import InProcessSubject

DEFAULT_LENGTHS = (32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True)
class BenchPoint:
    """One implementation at one length (``skipped`` says why when nothing was measured)."""

    implementation: str
    length: int
    median_ms: float | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    sdpa_median_ms: float | None = None
    sdpa_q1_ms: float | None = None
    sdpa_q3_ms: float | None = None
    ratio_to_sdpa: float | None = None
    tflops: float | None = None
    """Achieved TFLOP/s (see :func:`~conformance.benchmark.measure.attention_flops`)."""
    peak_fraction: float | None = None
    """``tflops`` as a fraction of the device's dense peak in the dtype (see ``peak_source``)."""
    peak_source: str | None = None
    peak_mb: float | None = None
    sdpa_peak_mb: float | None = None
    skipped: str | None = None
    causal: bool = False
    """Both ran causal: the implementation always is, so the SDPA baseline ran with
    ``is_causal=True`` too (the same work on both sides)."""

    def to_dict(self) -> dict:
        return asdict(self)


def scaling_exponent(lengths: Sequence[int], values: Sequence[float]) -> float | None:
    """Least-squares slope of log(value) against log(length): ~2 for quadratic attention."""
    points = [(math.log(n), math.log(v)) for n, v in zip(lengths, values, strict=True) if v > 0]
    if len(points) < 2:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else None


def _progress(text: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{text}")
        sys.stderr.flush()


def bench(implementations: Sequence[Implementation], baseline: Implementation, *,
          lengths: Sequence[int] = DEFAULT_LENGTHS, batch: int = 2, heads: int = 4,
          head_dim: int = 32, dtype: torch.dtype = torch.float32, device: str = "cpu",
          backward: bool = False, budget: float = 30.0, rounds: int = 7) -> list[BenchPoint]:
    """Each implementation beside ``baseline`` (SDPA) at each length, interleaved, in eval mode.

    A length is skipped once the implementation's ``budget`` seconds would be exceeded (see
    :func:`predicted_cost`), or beyond its declared ``max_len``. The baseline is measured again
    beside every implementation, in the same run.
    """
    points: list[BenchPoint] = []
    peak = device_peak(device, dtype) if implementations else None
    for impl in implementations:
        spent = 0.0
        last = 0.0
        previous: BenchPoint | None = None
        causal = impl.capabilities.causality.kind == "always"
        for length in lengths:
            if impl.capabilities.max_len is not None and length > impl.capabilities.max_len:
                points.append(BenchPoint(impl.name, length, skipped=f"beyond its max_len "
                                         f"{impl.capabilities.max_len}", causal=causal))
                continue
            if previous is not None and spent + predicted_cost(previous, last, rounds) > budget:
                points.append(BenchPoint(impl.name, length, skipped=f"over the {budget:g} s "
                                         "budget", causal=causal))
                continue
            _progress(f"bench {impl.name}: length {length}")
            start = time.perf_counter()
            previous = _measure(impl, baseline, length, batch, heads, head_dim, dtype, device,
                                backward, rounds, peak)
            points.append(previous)
            last = time.perf_counter() - start
            spent += last
    _progress("")
    return points


def predicted_cost(point: BenchPoint, seconds: float, rounds: int) -> float:
    """Seconds the next doubling of the length will take, after ``point`` took ``seconds``.

    Only the calls grow with the length (4x at a doubling: attention is quadratic); the rest of a
    point's time (building the modules, the profiler that reads peak memory) does not. The calls
    are each side's warm-up, timed rounds and memory reading, at the medians measured.
    """
    if point.median_ms is None or point.sdpa_median_ms is None:
        return 4 * seconds
    calls = (point.median_ms + point.sdpa_median_ms) / 1e3 * (rounds + WARMUP + 1)
    calls = min(calls, seconds)
    return (seconds - calls) + 4 * calls


def _measure(impl: Implementation, baseline: Implementation, length: int, batch: int,
             heads: int, head_dim: int, dtype: torch.dtype, device: str, backward: bool,
             rounds: int, peak: Peak | None) -> BenchPoint:
    num_heads = impl.capabilities.heads or heads
    case = Case(batch=batch, q_len=length, kv_len=length, num_heads=num_heads,
                head_dim=heads * head_dim // num_heads, dtype=dtype_name(dtype), device=device,
                seed=0, causal=impl.capabilities.causality.kind == "always",
                **fixed_features(impl.capabilities))
    calls = {}
    try:
        for name, subject in (("impl", impl), ("sdpa", baseline)):
            instance = InProcessSubject(subject).instantiate(case.config, case.seed)
            inputs = case.inputs(subject.capabilities.call, use_mask=False)
            if backward:
                cotangent = torch.ones(batch, length, case.d_model, dtype=dtype, device=device)
                calls[name] = (lambda i=instance, x=inputs, c=cotangent: i.gradients(x, c))
            else:
                calls[name] = (lambda i=instance, x=inputs: i.forward(x))
        timings = time_interleaved(calls, device=device, rounds=rounds)
        memory = {name: peak_memory(call, device) for name, call in calls.items()}
    except (ImplementationError, RuntimeError) as error:
        return BenchPoint(impl.name, length, skipped=f"failed: {str(error).splitlines()[0]}",
                          causal=case.causal)
    ours, sdpa = timings["impl"], timings["sdpa"]
    tflops = attention_flops(case.config, backward=backward, causal=case.causal) / ours.median / 1e12
    return BenchPoint(
        impl.name, length, median_ms=ours.median * 1e3, q1_ms=ours.q1 * 1e3, q3_ms=ours.q3 * 1e3,
        sdpa_median_ms=sdpa.median * 1e3, sdpa_q1_ms=sdpa.q1 * 1e3, sdpa_q3_ms=sdpa.q3 * 1e3,
        ratio_to_sdpa=ours.median / sdpa.median,
        tflops=tflops,
        peak_fraction=None if peak is None else tflops / peak.tflops,
        peak_source=None if peak is None else peak.source,
        peak_mb=memory["impl"] / 2**20, sdpa_peak_mb=memory["sdpa"] / 2**20,
        causal=case.causal)
