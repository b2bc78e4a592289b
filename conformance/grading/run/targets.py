"""Finding the rubric's classes in a staged submission without running it.

Every ``.py`` file is parsed (``ast.parse`` runs nothing) for the names it defines at module
level: classes, and names bound by assignment or import (``MultiHeadAttention = MHA``). A target
is found in the file that defines its name (or an alias); files under a ``test``/``tests``
folder or named ``test_*.py`` come last, then deeper paths, then alphabetical order. When the
name is nowhere, the closest class names (difflib) are offered: "did you mean
MultiheadAttention?". A file that does not parse is a syntax error when the target is not found
elsewhere.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass, field
from pathlib import Path

from conformance.grading.score.outcome import RunStatus, TargetOutcome
from conformance.grading.score.rubric import Target
from conformance.model.target_spec import TargetSpec


@dataclass
class ModuleScan:
    """What one file defines at module level."""

    path: str
    classes: list[str] = field(default_factory=list)
    bound: list[str] = field(default_factory=list)
    imported: list[str] = field(default_factory=list)
    syntax_error: str | None = None


@dataclass(frozen=True)
class Location:
    """Where a target's class lives, and how to import it.

    ``spec`` is ``pkg.module:Class`` for a module inside a package (imported by its dotted
    name, ``import_root`` on ``sys.path``), else ``rel/path.py::Class`` (loaded from its file,
    its own folder on ``sys.path`` so sibling imports work). ``paths`` lists the folders,
    relative to the submission, to put first on ``sys.path``.
    """

    file: str
    class_name: str
    module: str
    spec: str
    paths: tuple[str, ...]
    how: str = "class"
    """``class`` (a class statement), ``assignment`` (``Name = ...``) or ``import`` (bound by an
    import: the class may not be the student's own)."""


def scan(directory: Path) -> list[ModuleScan]:
    """Every ``.py`` file under ``directory``, parsed, in sorted order."""
    scans = []
    for path in sorted(directory.rglob("*.py")):
        relative = path.relative_to(directory).as_posix()
        result = ModuleScan(relative)
        try:
            tree = ast.parse(path.read_bytes(), filename=relative)
        except SyntaxError as error:
            result.syntax_error = f"{relative}, line {error.lineno}: {error.msg}"
        except (ValueError, OSError) as error:  # NUL bytes, unreadable
            result.syntax_error = f"{relative}: {error}"
        else:
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    result.classes.append(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    result.bound += [t.id for t in targets if isinstance(t, ast.Name)]
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    result.imported += [(a.asname or a.name).split(".")[0] for a in node.names]
        scans.append(result)
    return scans


def _order(scan_: ModuleScan) -> tuple:
    parts = scan_.path.split("/")
    name = parts[-1]
    testish = (name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
               or any(p in ("test", "tests") for p in parts[:-1]))
    return (testish, len(parts), scan_.path)


NEAR_MISS_CUTOFF = 0.75
"""difflib similarity a name needs to be offered: MultiheadAttention (0.94) and
MultiHeadSelfAttention (0.90) are, CausalSelfAttention for MultiHeadAttention (0.65) is not."""


def near_misses(name: str, candidates: list[str], exclude: tuple[str, ...] = ()) -> list[str]:
    """Up to three names like ``name``: same letters in another case first, then difflib's.
    ``exclude``: names that mean something else (the rubric's other classes)."""
    unique = sorted(set(candidates) - {name} - set(exclude))
    folded = [c for c in unique if c.lower() == name.lower()]
    close = difflib.get_close_matches(name, unique, n=3, cutoff=NEAR_MISS_CUTOFF)
    return list(dict.fromkeys(folded + close))[:3]


def locate(target: Target, scans: list[ModuleScan], directory: Path,
           extra_syntax_errors: list[str] = (), others: tuple[str, ...] = ()) -> Location | TargetOutcome:
    """Where ``target`` is defined, or a TargetOutcome saying why it can't be graded.
    ``others``: the rubric's other class names, never offered as near misses."""
    ordered = sorted(scans, key=_order)
    for how in ("class", "assignment", "import"):
        for wanted in target.names:
            for module in ordered:
                found = {"class": module.classes, "assignment": module.bound,
                         "import": module.imported}[how]
                if wanted in found:
                    return _location(module.path, wanted, directory, how)
    classes = [c for module in ordered for c in module.classes]
    misses = near_misses(target.name, classes, others)
    for alias in target.aliases:
        misses += [m for m in near_misses(alias, classes, others) if m not in misses]
    errors = [m.syntax_error for m in ordered if m.syntax_error] + list(extra_syntax_errors)
    if errors:
        return TargetOutcome(target.name, RunStatus.SYNTAX_ERROR,
                             f"syntax error in {errors[0]}" + (
                                 f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
                             near_misses=misses[:3])
    message = f"no class {target.name} in the submission"
    if misses:
        message = f"no class {target.name}; did you mean {misses[0]}?"
    return TargetOutcome(target.name, RunStatus.NOT_FOUND, message, near_misses=misses[:3])


def _location(relative: str, class_name: str, directory: Path, how: str) -> Location:
    path = Path(relative)
    package_parts: list[str] = []
    folder = path.parent
    while folder != Path(".") and (directory / folder / "__init__.py").is_file():
        package_parts.insert(0, folder.name)
        folder = folder.parent
    if package_parts and all(part.isidentifier() for part in package_parts) \
            and path.stem.isidentifier():
        module = ".".join([*package_parts, path.stem]) if path.stem != "__init__" \
            else ".".join(package_parts)
        root = folder.as_posix()
        paths = tuple(dict.fromkeys([root, "."]))
        return Location(relative, class_name, module, f"{module}:{class_name}", paths, how)
    paths = tuple(dict.fromkeys([path.parent.as_posix(), "."]))
    return Location(relative, class_name, path.stem, TargetSpec.in_file(relative, class_name).text,
                    paths, how)
