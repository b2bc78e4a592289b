"""Time the whole catalogue per bundled implementation (quick profile) and print per-check times.

    python benchmarks/catalogue_timing.py [--profile quick] [--repeat 3]

Each implementation's catalogue runs ``--repeat`` times with a fresh runner; the figures are the
medians. Timings on a shared 2-core machine are noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from conformance.adapter import InProcessSubject
from conformance.catalogue import CHECK_NAMES, Runner
from implementations import bundled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    per_check: dict[str, dict[str, list[float]]] = {}
    totals: dict[str, list[float]] = {}
    overall = []
    for _ in range(args.repeat):
        start_all = time.perf_counter()
        for impl in bundled():
            runner = Runner(args.profile)
            start = time.perf_counter()
            results = runner.run(InProcessSubject(impl), devices=["cpu"])
            totals.setdefault(impl.name, []).append(time.perf_counter() - start)
            for result in results:
                per_check.setdefault(impl.name, {}).setdefault(result.check, []).append(
                    result.seconds)
        overall.append(time.perf_counter() - start_all)

    width = max(map(len, totals)) + 2
    column = max(map(len, CHECK_NAMES)) + 2
    print("implementation".ljust(width) + "total  " + "".join(f"{c:>{column}}" for c in CHECK_NAMES))
    for name, times in totals.items():
        cells = "".join(f"{statistics.median(per_check[name][c]):{column}.2f}" for c in CHECK_NAMES)
        print(f"{name.ljust(width)}{statistics.median(times):5.2f}  {cells}")
    medians = [statistics.median(t) for t in totals.values()]
    slowest = max((statistics.median(t), name, check) for name, checks in per_check.items()
                  for check, t in checks.items())
    print("\nper check, median (max) over implementations: " + "; ".join(
        f"{c} {statistics.median(statistics.median(per_check[n][c]) for n in per_check):.2f} "
        f"({max(statistics.median(per_check[n][c]) for n in per_check):.2f})" for c in CHECK_NAMES))
    print(f"median implementation: {statistics.median(medians):.2f} s; "
          f"slowest check: {slowest[1]} · {slowest[2]} {slowest[0]:.2f} s; "
          f"all implementations: {statistics.median(overall):.1f} s (median of {args.repeat})")


if __name__ == "__main__":
    main()
