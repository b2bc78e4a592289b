"""Correct solutions written another way, made from the instructor's reference, for the self-test.

A rubric should not depend on how a correct solution names its parts: a class whose projections
are called ``W_query`` or ``lin_q`` instead of ``q_proj`` must earn the same points. The
self-test grades :func:`renamed` (the reference with every attribute its classes set on ``self``
given an opaque name: ``self.q_proj`` becomes ``self.layer0``) like a student, and warns when an
item is then not evaluated or loses points.

Only attributes that are safe to rename are renamed: set as ``self.NAME = ...`` inside a class,
read only as ``self.NAME`` inside that class (nowhere through another object, nowhere as a
string, as ``getattr`` or ``register_buffer`` would take it), and not a name ``nn.Module``
itself defines. The reference is trusted code: this module reads it, never runs it.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

_MODULE_NAMES = frozenset(dir(nn.Module)) | frozenset(vars(nn.Module()))
"""What ``nn.Module`` defines, on the class and on every instance (``training``)."""


@dataclass
class Renamed:
    """The renamed copy of the reference: where it is and what was renamed (old -> new)."""

    path: Path
    names: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        shown = ", ".join(f"{old} -> {new}" for old, new in list(self.names.items())[:6])
        more = f", and {len(self.names) - 6} more" if len(self.names) > 6 else ""
        return f"the reference with its attributes renamed ({shown}{more})"


def _self_attribute(node: ast.AST) -> str | None:
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self"):
        return node.attr
    return None


def _assigned(cls: ast.ClassDef) -> list[str]:
    """Names the class's methods set as ``self.NAME = ...``, in order of first assignment."""
    names: dict[str, None] = {}
    for node in ast.walk(cls):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        while targets:
            target = targets.pop(0)
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            elif (name := _self_attribute(target)) is not None:
                names.setdefault(name, None)
    return list(names)


def _body_names(cls: ast.ClassDef) -> set[str]:
    """Methods, properties and class attributes the class body defines."""
    found = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    return found


def _plan(trees: dict[Path, ast.Module]) -> dict[tuple[Path, str], dict[str, str]]:
    """Per (file, class): old name -> new name, for the attributes safe to rename."""
    # Every attribute access and string constant anywhere: an attribute reached another way
    # (another object's ``.q_proj``, ``getattr(self, "q_proj")``) keeps its name.
    strings: set[str] = set()
    other_access: set[str] = set()
    classes: list[tuple[Path, ast.ClassDef]] = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
            elif isinstance(node, ast.ClassDef):
                classes.append((path, node))
    owners: dict[str, int] = {}
    for _, cls in classes:
        for name in set(_assigned(cls)):
            owners[name] = owners.get(name, 0) + 1
    # ``self.NAME`` read in each class (a subclass reading what its base sets keeps the name).
    read_in = {id(cls): {_self_attribute(n) for n in ast.walk(cls)} for _, cls in classes}
    inside = {id(node) for _, cls in classes for node in ast.walk(cls)}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (_self_attribute(node) is None
                                                    or id(node) not in inside):
                other_access.add(node.attr)
    plan: dict[tuple[Path, str], dict[str, str]] = {}
    counter = 0
    for path, cls in classes:
        body = _body_names(cls)
        mapping = {}
        for name in _assigned(cls):
            read_elsewhere = any(name in read_in[id(other)] for _, other in classes
                                 if other is not cls)
            if (name.startswith("__") or name in _MODULE_NAMES or name in body
                    or name in strings or name in other_access or owners[name] > 1
                    or read_elsewhere):
                continue
            mapping[name] = f"layer{counter}"
            counter += 1
        if mapping:
            plan[(path, cls.name)] = mapping
    return plan


class _Renamer(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        name = _self_attribute(node)
        if name in self.mapping:
            node.attr = self.mapping[name]
        return node


def renamed(reference: Path, into: Path) -> Renamed | None:
    """A copy of ``reference`` (a file or a folder) in ``into`` whose classes' attributes have
    opaque names; None when nothing could be renamed or the source does not parse."""
    files = [reference] if reference.is_file() else sorted(reference.rglob("*.py"))
    trees: dict[Path, ast.Module] = {}
    for path in files:
        try:
            trees[path] = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            return None
    plan = _plan(trees)
    if not plan:
        return None
    if reference.is_file():
        into.mkdir(parents=True, exist_ok=True)
        target = into / reference.name
    else:
        shutil.copytree(reference, into, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        target = into
    names: dict[str, str] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and (path, node.name) in plan:
                mapping = plan[(path, node.name)]
                _Renamer(mapping).visit(node)
                names.update(mapping)
        destination = target if reference.is_file() else into / path.relative_to(reference)
        destination.write_text(ast.unparse(ast.fix_missing_locations(tree)) + "\n",
                               encoding="utf-8")
    return Renamed(target, names)
