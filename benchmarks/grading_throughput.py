"""How many submissions a minute `attention-conformance grade` gets through.

    python benchmarks/grading_throughput.py [--students 100] [--jobs 2]

Builds a class of ``--students`` ordinary submissions by copying the example assignment's
Canvas-style files (``examples/attention-assignment/submissions/*_*_*_*.py``: correct ones and
buggy ones; not the hostile one, whose forward never returns and which would only measure the
rubric's time limit) under fresh student ids, grades it with the example rubric into a scratch
folder, and prints the rate, beside the cost of one worker's start-up and of one request,
measured in the same run (the floor under the rate is the checks themselves: see README,
"Speed").
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "attention-assignment"
CANVAS = re.compile(r"^(?P<name>[a-z]+)_(?:LATE_)?(?P<user>\d+)_(?P<sub>\d+)_(?P<file>.+\.py)$")
HOSTILE = {"mallorymal"}
"""The example's hostile submission (examples/attention-assignment/README.md): left out."""


def build_class(folder: Path, students: int) -> None:
    """``students`` Canvas files, cycling through the example's, each under a new id."""
    sources = sorted(p for p in (EXAMPLE / "submissions").iterdir()
                     if p.is_file() and CANVAS.match(p.name)
                     and CANVAS.match(p.name)["name"] not in HOSTILE)
    for index in range(students):
        source = sources[index % len(sources)]
        parts = CANVAS.match(source.name)
        name = f"{parts['name']}{index}_{5000 + index}_{90000 + index}_{parts['file']}"
        shutil.copy(source, folder / name)


def worker_costs() -> tuple[float, float]:
    """(seconds to start a worker and load a submission, seconds per forward request)."""
    from conformance.cases import Case
    from conformance.worker import IsolatedSubject

    source = sorted((EXAMPLE / "reference").glob("*.py"))[0]
    start = time.perf_counter()
    with IsolatedSubject(source.parent, f"{source.name}::MultiHeadAttention",
                         expected_failures={}) as subject:
        started = time.perf_counter() - start
        case = Case(batch=2, q_len=5, kv_len=5, num_heads=2, head_dim=4)
        instance = subject.instantiate(case.config, 0)
        inputs = case.inputs(subject.capabilities.call, use_mask=False)
        instance.forward(inputs)
        start = time.perf_counter()
        for _ in range(200):
            instance.forward(inputs)
        request = (time.perf_counter() - start) / 200
    return started, request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="grading-throughput-") as scratch:
        folder = Path(scratch) / "class"
        folder.mkdir()
        build_class(folder, args.students)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "conformance", "grade", str(folder), "--rubric",
                        str(EXAMPLE / "rubric.toml"), "--out", str(Path(scratch) / "out"),
                        "--jobs", str(args.jobs)], check=True, cwd=ROOT)
        seconds = time.perf_counter() - start
    started, request = worker_costs()
    print(f"{args.students} submissions in {seconds:.0f} s with --jobs {args.jobs}: "
          f"{args.students / seconds * 60:.1f} submissions a minute; a worker starts and loads "
          f"a submission in {started:.2f} s; a forward request takes {request * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
