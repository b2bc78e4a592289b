"""The GPU acceptance script's CPU-runnable part: the same driver, on this CPU, over the rows
whose kernel runs here (FLASH has a CPU kernel; EFFICIENT has none and must say it runs nowhere
here, never pass), in process and isolated. On a GPU, ``bash benchmarks/gpu_acceptance.sh``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_acceptance_driver_on_the_cpu_passes_the_kernel_fails_the_twin_and_says_nowhere():
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_acceptance.py", "--device", "cpu", "--only",
         "sdpa_flash,sdpa_efficient,sdpa_flash_scale_dropped", "--checks", "gate,kernel",
         "--no-catalogue", "--no-bench"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    rows = {(line[:32].strip(), line[33:51].strip()): line
            for line in done.stdout.splitlines()[1:] if line.strip()}
    assert done.returncode == 1  # sdpa_efficient runs nowhere here: not what a GPU gives
    for mode in ("in process", "isolated"):
        flash = rows["sdpa_flash", mode]
        assert " yes " in flash and "exit 0: 2 passed" in flash
        twin = rows["sdpa_flash_scale_dropped", mode]
        assert " yes " in twin and "FAIL kernel" in twin
        nowhere = rows["sdpa_efficient", mode]
        assert " NO " in nowhere and "runs nowhere here" in nowhere


def test_the_shell_script_runs_the_driver_on_cuda_within_eight_minutes():
    script = (ROOT / "benchmarks" / "gpu_acceptance.sh").read_text()
    assert os.access(ROOT / "benchmarks" / "gpu_acceptance.sh", os.X_OK)
    assert "timeout 480 python3 benchmarks/gpu_acceptance.py --device cuda --parallel 4" in script
