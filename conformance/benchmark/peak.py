"""The device's dense peak, for saying achieved TFLOP/s as a fraction of it.

Known devices by name, from their makers' datasheets (dense: no 2:4 sparsity; tensor cores
where the dtype has them: float32 counts as TF32 only where torch is allowed to use it). Any other
device, the CPU included, gets a peak *measured* here, a large matmul in the dtype timed once,
and is said as measured: a fraction of it says how close the kernel comes to what this device's
own matmul reaches, not to a datasheet.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

KNOWN_PEAKS: tuple[tuple[str, dict[torch.dtype, float]], ...] = (
    # (a substring of torch.cuda.get_device_name(), {dtype: dense TFLOP/s}); the first that
    # matches is taken, so the more specific names come first.
    ("H100 PCIe", {torch.bfloat16: 756.0, torch.float16: 756.0, torch.float32: 51.0,
                   torch.float64: 51.0}),
    ("H100", {torch.bfloat16: 989.4, torch.float16: 989.4, torch.float32: 66.9,
              torch.float64: 66.9}),  # SXM (and "H100 80GB HBM3")
    ("H200", {torch.bfloat16: 989.4, torch.float16: 989.4, torch.float32: 66.9,
              torch.float64: 66.9}),
    ("A100", {torch.bfloat16: 312.0, torch.float16: 312.0, torch.float32: 19.5,
              torch.float64: 19.5}),
    ("L40S", {torch.bfloat16: 362.1, torch.float16: 362.1, torch.float32: 91.6}),
    ("L4", {torch.bfloat16: 121.0, torch.float16: 121.0, torch.float32: 30.3}),
    ("A10", {torch.bfloat16: 125.0, torch.float16: 125.0, torch.float32: 31.2}),
    ("V100", {torch.float16: 125.0, torch.float32: 15.7, torch.float64: 7.8}),
    ("T4", {torch.float16: 65.0, torch.float32: 8.1}),
)
"""Dense peak TFLOP/s per dtype of the devices the field benches on (NVIDIA datasheets)."""

MATMUL_SIZE = {"cuda": 8192, "cpu": 2048}
"""The square matmul a device's peak is measured with where no datasheet is known: large enough
to fill it (a CPU's 2048^3 in float32 takes a fraction of a second)."""


@dataclass(frozen=True)
class Peak:
    """A device's dense peak in one dtype, and where the figure comes from."""

    tflops: float
    source: str
    """``"datasheet (NAME)"`` or ``"measured (an N^3 matmul)"``."""


def device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def known_peak(name: str, dtype: torch.dtype) -> Peak | None:
    """The datasheet peak of the device called ``name`` in ``dtype``, where it is known."""
    for pattern, peaks in KNOWN_PEAKS:
        if pattern in name:
            return Peak(peaks[dtype], f"datasheet ({pattern})") if dtype in peaks else None
    return None


def measured_peak(device: str, dtype: torch.dtype) -> Peak | None:
    """The peak this device's own matmul reaches in ``dtype`` (best of 3), or None where the
    dtype's matmul does not run there."""
    size = MATMUL_SIZE["cuda" if device.startswith("cuda") else "cpu"]
    try:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)
        best = float("inf")
        for _ in range(4):  # the first is a warm-up
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            a @ b
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
    except RuntimeError:  # no matmul in this dtype on this device
        return None
    return Peak(2 * size**3 / best / 1e12, f"measured (a {size}^3 matmul)")


def device_peak(device: str, dtype: torch.dtype) -> Peak | None:
    """The dense peak to say fractions of: the datasheet's, else measured here."""
    return known_peak(device_name(device), dtype) or measured_peak(device, dtype)
