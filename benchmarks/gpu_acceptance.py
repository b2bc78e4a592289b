"""The GPU acceptance run: torch's kernels and the bundled Triton kernel checked bare on the
device, in process and isolated, each broken twin failing its check, a model's attention driven
through the model on the device (and a twin built with a broken attention function), the bundled
catalogue on the device, and bench in TFLOP/s; one table at the end.

    python benchmarks/gpu_acceptance.py [--device cuda] [--only NAME,...] [--modes ...]
    bash benchmarks/gpu_acceptance.sh          # the same, on CUDA, within 8 minutes on one GPU

The rows run ``--parallel`` at a time, each with its share of the CPU cores (``--jobs``), and
each is printed as it ends: a run cut short keeps the rows it finished. bench runs last, alone,
so that its times are not shared with a check.

Every row is the command line as a user types it (a fresh interpreter, ``--json`` read back):
``expected`` is what a correct suite gives (pass: exit 0 with no failure; the twin: its check
FAILs), ``got`` what it gave. A row whose run checked nothing (every check skipped: exit 2,
NOTHING CHECKED) or whose kernel runs nowhere here is said as such, never as a pass. On a CPU
(``--device cpu``) the rows whose kernel runs there run (``tests/test_gpu_acceptance.py`` runs
some in ``make test``); CUDA-only kernels say they run nowhere here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "conformance.implementations.torch_kernels"
TRITON = "conformance.implementations.triton_attention"
FUNCTIONS = "tests/fixtures/interface_functions.py"


@dataclass(frozen=True)
class Row:
    """One kernel to check: its name in the table, its IMPL, and the check its bug fails
    (None: correct, it must pass)."""

    name: str
    spec: str
    fails: str | None = None
    options: tuple[str, ...] = ()
    """Its own command-line options: a compiled kernel's load and calls compile (FlexAttention
    under ``torch.compile`` compiles each new shape; its load took over 60 s on an H200's
    host), so they get the time that takes, not the default call timeout."""
    timeout: float | None = None
    """Seconds its row may take, where it needs more than ``--timeout``."""


ROWS = (
    Row("sdpa_flash", f"{KERNELS}:sdpa_flash"),
    Row("sdpa_efficient", f"{KERNELS}:sdpa_efficient"),
    Row("sdpa_cudnn", f"{KERNELS}:sdpa_cudnn"),
    Row("flex_compiled", f"{KERNELS}:flex_compiled", options=("--call-timeout", "240"),
        timeout=300),
    Row("triton_attention", f"{TRITON}:triton_attention"),
    Row("sdpa_flash_scale_dropped", f"{KERNELS}:sdpa_flash_scale_dropped", fails="kernel"),
    Row("triton_attention_tail_unmasked", f"{TRITON}:triton_attention_tail_unmasked",
        fails="reference"),
    # Attention inside a model (issue 54): the smallest Llama driven on the device, its KV cache
    # through the model's own; built with a function that ignores the mask, padding fails.
    Row("llama_in_model", "transformers:LlamaForCausalLM", timeout=240),
    Row("llama_mask_ignored", "transformers:LlamaForCausalLM", fails="padding",
        options=("--attn-implementation", f"{FUNCTIONS}::mask_ignored", "--check", "padding"),
        timeout=240),
)
MODES = {"in process": ["--no-isolate"], "isolated": []}


def _run(arguments: list[str], timeout: float) -> tuple[int, dict | None, str, float]:
    """Exit status, the JSON report (None where none was written), the last line of stderr,
    and seconds, of ``attention-conformance`` with ``arguments``."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", "conformance", *arguments, "--json",
                                   str(report)], cwd=ROOT, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, None, f"over the {timeout:g} s this row may take", timeout
        seconds = time.perf_counter() - start
        data = json.loads(report.read_text()) if report.exists() else None
        last = (done.stderr.strip().splitlines() or [""])[-1]
        return done.returncode, data, last, seconds


def outcome(row: Row, code: int, data: dict | None, last: str) -> tuple[str, bool]:
    """What a run gave, in words, and whether it is what a correct suite gives."""
    if data is None:  # one line, naming the spec once: its words after the last "SPEC: "
        words = last.removeprefix("attention-conformance: error: ")
        words = words.split(f"{row.spec.rsplit('.', 1)[-1]}: ", 1)[-1] if row.spec else words
        return f"exit {code}: {words[:140]}", False
    failed = sorted({r["check"] for r in data["results"] if r["status"] == "failed"})
    unchecked = data["summary"].get("unchecked", [])
    if unchecked and not any(r["status"] != "skipped" for r in data["results"]):
        return f"NOTHING CHECKED ({unchecked[0]['why'][:80]})", False
    passed = sum(r["status"] == "passed" for r in data["results"])
    words = f"exit {code}: {passed} passed" + (f", FAIL {', '.join(failed)}" if failed else "")
    if failed and row.fails is None:  # the first failure's reason: what to look at next
        first = next(r for r in data["results"] if r["status"] == "failed")
        words += f" ({first['check']}: {(first.get('reason') or '')[:160]})"
    right = (code == 0 and not failed) if row.fails is None else row.fails in failed
    return words, right


HEADER = f"{'row':<32} {'mode':<18} {'expected':<16} {'right':<5} {'s':>6}  got"


def _line(name: str, mode: str, expected: str, words: str, right: str, seconds: float) -> str:
    return f"{name:<32} {mode:<18} {expected:<16} {right:<5} {seconds:>6.1f}  {words}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", help="comma-separated row names (default: every one)")
    parser.add_argument("--modes", default=",".join(MODES), help="in process, isolated")
    parser.add_argument("--checks", help="comma-separated checks (default: the catalogue)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per row")
    parser.add_argument("--parallel", type=int, default=1,
                        help="rows at a time, the CPU cores shared out between them")
    parser.add_argument("--no-catalogue", action="store_true")
    parser.add_argument("--no-bench", action="store_true")
    args = parser.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    checks = [f"--check={name}" for name in args.checks.split(",")] if args.checks else []
    jobs = ["--jobs", str(max(1, (os.cpu_count() or 1) // max(1, args.parallel)))]
    runs = [(row, mode, ["check", row.spec, "--device", args.device, *MODES[mode], *checks,
                         *jobs, *row.options], max(args.timeout, row.timeout or 0))
            for row in ROWS if wanted is None or row.name in wanted
            for mode in args.modes.split(",")]
    runs.sort(key=lambda run: -run[3])  # the longest first
    if not args.no_catalogue:  # first: the longest
        runs.insert(0, (Row("bundled catalogue", ""), "isolated per file",
                        ["check", "--device", args.device, *checks, *jobs], args.timeout * 4))
    print(HEADER, flush=True)
    table = []
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        futures = {pool.submit(_run, arguments, timeout): (row, mode)
                   for row, mode, arguments, timeout in runs}
        for future in as_completed(futures):
            row, mode = futures[future]
            code, data, last, seconds = future.result()
            words, right = outcome(row, code, data, last)
            expected = "pass" if row.fails is None else f"FAIL {row.fails}"
            table.append((row.name, mode, expected, words, "yes" if right else "NO", seconds))
            print(_line(*table[-1]), flush=True)
    order = {(row.name, mode): i for i, (row, mode, _, _) in enumerate(runs)}
    print("\n" + HEADER)
    for entry in sorted(table, key=lambda entry: order[entry[0], entry[1]]):
        print(_line(*entry))
    if not args.no_bench:
        bench = subprocess.run(
            [sys.executable, "-m", "conformance", "bench", "reference-sdpa", "--device",
             args.device, "--dtype", "bfloat16" if args.device.startswith("cuda") else "float32",
             "--backward", "--batch", "4", "--heads", "16", "--head-dim", "128", "--lengths",
             "1024,4096,8192" if args.device.startswith("cuda") else "128", "--backends",
             "--rounds", "5"], cwd=ROOT, capture_output=True, text=True)
        print("\n" + bench.stdout.strip() + ("\n" + bench.stderr.strip()[-2000:]
                                              if bench.returncode else ""), flush=True)
    return 0 if all(right == "yes" for *_, right, _ in table) else 1

if __name__ == "__main__":
    sys.exit(main())
