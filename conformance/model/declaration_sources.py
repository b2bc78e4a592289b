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
from dataclasses import fields, replace
from pathlib import Path

from conformance._compat import tomllib
from conformance.model.declaration_specs import SPECS, Form, validate
from conformance.model.declarations import DeclarationError, Declarations, merged

LISTS = tuple(spec.name for spec in SPECS if spec.form is Form.REPEATED and spec.name != "init")
"""Declarations that repeat (a list in TOML, or one value): ``init`` aside, read as pairs."""


def from_mapping(values: dict, origin: str) -> Declarations:
    """Declarations from a TOML table or parsed flags (dashes or underscores)."""
    known = {f.name for f in fields(Declarations)}
    items = {key.replace("-", "_"): value for key, value in values.items()}
    # A table under ``layer``, or under a name no declaration has (``{"LlamaAttention": {...}}``):
    # the declarations for the attention layers of that class inside a model.
    layers = [items.pop("layer")] if isinstance(items.get("layer"), dict) else []
    layers += [{key: items.pop(key)} for key in list(items)
               if key not in known and isinstance(items[key], dict)]
    if layers:
        given = items.get("layer") or []
        items["layer"] = [*([given] if isinstance(given, str) else given),
                          *_layer_items(layers)]
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
        elif key in LISTS:
            values[key] = tuple([value] if isinstance(value, str) else value)
        elif key == "dtypes" and not isinstance(value, str):
            values[key] = ",".join(value)
        else:
            values[key] = str(value)
    try:
        return validate(Declarations(**values))
    except DeclarationError as error:
        raise DeclarationError(f"{origin}: {error}") from None


def _layer_items(tables: list[dict]) -> list[str]:
    """``CLASS:NAME=VALUE`` items of ``{class: {name: value}}`` tables (a list's values, an
    ``init`` table's keywords, one item each)."""
    items = []
    for table in tables:
        for cls, declared in table.items():
            if not isinstance(declared, dict):
                raise DeclarationError(f"layer {cls!r}: give a table of declarations for that "
                                       "class, e.g. {\"kv-grouping\": \"tiled\"}")
            for name, value in declared.items():
                values = ([f"{k}={v}" for k, v in value.items()] if isinstance(value, dict) else
                          value if isinstance(value, list) else [value])
                items += [f"{cls}:{name}={v}" for v in values]
    return items


def for_layer(declared: Declarations | None, class_name: str) -> Declarations | None:
    """``declared`` for the attention layers of class ``class_name`` inside a model: that
    class's table (the ``layer`` declarations) over the rest, which apply to every layer."""
    if declared is None or not declared.layer:
        return declared
    table = declared.layer_tables().get(class_name)
    rest = replace(declared, layer=None)
    if not table:
        return rest
    return merged(rest, from_mapping(table, f"layer {class_name}"))


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
