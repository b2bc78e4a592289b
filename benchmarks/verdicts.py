"""Every verdict of the bundled catalogue and the test collections, written down to compare two
versions of the suite: run it before a change and after, then ``--compare`` the two files.

    .venv/bin/python benchmarks/verdicts.py --out before.json          # on the old commit
    .venv/bin/python benchmarks/verdicts.py --out after.json           # on the new one
    .venv/bin/python benchmarks/verdicts.py --compare before.json after.json

A collection is a module of ``tests/fixtures``; its layers are its ``STYLES``, ``CORRECT``,
``BROKEN`` and ``LAYERS`` lists where it has them. A target that no longer loads, a verdict that
changed, a check that appeared or went are each one line of the comparison (exit 1 where any).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COLLECTIONS = ("user_styles", "wild_styles", "modern_styles", "homework_styles", "new_designs",
               "new_architectures", "real_layer_causes", "chunk_forms", "padded_rows",
               "library_transformers", "library_others", "library_caches", "library_held_out",
               "paths", "structural_sizes", "structural_leaks", "config_forms", "courses.d2l",
               "courses.nanogpt",
               "courses.mingpt", "courses.lecture", "courses.annotated", "courses.cs231n",
               "operators")
"""The fixture modules whose layers are checked (the hostile, slow and malformed ones are the
worker's and the front ends' tests, not verdicts)."""

LISTS = ("STYLES", "CORRECT", "BROKEN", "LAYERS")


def collection_targets(name: str) -> list[str]:
    module = importlib.import_module(f"tests.fixtures.{name}")
    classes: list[type] = []
    for attribute in LISTS:
        for cls in getattr(module, attribute, ()) or ():
            if isinstance(cls, type) and cls not in classes:
                classes.append(cls)
    return [f"tests.fixtures.{name}:{cls.__name__}" for cls in classes]


def verdicts(collections: tuple[str, ...], bundled: bool, jobs: int) -> dict[str, dict[str, str]]:
    from conformance.loading.registry import ResolveError, registered, resolve
    from conformance.run.many import check_many

    targets, found = [], {}
    if bundled:
        targets += [(name, impl) for name, impl in registered().items()]
    for name in collections:
        for spec in collection_targets(name):
            try:
                targets.append((spec, resolve(spec)[0]))
            except ResolveError as error:
                found[spec] = {"load": f"not loaded: {str(error)[:160]}"}
    for result in check_many(targets, devices=["cpu"], jobs=jobs):
        found.setdefault(result.implementation, {})[result.check] = result.status.name
    return found


def compare(before: dict, after: dict) -> list[str]:
    lines = []
    for target in sorted(set(before) | set(after)):
        old, new = before.get(target), after.get(target)
        if old is None or new is None:
            lines.append(f"{target}: {'new' if old is None else 'gone'}")
            continue
        for check in sorted(set(old) | set(new)):
            if old.get(check) != new.get(check):
                lines.append(f"{target} · {check}: {old.get(check)} -> {new.get(check)}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the verdicts here (JSON)")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--only", nargs="*", default=None, help="these collections only")
    parser.add_argument("--no-bundled", action="store_true", help="the collections only")
    parser.add_argument("--jobs", type=int, default=2)
    arguments = parser.parse_args()
    if arguments.compare:
        before, after = (json.loads(path.read_text()) for path in arguments.compare)
        lines = compare(before, after)
        print("\n".join(lines) if lines else f"the same verdicts ({len(after)} targets)")
        return 1 if lines else 0
    started = time.perf_counter()
    found = verdicts(tuple(arguments.only) if arguments.only is not None else COLLECTIONS,
                     not arguments.no_bundled, arguments.jobs)
    text = json.dumps(found, indent=1, sort_keys=True)
    if arguments.out:
        arguments.out.write_text(text + "\n")
    else:
        print(text)
    print(f"{len(found)} targets in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
