"""Declarations read from where users write them: a TOML table (``pyproject.toml``, a rubric's
``interface``) or parsed flags, each value checked against the table of declarations
(:mod:`conformance.model.declaration_specs`) as it is read, so a bad one is one line naming it,
before anything runs.
"""

from __future__ import annotations

import ast
import contextlib
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from conformance._compat import tomllib
from conformance.model.declaration_specs import validate
from conformance.model.declarations import DeclarationError, Declarations


def from_mapping(values: dict, origin: str) -> Declarations:
    """Declarations from a TOML table or parsed flags (dashes or underscores)."""
    known = {f.name for f in fields(Declarations)}
    items = {key.replace("-", "_"): value for key, value in values.items()}
    unknown = sorted(set(items) - known)
    if unknown:
        raise DeclarationError(f"{origin}: unknown declaration(s) {unknown}; known: "
                               f"{', '.join(sorted(k.replace('_', '-') for k in known))}")
    values = {}
    for key, value in items.items():
        if key == "init":
            pairs = value.items() if isinstance(value, dict) else (
                parse_init(item) for item in value)
            values[key] = tuple(pairs)
        elif key == "mask_formats":
            values[key] = tuple([value] if isinstance(value, str) else value)
        elif key == "dtypes" and not isinstance(value, str):
            values[key] = ",".join(value)
        else:
            values[key] = str(value)
    try:
        return validate(Declarations(**values))
    except DeclarationError as error:
        raise DeclarationError(f"{origin}: {error}") from None


def parse_init(item: str) -> tuple[str, object]:
    """``NAME=VALUE`` with VALUE a Python literal (a bare word stays a string)."""
    name, equals, text = item.partition("=")
    if not equals or not name.isidentifier():
        raise DeclarationError(f"init {item!r}: use NAME=VALUE, e.g. causal=True")
    try:
        return name, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return name, text


def pyproject(directory: Path | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` in ``directory`` (default: the current one) or above it."""
    start = (directory or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    return None


def from_pyproject(spec: str | Sequence[str], directory: Path | None = None) -> Declarations:
    """``[tool.attention-conformance.declare."IMPL"]`` from the nearest ``pyproject.toml`` (see
    :func:`pyproject`); ``spec`` may be several spellings of one implementation, the first
    declared one is used."""
    path = pyproject(directory)
    if path is None:
        return Declarations()
    with path.open("rb") as handle:
        try:
            table = tomllib.load(handle).get("tool", {}).get("attention-conformance", {})
        except tomllib.TOMLDecodeError as error:
            raise DeclarationError(f"{path} is not valid TOML: {error}") from None
    tables = table.get("declare", {})
    for name in [spec] if isinstance(spec, str) else spec:
        declared = tables.get(name)
        if declared:
            return from_mapping(declared,
                                f"{path}: [tool.attention-conformance.declare.\"{name}\"]")
    return Declarations()


def spellings(obj: object, directory: Path | None = None) -> list[str]:
    """How ``pyproject.toml`` may name a class or function: ``package.module:Name``, the file
    relative to the ``pyproject.toml`` (``src/attention.py::Name``), or ``Name`` alone."""
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or type(obj).__module__
    found = [f"{module}:{name}"]
    source = getattr(sys.modules.get(module), "__file__", None)
    path = pyproject(directory)
    if source and path is not None:
        with contextlib.suppress(ValueError):
            found.append(f"{Path(source).resolve().relative_to(path.parent).as_posix()}::{name}")
    return [*found, name]
