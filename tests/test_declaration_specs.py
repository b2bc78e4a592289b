"""The table of declarations is the one place a declaration is said: the fields of
Declarations, the command line's flags, pytest's and the TOML readers' validation and the docs'
reference table are made from it (a declaration added to the table alone appears in each), and
a value that does not parse is one line naming it wherever it is read (TOML, pytest, Python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conformance.frontends import cli
from conformance.frontends.declarations_page import reference_table
from conformance.model.declaration_sources import from_mapping
from conformance.model.declaration_specs import SPECS, Form
from conformance.model.declarations import DeclarationError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "declarations.md"

BAD = {"call": "both", "mask": "keep_maybe:key_padding", "causal": "sometimes",
       "constructor": "magic", "returns": "array", "layout": "bldh",
       "causal_alignment": "middle", "kv_grouping": "random", "padded_queries": "nan",
       "output_projection": "skipped", "rope": "spiral:10", "dtypes": "float8",
       "weights": "q,k", "mask_formats": ["keep_int:nowhere"], "window_arg": "w:right",
       "positions": "pos:matrix", "position_encoding": "learned", "alibi": "guessed",
       "kv_cache": "somewhere@past", "cache_layout": "lbhd", "packed": "ragged@cu",
       "sequence_first": "true", "scale": "quadratic", "layer": "LlamaAttention",
       "batch_first": "true", "paths": ["need_weights"]}
"""A value of each declaration that does not parse (``sequence_first`` and ``batch_first``:
contradicting each other)."""


DUMMY = textwrap.dedent("""
    import json, sys
    import conformance.model.declaration_specs as table

    # Before anything reads the table: one entry more, and nothing else.
    dummy = table.DeclarationSpec("dummy_thing", "good | bad", "a declaration for the test",
                                  ("good", "bad"))
    table.SPECS = (*table.SPECS, dummy)
    table.BY_NAME = {spec.name: spec for spec in table.SPECS}

    from conformance.frontends import cli
    from conformance.frontends.declarations_page import reference_table
    from conformance.frontends.interface_language import declaration_words
    from conformance.grading.score.rubric_file import load
    from conformance.model.declaration_sources import from_mapping, from_pyproject
    from conformance.model.declarations import DeclarationError, Declarations

    check = next(a for a in cli._parser()._actions
                 if a.__class__.__name__ == "_SubParsersAction").choices["check"]
    args = check.parse_args(["--dummy-thing", "good"])
    found = {"cli": args.dummy_thing,
             "field": Declarations(dummy_thing="good").dummy_thing,
             "pytest": from_mapping({"dummy-thing": "bad"}, "--attention-declare").dummy_thing,
             "pyproject": from_pyproject("m:Attention").dummy_thing,
             "rubric": from_mapping(load(sys.argv[1]).targets[0].interface,
                                    "rubric").dummy_thing,
             "docs": "`--dummy-thing good`" in reference_table(),
             "words": [declaration_words("dummy_thing", "bad", i)
                       for i in ("cli", "pytest", "python")]}
    try:
        from_mapping({"dummy-thing": "ugly"}, "pyproject.toml")
    except DeclarationError as error:
        found["refused"] = str(error)
    print(json.dumps(found))
""")


RUBRIC = textwrap.dedent("""
    [assignment]
    name = "hw"
    [[targets]]
    class = "Attention"
    interface = { call = "self", dummy-thing = "good" }
    [[targets.items]]
    check = "contract"
    points = 1
""")


def test_a_declaration_added_to_the_table_alone_appears_everywhere(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.attention-conformance.declare."m:Attention"]\ndummy-thing = "good"\n')
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(RUBRIC)
    done = subprocess.run([sys.executable, "-c", DUMMY, str(rubric)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found.pop("refused") == "pyproject.toml: dummy-thing 'ugly': use good, bad"
    assert found == {"cli": "good", "field": "good", "pytest": "bad", "pyproject": "good",
                     "rubric": "good", "docs": True,
                     "words": ["--dummy-thing bad", "--attention-declare dummy-thing=bad",
                               'declare={"dummy-thing": "bad"}']}


def test_the_command_line_is_made_from_the_table():
    check = next(a for a in cli._parser()._actions
                 if a.__class__.__name__ == "_SubParsersAction").choices["check"]
    actions = {option: action for action in check._actions for option in action.option_strings}
    for spec in SPECS:
        action = actions[spec.flag]
        assert action.dest == spec.name and action.help == spec.help
        assert tuple(action.choices or ()) == spec.choices
        if spec.form is Form.REPEATED:
            assert action.__class__.__name__ == "_AppendAction"


def test_the_docs_reference_table_is_the_tables_own():
    assert DOCS.read_text() == reference_table(), ("regenerate it: python -m "
                                                   "conformance.frontends.declarations_page > "
                                                   "docs/declarations.md")


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_value_that_does_not_parse_is_one_line_naming_it(name):
    values = {name: BAD[name]}
    if name in ("sequence_first", "batch_first"):  # each valid alone: declared together
        values = {"sequence_first": "true", "batch_first": "true"}
    with pytest.raises(DeclarationError) as error:
        from_mapping(values, "pyproject.toml")
    text = str(error.value)
    assert "\n" not in text and text.startswith("pyproject.toml: ")
    assert name.replace("_", "-").split("-")[0] in text


def test_every_declaration_with_a_grammar_has_a_bad_value_here():
    checked = {spec.name for spec in SPECS if spec.choices or spec.read}
    assert checked <= set(BAD) | {"init"}


def test_the_grading_pages_interface_keys_are_the_tables_own():
    """Every key a rubric's interface accepts is in docs/grading.md, with how a rubric writes
    it, generated from the same table as the declarations page."""
    from conformance.frontends.declarations_page import INTERFACE_BEGIN, INTERFACE_END, interface_table

    page = (ROOT / "docs" / "grading.md").read_text()
    shown = page[page.index(INTERFACE_BEGIN):page.index(INTERFACE_END) + len(INTERFACE_END)]
    assert shown == interface_table()
    for spec in SPECS:
        assert f"| `{spec.key}` |" in shown
