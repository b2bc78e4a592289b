"""The checks' own work per module, apart from the command around them: the floor under a check.

    python benchmarks/check_work.py [--homework] [--json PATH]

Each module of ``check_end_to_end.py``'s collections is checked through the command line in one
process (``--jobs 1``), in process (``--no-isolate``) and isolated, nothing declared, and the
seconds of its checks are summed (each check's ``seconds`` in the JSON report: the gate and every
check past it, not the interpreter, the imports, the load or the inference). Shared over two
processes, about half of each sum is what any check of the module waits for, served or cold;
the difference between the two sums is what isolation costs. Prints each module's two sums, then
their medians and worsts. Timings on a shared machine are noise: run it on an idle one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.check_end_to_end import specs  # noqa: E402

MODES = {"in process": ["--no-isolate"], "isolated": ["--isolate"]}


def work(spec: str, flags: list[str]) -> float:
    """The summed seconds of ``spec``'s checks, one process, checked with ``flags``."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "conformance", "check", spec, "--jobs", "1", "--no-progress",
             "--json", str(report), *flags], capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            sys.exit(f"{spec} {' '.join(flags)} exited {done.returncode}: {done.stderr[-500:]}")
        return sum(result["seconds"] for result in json.loads(report.read_text())["results"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--homework", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for spec in specs(args.homework):
        rows.append({"spec": spec, **{mode: work(spec, flags) for mode, flags in MODES.items()}})
        print("  ".join(f"{mode} {rows[-1][mode]:5.2f} s" for mode in MODES), spec, flush=True)
    for mode in MODES:
        sums = [row[mode] for row in rows]
        print(f"{mode}: median {statistics.median(sums):.2f} s, worst {max(sums):.2f} s")
    print(f"isolation adds: median {statistics.median(r['isolated'] - r['in process'] for r in rows):.2f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
