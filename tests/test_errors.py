"""conformance/errors.py's table lists every error the suite defines, where it lives: each
``ConformanceError`` subclass in the package is in it, and it names nothing else."""

from __future__ import annotations

import importlib
import pkgutil
import re

import conformance
from conformance import errors
from conformance.errors import ConformanceError

ROW = re.compile(r"^(\w+)\s{2,}([\w.]+)\s{2,}\S")


def _table() -> set[tuple[str, str]]:
    """(class, module) of each row of the table in the module's docstring."""
    bars = [i for i, line in enumerate(errors.__doc__.splitlines()) if line.startswith("=====")]
    assert len(bars) == 3, "the table is a simple reST table: a header, its rows, a closing rule"
    rows = errors.__doc__.splitlines()[bars[1] + 1:bars[2]]
    found = [ROW.match(line) for line in rows]
    assert all(found), [line for line, match in zip(rows, found, strict=True) if not match]
    return {(match[1], f"conformance.{match[2]}") for match in found}


def _defined() -> set[tuple[str, str]]:
    """(class, module) of every ConformanceError subclass the package's modules define."""
    for module in pkgutil.walk_packages(conformance.__path__, "conformance."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found, todo = {ConformanceError}, [ConformanceError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return {(cls.__qualname__, cls.__module__) for cls in found
            if cls.__module__.startswith("conformance.")}


def test_every_error_is_in_the_table_and_the_table_names_nothing_else():
    table, defined = _table(), _defined()
    assert defined - table == set(), "add these to conformance/errors.py's table"
    assert table - defined == set(), "the table names these, which the package does not define"
