"""The bench: FLOP formula, scaling fit, memory accounting, the timer, and the command."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.benchmark import Timer

from conformance.benchmark import attention_flops, peak_memory, scaling_exponent, time_interleaved
from conformance.cli import main
from conformance.spec import Config


def test_flop_formula():
    config = Config(batch=2, q_len=8, kv_len=8, d_model=16, num_heads=4)
    core = 4 * 2 * 4 * 8 * 8 * 4
    projections = 2 * 2 * (2 * 8 + 2 * 8) * 16 * 16
    assert attention_flops(config, backward=False) == core + projections
    assert attention_flops(config, backward=True) == 3.5 * (core + projections)


def test_scaling_exponent_of_a_quadratic():
    lengths = [64, 128, 256, 512]
    assert scaling_exponent(lengths, [3e-6 * n**2 for n in lengths]) == pytest.approx(2.0)
    assert scaling_exponent(lengths[:1], [1.0]) is None


def test_cpu_peak_memory_sees_torch_allocations():
    x = torch.randn(4, 256, 256)  # 1 MiB; each product below is another 1 MiB

    def work():
        a = x @ x
        b = a @ x
        del a
        return b.softmax(-1)  # a freed before c: at most two products alive at once

    assert peak_memory(work) == 2 * 2**20


def test_interleaved_timer_agrees_with_torch_utils_benchmark():
    """Ratios, not absolute times: the same two workloads timed both ways agree within 10 %."""
    small, big = torch.randn(192, 192), torch.randn(384, 384)  # 8x the work
    seen = []
    for _ in range(3):  # a shared 2-core machine: a burst of load may hit one measurement
        ours = time_interleaved({"small": lambda: small @ small, "big": lambda: big @ big},
                                rounds=31)
        theirs_small = Timer("m @ m", globals={"m": small}).blocked_autorange(min_run_time=0.3)
        theirs_big = Timer("m @ m", globals={"m": big}).blocked_autorange(min_run_time=0.3)
        ratio = (ours["big"].median / ours["small"].median) / (theirs_big.median /
                                                               theirs_small.median)
        seen.append(ratio)
        if abs(ratio - 1) <= 0.10:
            return
    pytest.fail(f"our big/small time ratio differs from torch.utils.benchmark's by {seen}")


def test_bench_command_prints_table_json_and_plot(tmp_path, capsys):
    report, picture = tmp_path / "bench.json", tmp_path / "bench.png"
    code = main(["bench", "textbook", "seed003-MultiHeadAttention", "--lengths", "16,32,64",
                 "--rounds", "3", "--budget", "20", "--json", str(report), "--plot", str(picture)])
    out = capsys.readouterr().out
    assert code == 0
    assert "x SDPA" in out and "scaling: time ~ L^" in out
    assert "skipped: beyond its max_len 32" in out  # seed 003's block_size
    data = json.loads(report.read_text())
    measured = [p for p in data["points"] if p["median_ms"] is not None]
    assert {p["implementation"] for p in measured} == {"textbook", "seed003-MultiHeadAttention"}
    assert all(p["ratio_to_sdpa"] > 0 and p["peak_mb"] >= 0 for p in measured)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_benchmark_fixtures_group_each_implementation_with_sdpa(tmp_path):
    import os
    import subprocess
    import sys

    report = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider",
         "--attention-impl", "textbook", "--attention-bench", "--benchmark-only",
         "--attention-bench-lengths", "16", "--benchmark-json", str(report),
         "--benchmark-min-rounds", "3", "--benchmark-max-time", "0.05", "-k", "test_forward"],
        capture_output=True, text=True, env=dict(os.environ), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    benchmarks = json.loads(report.read_text())["benchmarks"]
    groups = {}
    for entry in benchmarks:
        groups.setdefault(entry["group"], set()).add(entry["param"] if "param" in entry
                                                     else entry["name"])
    assert set(groups) == {"forward L=16 float32 cpu", "forward+backward L=16 float32 cpu"}
    for names in groups.values():
        assert any("textbook" in n for n in names) and any("reference-sdpa" in n for n in names)


def test_benchmark_fixtures_never_run_by_default(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider",
         "--attention-impl", "textbook", "-k", "test_forward", "-rs"],
        capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0
    assert "benchmarks run with --attention-bench or --benchmark-only" in done.stdout
