"""Whether a bench's figures can be trusted: the machine's load and the spread of the timings.

A shared machine makes timings noise: other processes take the cores, and the medians move with
them. :func:`warnings` reads two signs of it, each stated with its numbers: the load average
beside the cores the bench's threads need, and the interquartile range of a point's timings
beside its median.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from conformance.benchmark.ladder import BenchPoint

SPREAD = 0.25
"""An interquartile range over this fraction of the median: the rounds disagree by more than a
quarter, so the median says little about the implementation's speed."""


def load_average() -> float | None:
    """The one-minute load average, where the system has one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def warnings(points: Sequence[BenchPoint], *, load: float | None, cores: int,
             threads: int) -> list[str]:
    """What says the figures may be noise, one sentence each (none: they look trustworthy).

    ``load`` is the highest load average seen during the run; the bench itself keeps about
    ``threads`` cores busy, so a load beyond ``cores - threads + 1`` means something else ran.
    """
    found = []
    if load is not None and load > max(cores - threads, 0) + 1:
        found.append(f"the load average reached {load:.1f} on {cores} core(s) while the bench "
                     f"used {threads} thread(s): other work was running, and took time from "
                     "the calls")
    timings = [(f"{p.implementation} at L={p.length}", p.median_ms, p.q1_ms, p.q3_ms)
               for p in points] + [(f"SDPA beside {p.implementation} at L={p.length}",
                                    p.sdpa_median_ms, p.sdpa_q1_ms, p.sdpa_q3_ms) for p in points]
    spread = [(what, median, q1, q3) for what, median, q1, q3 in timings
              if median and q1 is not None and q3 is not None and q3 - q1 > SPREAD * median]
    if spread:
        what, median, q1, q3 = max(spread, key=lambda t: (t[3] - t[2]) / t[1])
        measured = sum(1 for _, median, _, _ in timings if median)
        found.append(f"{len(spread)} of {measured} timing(s) spread over {SPREAD:.0%} of their "
                     f"median (worst: {what}, IQR {q1:.3g}-{q3:.3g} ms around {median:.3g} ms)")
    return found
