"""Nothing below the front ends spells a front end's option: a finding carries what to declare as
data (:mod:`conformance.model.remedies`), and each front end says it in its own words.

The messages of every module below ``frontends/`` (its strings, docstrings and comments aside)
are read for the command line's ``check`` options, the declarations' flags and pytest's
``--attention-*`` options. ``grading/``'s renderers are front ends of their own, and grading
may name the ``grade`` command's own options (``--shard``, ``--only``) in its errors: those
are its interface, not another front end's.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from conformance.frontends.cli import _parser
from conformance.frontends.run_flags import RUN_FLAGS
from conformance.model.declaration_specs import SPECS

PACKAGE = Path(__file__).resolve().parents[1] / "conformance"
RENDERERS = {"grading/student_text.py", "grading/feedback.py", "grading/class_report.py",
             "grading/gradescope.py", "grading/document.py"}


def _check_options() -> set[str]:
    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {option for action in commands.choices["check"]._actions
            for option in action.option_strings if option.startswith("--")} - {"--help"}


def _pytest_options() -> set[str]:
    """The plugin's own options, and those of the run it shares with the command line."""
    source = (PACKAGE / "frontends" / "pytest_plugin.py").read_text()
    return set(re.findall(r'"(--attention-[a-z-]+)"', source)) | {
        flag.pytest_flag for flag in RUN_FLAGS.values()}


FLAGS = _check_options() | {spec.flag for spec in SPECS} | _pytest_options()


def _messages(path: Path) -> list[tuple[int, str]]:
    """The string literals of a module that are not docstrings, with their lines."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def _below_front_ends() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py")
                  if (path.relative_to(PACKAGE).parts[0] not in ("frontends", "implementations")
                  and str(path.relative_to(PACKAGE)) not in RENDERERS
                  and path.parent != PACKAGE) or path.name in ("errors.py", "_compat.py"))


def test_the_flags_read_are_the_front_ends():
    assert {"--mask", "--kv-grouping", "--strict", "--no-isolate", "--attention-declare",
            "--attention-strict"} <= FLAGS


def test_no_front_end_option_is_spelled_below_the_front_ends():
    pattern = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, FLAGS), key=len,
                                                          reverse=True)) + r")(?![\w-])")
    spelled = [f"{path.relative_to(PACKAGE)}:{line}: {found.group(1)}"
               for path in _below_front_ends() for line, text in _messages(path)
               for found in [pattern.search(text)] if found]
    assert spelled == []
    assert len(_below_front_ends()) > 150  # the walk reads the tree, not an empty list


def test_the_test_sees_a_flag_where_one_is_written(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""--mask in a docstring is documentation."""\n'
                      'X = "declare --mask keep_bool:key_padding@mask"\n')
    assert [text for _, text in _messages(module)] == [
        "declare --mask keep_bool:key_padding@mask"]


def test_the_python_api_says_the_remedy_in_a_note():
    import conformance

    class NoInput(__import__("torch").nn.Module):
        def __init__(self, d_model: int = 8, num_heads: int = 2):
            super().__init__()

        def forward(self):
            return None

    with pytest.raises(conformance.ResolveError) as caught:
        conformance.check(NoInput)
    assert 'pass declare={"call": "self"}' in "\n".join(getattr(caught.value, "__notes__", []))
    assert "--call" not in str(caught.value)
