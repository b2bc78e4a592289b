"""How many submissions a minute `attention-conformance grade` gets through.

    python benchmarks/grading_throughput.py [--students 100] [--jobs 2]

Builds a class of ``--students`` ordinary submissions by copying the example assignment's
(``examples/attention-assignment/submissions``: correct and buggy ones, in every layout it has:
Canvas files, a notebook, a zip, Moodle folders, GitHub Classroom repositories; not the hostile
one, whose forward never returns and which would only measure the rubric's time limit, nor the
unreadable zip) under fresh student ids, grades it with the example rubric into a scratch
folder, and prints the rate, beside the cost of one worker's start-up and of one request,
measured in the same run (the floor under the rate is the checks themselves: see README,
"Speed").

``ATTENTION_CONFORMANCE_WARM_START=0`` measures it without the zygote (every worker started; the
grader then runs bubblewrap where it is installed), as before the warm start.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "attention-assignment"
CANVAS = re.compile(r"^(?P<name>[a-z]+)_(?:LATE_)?(?P<user>\d+)_(?P<sub>\d+)_(?P<file>.+)$")
MOODLE = re.compile(r"^(?P<name>.+)_(?P<user>\d+)_assignsubmission_file_$")
GITHUB = "attention-assignment-"
LEFT_OUT = {"mallorymal", "nobodyjane"}
"""The example's hostile submission and its unreadable zip (examples/attention-assignment/README.md)."""


def _ordinary() -> list[Path]:
    found = []
    for path in sorted((EXAMPLE / "submissions").iterdir()):
        canvas = CANVAS.match(path.name)
        file = path.is_file() and canvas is not None and canvas["name"] not in LEFT_OUT
        folder = path.is_dir() and bool(MOODLE.match(path.name) or path.name.startswith(GITHUB))
        if file or folder:
            found.append(path)
    return found


def build_class(folder: Path, students: int) -> None:
    """``students`` submissions, cycling through the example's ordinary ones, each under a new
    id in its own layout."""
    sources = _ordinary()
    for index in range(students):
        source = sources[index % len(sources)]
        canvas = CANVAS.match(source.name)
        if canvas:
            shutil.copy(source, folder / f"{canvas['name']}{index}_{5000 + index}_"
                                          f"{90000 + index}_{canvas['file']}")
        elif MOODLE.match(source.name):
            shutil.copytree(source, folder / f"Student {index}_{7000 + index}"
                                             "_assignsubmission_file_")
        else:
            shutil.copytree(source, folder / f"{GITHUB}{source.name.removeprefix(GITHUB)}{index}")


def worker_costs() -> tuple[float, float, float]:
    """(seconds to start the first worker and load a submission, the same for a later one,
    seconds per forward request)."""
    from conformance.generation.cases import Case
    from conformance.worker import IsolatedSubject

    source = sorted((EXAMPLE / "reference").glob("*.py"))[0]
    times = []
    for _ in range(4):
        start = time.perf_counter()
        with IsolatedSubject(source.parent, f"{source.name}::MultiHeadAttention",
                             expected_failures={}, sandbox="filesystem") as subject:
            times.append(time.perf_counter() - start)
    with IsolatedSubject(source.parent, f"{source.name}::MultiHeadAttention",
                         expected_failures={}, sandbox="filesystem") as subject:
        case = Case(batch=2, q_len=5, kv_len=5, num_heads=2, head_dim=4)
        instance = subject.instantiate(case.config, 0)
        inputs = case.inputs(subject.capabilities.call, use_mask=False)
        instance.forward(inputs)
        start = time.perf_counter()
        for _ in range(200):
            instance.forward(inputs)
        request = (time.perf_counter() - start) / 200
    return times[0], statistics.median(times[1:]), request


def main() -> None:
    from conformance.worker.sandbox import resolve_kind

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
    first, later, request = worker_costs()
    print(f"{args.students} submissions in {seconds:.0f} s with --jobs {args.jobs}: "
          f"{args.students / seconds * 60:.1f} submissions a minute; sandbox "
          f"{resolve_kind('filesystem')}; a worker starts and loads a submission in {first:.2f} s "
          f"(the first), {later:.2f} s (each later one); a forward request takes "
          f"{request * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
