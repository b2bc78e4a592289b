"""The bench: FLOP formula, scaling fit, memory accounting, the timer, and the command."""

from __future__ import annotations

import json

import pytest
import torch

from conformance.benchmark import attention_flops, peak_memory, scaling_exponent, time_interleaved
from conformance.benchmark.ladder import BenchPoint, predicted_cost
from conformance.frontends.cli import main
from conformance.model.spec import Config


def test_flop_formula():
    config = Config(batch=2, q_len=8, kv_len=8, d_model=16, num_heads=4)
    core = 4 * 2 * 4 * 8 * 8 * 4
    projections = 2 * 2 * (2 * 8 + 2 * 8) * 16 * 16
    assert attention_flops(config, backward=False) == core + projections
    assert attention_flops(config, backward=True) == 3.5 * (core + projections)
    # Causal: half the core, the work a causal kernel need do (FlashAttention's count).
    assert attention_flops(config, backward=False, causal=True) == core / 2 + projections


def test_peaks_come_from_the_datasheet_by_name_else_are_measured_and_said_so():
    from conformance.benchmark.peak import known_peak, measured_peak

    assert known_peak("NVIDIA H100 80GB HBM3", torch.bfloat16).tflops == 989.4
    assert known_peak("NVIDIA H100 PCIe", torch.float16).tflops == 756.0  # not the SXM part
    assert known_peak("NVIDIA A100-SXM4-80GB", torch.bfloat16).source == "datasheet (A100)"
    assert known_peak("NVIDIA T4", torch.bfloat16) is None  # no bfloat16 tensor cores
    assert known_peak("cpu", torch.float32) is None
    measured = measured_peak("cpu", torch.float32)
    assert measured.tflops > 0 and measured.source == "measured (a 2048^3 matmul)"


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


def test_interleaved_timer_alternates_the_order_and_takes_medians():
    """A B, B A, A B, ...: drift hits both alike. Timed with a fake clock, so load can't matter
    (the agreement with torch.utils.benchmark is a benchmark: benchmarks/timer_agreement.py)."""
    now, order = [0.0], []

    def clock():
        return now[0]

    def work(name, seconds):
        def call():
            order.append(name)
            now[0] += seconds
        return call

    timings = time_interleaved({"a": work("a", 0.001), "b": work("b", 0.004)}, rounds=5,
                               warmup=1, clock=clock)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert timings["a"].median == pytest.approx(0.001)
    assert timings["b"].median == pytest.approx(0.004)
    assert timings["b"].rounds == 5


def test_the_budget_predicts_the_next_length_from_the_calls_not_the_overhead():
    """64 keys took 0.6 ms a call, but building and profiling took 1.3 s: the next doubling costs
    that overhead again and 4x the calls, not 4x everything (which skipped 128 in a 5 s budget)."""
    point = BenchPoint("attn", 64, median_ms=0.6, sdpa_median_ms=0.5)
    predicted = predicted_cost(point, seconds=1.3, rounds=7)
    calls = (0.6 + 0.5) / 1e3 * (7 + 2 + 1)
    assert predicted == pytest.approx(1.3 + 3 * calls)
    assert predicted < 5.0
    assert predicted_cost(BenchPoint("attn", 64, skipped="failed"), seconds=1.0, rounds=7) == 4.0


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
    assert all(p["tflops"] > 0 and p["peak_fraction"] > 0 for p in measured)
    assert {p["peak_source"] for p in measured} == {"measured (a 2048^3 matmul)"}
    assert "TFLOP/s" in out and "of peak" in out and "GFLOP" not in out
    # Settings in their own types; whether each point (and SDPA beside it) ran causal.
    settings = data["settings"]
    assert settings["batch"] == 2 and settings["rounds"] == 3 and settings["budget"] == 20.0
    assert settings["lengths"] == [16, 32, 64] and settings["backward"] is False
    causal = {p["implementation"]: p["causal"] for p in data["points"]}
    assert causal == {"textbook": False, "seed003-MultiHeadAttention": True}
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


def _point(median, q1, q3, sdpa=(1.0, 0.95, 1.05), length=64):
    return BenchPoint("impl", length, median_ms=median, q1_ms=q1, q3_ms=q3,
                      sdpa_median_ms=sdpa[0], sdpa_q1_ms=sdpa[1], sdpa_q3_ms=sdpa[2])


def test_noise_is_said_with_its_numbers():
    from conformance.benchmark import noise

    steady = [_point(2.0, 1.9, 2.1), _point(8.0, 7.8, 8.3, length=128)]
    assert noise.warnings(steady, load=0.4, cores=2, threads=1) == []
    (busy,) = noise.warnings(steady, load=3.6, cores=2, threads=1)
    assert busy.startswith("the load average reached 3.6 on 2 core(s) while the bench used 1")
    (spread,) = noise.warnings([*steady, _point(2.0, 1.0, 3.0, length=256)], load=None, cores=2,
                               threads=1)
    assert spread == ("1 of 6 timing(s) spread over 25% of their median (worst: impl at L=256, "
                      "IQR 1-3 ms around 2 ms)")
    (baseline,) = noise.warnings([_point(2.0, 1.9, 2.1, sdpa=(1.0, 0.5, 2.0))], load=None,
                                 cores=2, threads=1)
    assert "worst: SDPA beside impl at L=64" in baseline


def test_bench_checks_for_matplotlib_before_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("conformance.frontends.bench_command.plot_available", lambda: False)
    ran = []
    monkeypatch.setattr("conformance.frontends.bench_command.bench", lambda *a, **k: ran.append(1) or [])
    code = main(["bench", "textbook", "--lengths", "16", "--plot", str(tmp_path / "b.png")])
    err = capsys.readouterr().err
    assert code == 2 and ran == []
    assert "pip install 'attention-conformance[plot]'" in err and err.count("\n") == 1


def test_bench_runs_on_the_threads_it_is_given(capsys, monkeypatch):
    seen = []

    def fake_bench(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return []

    before = torch.get_num_threads()
    monkeypatch.setattr("conformance.frontends.bench_command.bench", fake_bench)
    assert main(["bench", "textbook", "--lengths", "16", "--threads", "1"]) == 0
    assert seen == [1] and torch.get_num_threads() == before
    assert "1 torch thread(s)" in " ".join(capsys.readouterr().out.split())


def test_torchs_backends_are_rows_beside_the_implementation(capsys):
    assert main(["bench", "textbook", "--lengths", "16", "--rounds", "2", "--backends"]) == 0
    out = capsys.readouterr().out
    for row in ("sdpa[flash]", "sdpa[efficient]", "sdpa[cudnn]", "sdpa[math]"):
        assert f"\n{row}\n" in out
    # The CPU has no cuDNN kernel: a skipped row with torch's reason, never a crash.
    assert "skipped: failed: forward raised RuntimeError: No viable backend" in out
