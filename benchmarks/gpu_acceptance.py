"""The GPU acceptance run: torch's kernels and the bundled Triton kernel checked bare on the
device, in process and isolated, each broken twin failing its check, the bundled catalogue on
the device, and bench in TFLOP/s; one table at the end.

    python benchmarks/gpu_acceptance.py [--device cuda] [--only NAME,...] [--modes ...]
    bash benchmarks/gpu_acceptance.sh          # the same, on CUDA, within 8 minutes on one GPU

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
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "conformance.implementations.torch_kernels"
TRITON = "conformance.implementations.triton_attention"


@dataclass(frozen=True)
class Row:
    """One kernel to check: its name in the table, its IMPL, and the check its bug fails
    (None: correct, it must pass)."""

    name: str
    spec: str
    fails: str | None = None


ROWS = (
    Row("sdpa_flash", f"{KERNELS}:sdpa_flash"),
    Row("sdpa_efficient", f"{KERNELS}:sdpa_efficient"),
    Row("sdpa_cudnn", f"{KERNELS}:sdpa_cudnn"),
    Row("flex_compiled", f"{KERNELS}:flex_compiled"),
    Row("triton_attention", f"{TRITON}:triton_attention"),
    Row("sdpa_flash_scale_dropped", f"{KERNELS}:sdpa_flash_scale_dropped", fails="kernel"),
    Row("triton_attention_tail_unmasked", f"{TRITON}:triton_attention_tail_unmasked",
        fails="reference"),
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
    right = (code == 0 and not failed) if row.fails is None else row.fails in failed
    return words, right


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", help="comma-separated row names (default: every one)")
    parser.add_argument("--modes", default=",".join(MODES), help="in process, isolated")
    parser.add_argument("--checks", help="comma-separated checks (default: the catalogue)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per row")
    parser.add_argument("--no-catalogue", action="store_true")
    parser.add_argument("--no-bench", action="store_true")
    args = parser.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else None
    checks = [f"--check={name}" for name in args.checks.split(",")] if args.checks else []
    table = []
    for row in ROWS:
        if wanted is not None and row.name not in wanted:
            continue
        for mode in args.modes.split(","):
            code, data, last, seconds = _run(["check", row.spec, "--device", args.device,
                                              *MODES[mode], *checks], args.timeout)
            words, right = outcome(row, code, data, last)
            expected = "pass" if row.fails is None else f"FAIL {row.fails}"
            table.append((row.name, mode, expected, words, "yes" if right else "NO", seconds))
    if not args.no_catalogue:
        code, data, last, seconds = _run(["check", "--device", args.device, *checks],
                                         args.timeout * 4)
        words, right = outcome(Row("bundled catalogue", ""), code, data, last)
        table.append(("bundled catalogue", "isolated per file", "pass", words,
                      "yes" if right else "NO", seconds))
    print(f"{'row':<32} {'mode':<18} {'expected':<16} {'right':<5} {'s':>6}  got")
    for name, mode, expected, words, right, seconds in table:
        print(f"{name:<32} {mode:<18} {expected:<16} {right:<5} {seconds:>6.1f}  {words}")
    if not args.no_bench:
        bench = subprocess.run(
            [sys.executable, "-m", "conformance", "bench", "reference-sdpa", "--device",
             args.device, "--dtype", "bfloat16" if args.device.startswith("cuda") else "float32",
             "--backward", "--batch", "4", "--heads", "16", "--head-dim", "128", "--lengths",
             "1024,4096,8192" if args.device.startswith("cuda") else "128", "--backends",
             "--rounds", "5"], cwd=ROOT, capture_output=True, text=True)
        print("\n" + bench.stdout.strip())
    return 0 if all(right == "yes" for *_, right, _ in table) else 1


if __name__ == "__main__":
    sys.exit(main())
