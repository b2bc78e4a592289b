"""Does the bench's interleaved timer agree with torch.utils.benchmark? A benchmark, not a test:
its answer depends on how busy the machine is.

    python benchmarks/timer_agreement.py [--repeats 5]

Times two matmuls of 8x different work both ways and prints the ratio of their time ratios
(1.0 = perfect agreement), median over the repeats.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.utils.benchmark import Timer

from conformance.benchmark import time_interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    small, big = torch.randn(192, 192), torch.randn(384, 384)
    ratios = []
    for _ in range(args.repeats):
        ours = time_interleaved({"small": lambda: small @ small, "big": lambda: big @ big},
                                rounds=31)
        theirs_small = Timer("m @ m", globals={"m": small}).blocked_autorange(min_run_time=0.3)
        theirs_big = Timer("m @ m", globals={"m": big}).blocked_autorange(min_run_time=0.3)
        ratios.append((ours["big"].median / ours["small"].median)
                      / (theirs_big.median / theirs_small.median))
    print(f"big/small time ratio, ours over torch.utils.benchmark's: median "
          f"{statistics.median(ratios):.3f} (all: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
