"""How much of each collection the float64 reference judges: the share of its correct layers whose
``reference`` check ran (through their weights or through their attention core), not skipped.

    python benchmarks/reference_coverage.py [--json PATH]

The correct layers are each collection's own list (``STYLES``, ``CORRECT``, ``LAYERS``; the
bundled implementations but the mutant zoo), nothing declared, quick profile, CPU, both cores.
Prints, per collection, how many layers, how many the reference judged by which route, and the
skipped ones with why. The target (issue 53): at least 90 % of every collection.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLLECTIONS = {
    "homework_styles": ("STYLES",), "user_styles": ("STYLES",), "wild_styles": ("STYLES",),
    "modern_styles": ("STYLES",), "new_architectures": ("CORRECT",),
    "new_designs": ("CORRECT",), "library_transformers": ("LAYERS",),
    "library_others": ("LAYERS",), "library_caches": ("LAYERS",),
    "library_held_out": ("LAYERS",),
}
"""Each collection of tests/fixtures and the lists of its correct layers."""


def targets() -> tuple[list[tuple[str, object]], dict[str, str], dict[str, str]]:
    """(what check_many takes, each target's collection, the layers that did not load: why)."""
    from conformance.implementations import bundled
    from conformance.loading.registry import ResolveError, resolve

    found, collection, unloaded = [], {}, {}
    for impl in bundled():
        if not impl.name.startswith("mutant-"):
            found.append((impl.name, impl))
            collection[impl.name] = "bundled"
    for module, lists in COLLECTIONS.items():
        loaded = importlib.import_module(f"tests.fixtures.{module}")
        for name in lists:
            for cls in getattr(loaded, name, []):
                spec = f"tests.fixtures.{module}:{cls.__name__}"
                try:
                    found.append((spec, resolve(spec)[0]))
                    collection[spec.split(".")[-1]] = module
                except ResolveError as error:
                    unloaded[spec] = str(error).splitlines()[0]
    return found, collection, unloaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the per-collection figures there")
    args = parser.parse_args()
    from conformance.model.results import Status
    from conformance.run.many import check_many

    found, collection, unloaded = targets()
    results = check_many(found, devices=["cpu"], jobs=2, checks=("reference",))
    totals, judged = Counter(), Counter()
    routes: dict[str, Counter] = {}
    skipped: dict[str, list[str]] = {}
    for result in results:
        where = collection[result.implementation]
        totals[where] += 1
        if result.status is Status.SKIPPED:
            skipped.setdefault(where, []).append(f"{result.implementation}: {result.reason}")
        else:
            judged[where] += 1
            route = result.route.value if result.route else "weights"
            routes.setdefault(where, Counter())[route] += 1
    for spec, why in unloaded.items():
        where = spec.split(".")[-1].split(":")[0]
        totals[where] += 1
        skipped.setdefault(where, []).append(f"{spec}: not loaded ({why})")
    figures = {}
    for where in sorted(totals):
        share = judged[where] / totals[where]
        figures[where] = {"layers": totals[where], "judged": judged[where],
                          "routes": dict(routes.get(where, {})), "share": round(share, 3),
                          "skipped": skipped.get(where, [])}
        print(f"{where:22} {judged[where]:3} / {totals[where]:3}  {share:6.1%}  "
              f"{dict(routes.get(where, {}))}")
        for line in skipped.get(where, []):
            print(f"    skipped {line[:150]}")
    overall = sum(judged.values()) / sum(totals.values())
    print(f"{'all':22} {sum(judged.values()):3} / {sum(totals.values()):3}  {overall:6.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
