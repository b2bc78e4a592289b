"""The package's shape: a public facade that costs nothing, no import cycle, small files, light
imports where they matter (the results type, the sandboxed worker).

The layers themselves (each imports only those below it) are import-linter's contract in
pyproject.toml, checked by ``make lint``; ``benchmarks/import_graph.py`` prints these numbers.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

import conformance

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "benchmarks" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

PUBLIC = [
    "CHECK_NAMES", "AlibiBias", "CacheForm", "CacheStyle", "Capabilities", "CausalForm",
    "CheckResult", "Config", "Declarations", "Dtypes", "FusedProjection", "HeadWeights",
    "Implementation", "ImplementationError", "Inferred", "Inputs", "Instance", "MaskConvention",
    "MaskKind", "MaskLayout", "PackedForm", "PackedInProjection", "Packing", "PerHeadModules",
    "PositionEncoding", "PositionForm", "Positions", "ResolveError", "Rotary", "Runner",
    "SeparateProjections", "Setting", "Status", "Subject", "WeightLayout",
    "__version__", "check", "check_many", "implementation", "infer", "infer_function", "register",
    "registered", "resolve",
]


def test_the_public_names_are_these_and_each_resolves():
    assert conformance.__all__ == PUBLIC
    for name in PUBLIC:
        assert getattr(conformance, name) is not None, name
    assert set(PUBLIC) <= set(dir(conformance))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        conformance.nothing  # noqa: B018


def _loaded(statement: str) -> list[str]:
    return import_graph.load_summary(statement)


def test_importing_conformance_loads_nothing_else():
    summary = _loaded("import conformance")
    assert summary["modules"] == ["conformance", "conformance._version"]
    assert not summary["hypothesis"]


def test_the_results_type_is_light():
    summary = _loaded("import conformance.model.results")
    assert summary["conformance_modules"] <= 5, summary["modules"]
    assert not summary["hypothesis"]


def test_the_worker_loads_no_check_and_not_hypothesis():
    """What ``python -m conformance.worker`` imports before it reads a request, and what loading
    and inferring an undeclared class there adds."""
    statement = ("import conformance.worker.server\n"
                 "from conformance.loading.registry import resolve\n"
                 "resolve('tests/fixtures/user_styles.py::FusedQKV')")
    summary = _loaded(statement)
    assert summary["checks"] == []
    assert not summary["hypothesis"]
    assert not [m for m in summary["modules"] if m.startswith(("conformance.run",
                                                               "conformance.frontends",
                                                               "conformance.grading"))]


def test_no_import_cycle():
    """Static, from every module's source: TYPE_CHECKING and deferred imports count."""
    assert import_graph.cycles(import_graph.graph()) == []


def test_no_file_over_400_lines():
    long = {str(path.relative_to(ROOT)): n for path in (ROOT / "conformance").rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 400}
    assert long == {}


def test_every_layer_package_imports_nothing_on_its_own():
    """A layer's ``__init__`` holds a docstring only, so importing one module of a layer never
    loads the rest of it (``conformance.worker`` and ``conformance.inference`` are public
    packages, and re-export their names)."""
    for init in (ROOT / "conformance").glob("*/__init__.py"):
        if init.parent.name in ("worker", "inference", "implementations", "grading", "benchmark"):
            continue
        tree = ast.parse(init.read_text())
        assert [type(node).__name__ for node in tree.body] == ["Expr"], init  # the docstring


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_graph.cycles(edges) == [["a", "b", "c"]]



def test_a_check_is_one_module_that_names_and_orders_itself():
    """The catalogue is found, not listed: every check class in ``checks/invariants`` sets its
    name and order, the orders are distinct, and the names read from the modules' text (what
    the light front ends validate against) are the checks imported, in that order."""
    import importlib
    import inspect
    import pkgutil

    import conformance.checks.invariants as invariants
    from conformance.checks.catalogue import CATALOGUE, GATE
    from conformance.checks.invariants.base import Check
    from conformance.model.check_names import CHECK_NAMES

    classes = []
    for info in pkgutil.iter_modules(invariants.__path__):
        module = importlib.import_module(f"{invariants.__name__}.{info.name}")
        classes += [cls for cls in vars(module).values() if inspect.isclass(cls)
                    and issubclass(cls, Check) and cls.__module__ == module.__name__
                    and not inspect.isabstract(cls)]
    assert classes and all("order" in vars(cls) for cls in classes), [
        cls.__name__ for cls in classes if "order" not in vars(cls)]
    orders = [check.order for check in CATALOGUE]
    assert orders == sorted(set(orders))
    assert {type(check) for check in CATALOGUE} == set(classes)
    assert (GATE.name, *(check.name for check in CATALOGUE)) == CHECK_NAMES
