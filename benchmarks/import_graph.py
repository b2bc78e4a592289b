"""The package's import graph: cycles, file sizes, and what importing a module loads.

    .venv/bin/python benchmarks/import_graph.py [--json out.json]

Cycles are found statically, from each module's AST: every ``import``/``from ... import`` of a
``conformance`` module, at module level, under ``if TYPE_CHECKING:`` and inside functions alike
(an import deferred into a function still ties the two modules together). Importing ``pkg.mod``
counts as importing ``pkg`` too, since Python runs ``pkg/__init__.py`` first. What a module loads
is measured dynamically, in a fresh interpreter: the ``conformance`` modules in ``sys.modules``
after ``import conformance.model.results`` and after the worker's own imports (``conformance.worker.server``,
what ``python -m conformance.worker`` runs before reading its first request), and whether
hypothesis is among them.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "conformance"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The conformance modules ``name`` imports, anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import sub` imports the submodule (pkg itself counts as a parent, below);
            # `from module import name` imports the module.
            names = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in known else stem
                     for alias in node.names]
        else:
            continue
        for target in names:
            # The module itself if it is one, else the nearest enclosing package that is.
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target:
                targets.add(target)
    # Importing a.b.c runs a/__init__ and a/b/__init__ first, except where those are the
    # importing module's own parents (already run before it: not an import of them unless named).
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    parents = set()
    for target in targets:
        parts = target.split(".")
        parents.update(".".join(parts[:i]) for i in range(1, len(parts)))
    targets |= (parents & known) - own
    targets.discard(name)
    return targets


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(name, path, known) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def loaded(statement: str) -> list[str]:
    """The modules in ``sys.modules`` after ``statement`` runs in a fresh interpreter."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         cwd=ROOT).stdout
    return out.split()


def load_summary(statement: str) -> dict:
    names = loaded(statement)
    ours = [name for name in names if name == "conformance" or name.startswith("conformance.")]
    return {"statement": statement, "conformance_modules": len(ours), "modules": ours,
            "hypothesis": "hypothesis" in names,
            "checks": [name for name in ours if name.startswith(("conformance.checks.invariants",
                                                                 "conformance.checks"))]}


WORKER = "import conformance.worker.server"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--list", action="store_true", help="list the modules each import loads")
    args = parser.parse_args()
    edges = graph()
    found = cycles(edges)
    sizes = sorted(((len(path.read_text().splitlines()), module_name(path))
                    for path in PACKAGE.rglob("*.py")), reverse=True)
    print(f"{len(edges)} modules; {len(found)} import cycle(s)"
          + "".join(f"\n  {len(c)} modules: {', '.join(c)}" for c in found))
    over = [(lines, name) for lines, name in sizes if lines > 400]
    print(f"largest file: {sizes[0][1]} ({sizes[0][0]} lines); over 400 lines: "
          + (", ".join(f"{name} ({lines})" for lines, name in over) or "none"))
    report = {"modules": len(edges), "cycles": found, "largest": sizes[0], "over_400": over}
    for statement in ("import conformance.model.results", WORKER):
        summary = load_summary(statement)
        report[statement] = summary
        print(f"`{statement}`: {summary['conformance_modules']} conformance modules, "
              f"{len(summary['checks'])} check modules, hypothesis "
              f"{'loaded' if summary['hypothesis'] else 'not loaded'}")
        if args.list:
            print("  " + " ".join(summary["modules"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
