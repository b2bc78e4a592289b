"""Jupyter notebooks to plain Python: the code cells, filtered.

By default only what defines things is kept, statement by statement (an AST filter on each
cell): imports, ``def`` and ``class`` (decorated ones too), and assignments of constants
(``D_MODEL = 64``, ``SIZES = (2, 4)``, ``EPS = 1 / 1e4``). Everything else is dropped, so a
training loop, a plot, a download or a demo call never runs when the class is imported. Shell
(``!pip ...``) and magic (``%time``, ``%%bash``) lines are never run. A cell that does not parse
is skipped with a note (its line and message), so one broken scratch cell does not hide a
working class; if the class is then missing, the note explains why.

With ``run_all_cells=True`` every code cell runs in order, as "Run All" would (still without
shell and magic lines).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field

from conformance.errors import ConformanceError


class NotebookError(ConformanceError):
    """A notebook that can't be read; one line."""


@dataclass
class Converted:
    """The Python source of a notebook, and what was left out and why."""

    source: str
    notes: list[str] = field(default_factory=list)
    syntax_errors: list[str] = field(default_factory=list)


_CONSTANT_NODES = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.BinOp, ast.UnaryOp,
                   ast.Name, ast.Load, ast.operator, ast.unaryop, ast.Attribute)


def _is_constant(node: ast.AST | None) -> bool:
    """Literals and arithmetic on them or on names (``1 / math.sqrt`` is not: no calls)."""
    if node is None:
        return False
    return all(isinstance(child, _CONSTANT_NODES) for child in ast.walk(node))


def _is_definition(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef,
                         ast.ClassDef)):
        return True
    if isinstance(node, ast.Assign):
        return (all(isinstance(t, ast.Name) for t in node.targets) and _is_constant(node.value))
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name) and (node.value is None
                                                      or _is_constant(node.value))
    if isinstance(node, ast.Try):  # try: import x / except ImportError: ...
        return all(isinstance(s, (ast.Import, ast.ImportFrom, ast.Pass, ast.Assign))
                   for s in node.body)
    return False


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    if isinstance(source, list):
        source = "".join(str(part) for part in source)
    if not isinstance(source, str):
        raise NotebookError("a cell's source is neither text nor a list of lines")
    return source


def _without_magics(source: str) -> tuple[str, bool]:
    """Shell and magic lines blanked out (line numbers kept); True when the whole cell is a
    cell magic (``%%bash``), which is then not Python at all."""
    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        return "", True
    kept = ["" if line.lstrip().startswith(("!", "%")) else line for line in lines]
    return "\n".join(kept), False


def convert(text: str | bytes, *, run_all_cells: bool = False, name: str = "notebook") -> Converted:
    """The notebook ``text`` (an .ipynb file's content) as Python source."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise NotebookError(f"{name} is not a readable notebook (not JSON: {error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise NotebookError(f"{name} is not a notebook (no list of cells)")
    converted = Converted(source="")
    chunks = [f"# Converted from {name} by attention-conformance grade "
              f"({'every code cell' if run_all_cells else 'definitions only'}).\n"]
    dropped = 0
    for number, cell in enumerate(data["cells"], 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source, cell_magic = _without_magics(_cell_source(cell))
        if cell_magic:
            converted.notes.append(f"cell {number}: a cell magic (%%), not run")
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError as error:
            message = f"cell {number}, line {error.lineno}: {error.msg}"
            converted.syntax_errors.append(message)
            converted.notes.append(f"{message}: the cell does not parse and was skipped")
            continue
        if run_all_cells:
            chunks.append(f"# --- cell {number}\n{source}\n")
            continue
        kept = [node for node in tree.body if _is_definition(node)]
        dropped += len(tree.body) - len(kept)
        if kept:
            chunks.append(f"# --- cell {number}\n{_statements(kept)}\n")
    if dropped:
        converted.notes.append(f"{dropped} statement(s) that are not imports, definitions or "
                               "constants were not run (the grader may choose to run every "
                               "cell)")
    converted.source = "\n".join(chunks)
    return converted


def _statements(kept: list[ast.stmt]) -> str:
    """Exactly the kept statements, regenerated from their syntax tree: slicing source lines
    could carry along a dropped statement that shares a line (``x = 1; train()``)."""
    return ast.unparse(ast.Module(body=kept, type_ignores=[]))
