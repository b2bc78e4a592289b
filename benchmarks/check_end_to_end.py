"""How long `attention-conformance check FILE::Class` takes, as a user types it, one at a time.

    python benchmarks/check_end_to_end.py [--rounds 1] [--no-isolate] [--served [--recheck]]
        [--homework] [--json PATH]

Each module of the collections of correct modules (``tests/fixtures/{user,wild,modern}_styles.py``,
the 40 of the README's measurement; ``--homework`` adds the ten homework styles) is checked
through the command line, nothing declared, in a fresh interpreter: interpreter start, import,
inference and the whole catalogue (the default: isolated in a worker process; ``--no-isolate``:
in the CLI's own process). Prints each module's wall time, the median and the worst, and whether
every one exited 0. ``--served`` starts ``attention-conformance serve`` first and times each
check handed to it (the warm start; the server's own start is not counted, as a user starts it
once); with ``--recheck`` each module is checked once untimed before its timed rounds, as a user
checks again after an edit (the first check of a file also has the server's zygote import the
installed packages it imports, once). Timings on a shared machine are noise: run it on an idle
one.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures import homework_styles, modern_styles, user_styles, wild_styles  # noqa: E402


def specs(homework: bool) -> list[str]:
    collections = [("user_styles", user_styles), ("wild_styles", wild_styles),
                   ("modern_styles", modern_styles)]
    if homework:
        collections.append(("homework_styles", homework_styles))
    return [f"tests/fixtures/{name}.py::{cls.__name__}"
            for name, module in collections for cls in module.STYLES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-isolate", action="store_true")
    parser.add_argument("--homework", action="store_true")
    parser.add_argument("--served", action="store_true")
    parser.add_argument("--recheck", action="store_true",
                        help="check each module once, untimed, before its timed rounds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    server = _serve() if args.served else None
    rows = []
    for spec in specs(args.homework):
        command = [sys.executable, "-m", "conformance", "check", spec,
                   *(["--no-isolate"] if args.no_isolate else [])]
        if args.recheck:
            subprocess.run(command, capture_output=True, cwd=ROOT)
        times, codes = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            times.append(time.perf_counter() - start)
            codes.append(done.returncode)
        rows.append({"spec": spec, "seconds": statistics.median(times), "exit": max(codes)})
        print(f"{rows[-1]['seconds']:6.2f} s  exit {rows[-1]['exit']}  {spec}", flush=True)
    seconds = [row["seconds"] for row in rows]
    print(f"{len(rows)} modules: median {statistics.median(seconds):.2f} s, worst "
          f"{max(seconds):.2f} s; every one exited 0: {all(r['exit'] == 0 for r in rows)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if server is not None:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)


def _serve() -> subprocess.Popen:
    """A server for this installation, once it listens."""
    server = subprocess.Popen([sys.executable, "-m", "conformance", "serve"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = server.stdout.readline()
    if "serving at" not in line:
        sys.exit(f"the server did not start: {line}")
    return server


if __name__ == "__main__":
    main()
