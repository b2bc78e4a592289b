"""Findings as GitHub Actions annotations (where ``GITHUB_ACTIONS=true``): one ``::error`` per
failure and one ``::warning`` per warning, at the implementation's file and class line, so the
run's summary and the pull request's diff show them where the code is."""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from conformance.model.results import CheckResult, Status
from conformance.model.target_spec import TargetSpec

Location = tuple[str, int]
"""A file (relative to the workspace where it is inside it) and a line."""

KINDS = {Status.FAILED: "error", Status.SUITE_ERROR: "error", Status.WARNED: "warning"}


def on_github(environment: dict[str, str] | None = None) -> bool:
    """Whether this runs in a GitHub Actions job."""
    return (environment if environment is not None else os.environ).get("GITHUB_ACTIONS") == "true"


def annotations(results: Sequence[CheckResult],
                locate: Callable[[str], Location | None]) -> Iterable[str]:
    """The workflow commands for ``results``; ``locate`` gives an implementation's place."""
    for result in results:
        kind = KINDS.get(result.status)
        if kind is None:
            continue
        place = locate(result.implementation)
        where = (f"file={_property(place[0])},line={place[1]}," if place else "")
        title = _property(f"{result.implementation} · {result.check} [{result.device}]")
        message = result.reason + (f"\nminimal case: {result.counterexample}"
                                   if result.counterexample else "")
        yield f"::{kind} {where}title={title}::{_data(message)}"


def located(spec: str | TargetSpec, workspace: Path | None = None) -> Location | None:
    """Where ``path/file.py::Name`` defines ``Name`` (read, never run); None elsewhere."""
    target = spec if isinstance(spec, TargetSpec) else TargetSpec.parse(spec)
    if target.file is None:
        return None
    path, name = target.file, target.attribute
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    line = next((node.lineno for node in ast.walk(tree)
                 if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name == name), 1)
    root = (workspace or Path(os.environ.get("GITHUB_WORKSPACE", Path.cwd()))).resolve()
    try:
        shown = path.resolve().relative_to(root).as_posix()
    except ValueError:
        shown = path.as_posix()
    return shown, line


def _data(text: str) -> str:
    """A workflow command's message, escaped as GitHub reads it."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    """A workflow command's property value, escaped."""
    return _data(text).replace(":", "%3A").replace(",", "%2C")
