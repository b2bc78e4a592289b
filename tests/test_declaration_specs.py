"""The table of declarations is the one place a declaration is said: every field of
Declarations has its entry and the reverse, the command line's flags and the docs' reference
table are made from it, and a value that does not parse is one line naming it wherever it is
read (TOML, pytest, Python)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.frontends import cli
from conformance.model.declaration_sources import from_mapping
from conformance.model.declaration_specs import SPECS, Form, reference_table, unspecified
from conformance.model.declarations import DeclarationError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "declarations.md"

BAD = {"call": "both", "mask": "keep_maybe:key_padding", "causal": "sometimes",
       "constructor": "magic", "returns": "array", "layout": "bldh",
       "causal_alignment": "middle", "kv_grouping": "random", "padded_queries": "nan",
       "output_projection": "skipped", "rope": "spiral:10", "dtypes": "float8",
       "weights": "q,k", "mask_formats": ["keep_int:nowhere"], "window_arg": "w:right",
       "positions": "pos:matrix", "position_encoding": "learned", "alibi": "guessed",
       "kv_cache": "somewhere@past", "packed": "ragged@cu", "sequence_first": "true",
       "batch_first": "true"}
"""A value of each declaration that does not parse (the last two: contradicting each other)."""


def test_every_declaration_has_one_entry():
    assert unspecified() == []


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
                                                   "conformance.model.declaration_specs > "
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
