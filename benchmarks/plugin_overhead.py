"""What the pytest plugin costs a test run that has nothing to do with attention.

    python benchmarks/plugin_overhead.py [--rounds 15]

Runs pytest on a one-test file in a scratch folder, alternately with the plugin (as pytest
loads it in any environment where the suite is installed) and without it (``-p
no:attention_conformance``), and prints the median wall time of each and their difference
(alternating, so a busy machine slows both alike).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(folder: Path, *extra: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra,
                    str(folder)], check=True, capture_output=True, cwd=folder)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="plugin-overhead-") as scratch:
        folder = Path(scratch)
        (folder / "test_unrelated.py").write_text("def test_sum():\n    assert 1 + 1 == 2\n")
        _run(folder)  # warm the file system caches
        with_plugin, without = [], []
        for _ in range(args.rounds):
            with_plugin.append(_run(folder))
            without.append(_run(folder, "-p", "no:attention_conformance"))
    a, b = statistics.median(with_plugin), statistics.median(without)
    print(f"pytest on one unrelated test, median of {args.rounds}: {a:.3f} s with the plugin, "
          f"{b:.3f} s without: overhead {a - b:+.3f} s")


if __name__ == "__main__":
    main()
