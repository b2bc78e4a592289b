"""``attention-conformance bench``: speed, memory and scaling of implementations beside SDPA."""

from conformance.benchmark.ladder import BenchPoint, bench, scaling_exponent
from conformance.benchmark.measure import attention_flops, peak_memory, time_interleaved

__all__ = ["BenchPoint", "attention_flops", "bench", "peak_memory", "scaling_exponent",
           "time_interleaved"]
