"""Where the time of checking one implementation goes, phase by phase, as a user pays it.

    python benchmarks/phase_timing.py [IMPL ...] [--rounds 3] [--json PATH]

Each round of each implementation runs in a fresh interpreter (``--one IMPL``, the way
``attention-conformance check IMPL`` runs: one process, one torch thread per check), which
reports its phases:

- ``startup``: importing torch and the package (the CLI's import);
- ``load``: importing the module that holds the implementation and, for an undeclared class,
  inferring its interface (probing included);
- ``gate``, then every check of the catalogue (quick profile);
- ``total``: the interpreter's whole wall time, as measured from outside.

The figures are medians over the rounds. With no IMPL, a spread: bundled implementations
(declared), user-style classes (inferred, nothing declared) and a declared user file. On a
shared machine timings are noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPREAD = [
    "textbook", "reference-sdpa", "reference-torch-mha", "seed000-MultiHeadAttention",
    "seed003-MultiHeadAttention", "mutant-dropout-on-logits",
    "tests.fixtures.user_styles:FusedQKV", "tests.fixtures.user_styles:SDPAInside",
    "tests.fixtures.user_styles:PerHeadList", "tests/fixtures/wild_styles.py::Head",
    "tests/fixtures/wild_styles.py::TorchMHAPaddingAttention",
    "tests/fixtures/wild_styles.py::GroupedQueryAttention",
    "tests/fixtures/wild_styles.py::SeqFirstMultiheadAttention",
    "tests/fixtures/user_impls.py::plain",
]


def one(spec: str) -> dict[str, float]:
    """The phases of checking ``spec`` in this (fresh) interpreter."""
    start = time.perf_counter()
    from conformance.loading.registry import resolve
    from conformance.model.check_names import CHECK_NAMES
    from conformance.run.runner import Runner
    from conformance.subject.in_process import InProcessSubject

    phases = {"startup": time.perf_counter() - start}
    start = time.perf_counter()
    (impl,) = resolve(spec)
    phases["load"] = time.perf_counter() - start
    subject, runner = InProcessSubject(impl), Runner("quick")
    for result in runner.run(subject, devices=["cpu"], checks=CHECK_NAMES):
        phases[result.check] = result.seconds
    return phases


def measure(spec: str, rounds: int) -> dict[str, float]:
    """Median phases of ``spec`` over ``rounds`` fresh interpreters, with their wall time."""
    samples: list[dict[str, float]] = []
    for _ in range(rounds):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--one", spec], cwd=ROOT, check=True,
                              capture_output=True, text=True)
        phases = json.loads(done.stdout.strip().splitlines()[-1])
        phases["total"] = time.perf_counter() - start
        samples.append(phases)
    return {phase: statistics.median(s[phase] for s in samples) for phase in samples[0]}


def render(results: dict[str, dict[str, float]]) -> str:
    """A markdown table: per implementation, the phases and its slowest check; then the median
    of each check over the implementations."""
    lines = ["| implementation | total s | startup | load (+inference) | gate | checks | "
             "slowest check |", "| --- | --- | --- | --- | --- | --- | --- |"]
    fixed = ("startup", "load", "gate", "total")
    for spec, phases in results.items():
        checks = {k: v for k, v in phases.items() if k not in fixed}
        slowest = max(checks, key=checks.get)
        lines.append(f"| `{spec}` | {phases['total']:.2f} | {phases['startup']:.2f} | "
                     f"{phases['load']:.2f} | {phases['gate']:.2f} | "
                     f"{sum(checks.values()):.2f} | {slowest} {checks[slowest]:.2f} |")
    totals = [p["total"] for p in results.values()]
    lines.append(f"\nmedian total {statistics.median(totals):.2f} s, worst {max(totals):.2f} s "
                 f"over {len(totals)} implementations")
    names = [k for k in next(iter(results.values())) if k not in fixed]
    lines.append("per check, median (max) over implementations: " + "; ".join(
        f"{name} {statistics.median(p.get(name, 0.0) for p in results.values()):.2f} "
        f"({max(p.get(name, 0.0) for p in results.values()):.2f})" for name in names))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("impls", nargs="*", metavar="IMPL", help="default: a spread")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, metavar="PATH")
    parser.add_argument("--one", metavar="IMPL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one)))
        return
    results = {}
    for spec in args.impls or SPREAD:
        results[spec] = measure(spec, args.rounds)
        print(f"{spec}: {results[spec]['total']:.2f} s", file=sys.stderr, flush=True)
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
