"""What ``check --watch`` saves: a save checked by the warm process against a cold ``check``.

    .venv/bin/python benchmarks/watch_timing.py [--saves 6] [--cold 5]

A self-attention module with a scale bug (divides by sqrt(d_model)) is saved alternately broken
and fixed under a running ``check FILE::MHA --watch``; for each save it measures, from the
write: the first verdict line of a check that failed on the save before (``reference``: its
"passes now" or its failure again), and the save's own line (the whole catalogue done). A cold
``check FILE::MHA`` (a new interpreter each time) is timed on the same file, broken and fixed in
turn. Medians are printed, with the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_watch import _module  # noqa: E402  (the same module the test watches)

BROKEN, FIXED = "self.dh * self.h", "self.dh"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def cold(folder: Path, runs: int) -> list[float]:
    seconds = []
    for run in range(runs):
        _module(folder / "attn.py", BROKEN if run % 2 == 0 else FIXED)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "conformance", "check", "attn.py::MHA"],
                       cwd=folder, env=_env(), capture_output=True, check=False)
        seconds.append(time.perf_counter() - start)
    return seconds


def watched(folder: Path, saves: int) -> tuple[list[float], list[float]]:
    _module(folder / "attn.py", BROKEN)
    process = subprocess.Popen(
        [sys.executable, "-m", "conformance", "check", "attn.py::MHA", "--watch"],
        cwd=folder, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first, whole = [], []
    try:
        while not process.stdout.readline().startswith("["):
            pass  # the first run, before any save
        for save in range(saves):
            time.sleep(0.5)
            _module(folder / "attn.py", FIXED if save % 2 == 0 else BROKEN)
            start = time.perf_counter()
            seen_first = None
            while True:
                line = process.stdout.readline()
                if not line:
                    raise RuntimeError("the watch ended")
                if seen_first is None and line.startswith("  reference:"):
                    seen_first = time.perf_counter() - start
                if line.startswith("["):
                    whole.append(time.perf_counter() - start)
                    break
            first.append(seen_first if seen_first is not None else float("nan"))
    finally:
        process.send_signal(2)
        process.wait(timeout=30)
    return first, whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=6)
    parser.add_argument("--cold", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        first, whole = watched(Path(folder), args.saves)
        cold_seconds = cold(Path(folder), args.cold)
    median = statistics.median
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"watch, save to the first verdict of the check that failed before: "
          f"median {median(first):.2f} s ({', '.join(f'{s:.2f}' for s in first)})")
    print(f"watch, save to the save's line (every check): median {median(whole):.2f} s")
    print(f"cold check FILE::MHA: median {median(cold_seconds):.2f} s; a watched re-check is "
          f"{median(whole) / median(cold_seconds):.0%} of it")


if __name__ == "__main__":
    main()
