"""Advice in the language of the interface in use: the command line's declaration flags as
pytest options or a test file's declare= argument."""

from __future__ import annotations

import pytest

from conformance.frontends.interface_language import spoken, spoken_result
from conformance.model.results import CheckResult, Status


@pytest.mark.parametrize("text,pytest_form,python_form", [
    ("if it is meant to be, declare --causal always)",
     "if it is meant to be, --attention-declare causal=always)",
     'if it is meant to be, declare={"causal": "always"})'),
    ("declare it: --mask KIND:LAYOUT@ARGUMENT (e.g. keep_bool:per_query@attn_mask)",
     "--attention-declare mask=KIND:LAYOUT@ARGUMENT (e.g. keep_bool:per_query@attn_mask)",
     'declare={"mask": "KIND:LAYOUT@ARGUMENT"} (e.g. keep_bool:per_query@attn_mask)'),
    ("declare them with --weights q,k,v[,o]",
     "declare them with --attention-declare weights=q,k,v[,o]",
     'declare them with declare={"weights": "q,k,v[,o]"}'),
    ("declare --dtypes to make them part of its contract",
     "--attention-declare dtypes=... to make them part of its contract",
     'declare={"dtypes": ...} to make them part of its contract'),
    ("declare --sequence-first", "--attention-declare sequence-first=true",
     'declare={"sequence-first": "true"}'),
    ("or --mask-format additive:broadcast.",
     "or --attention-declare mask-formats=additive:broadcast.",
     'or declare={"mask-formats": "additive:broadcast"}.'),
    ("--strict fails on them", "--attention-strict fails on them", "strict=True fails on them"),
    ("nothing to change: --check padding", "nothing to change: --check padding",
     "nothing to change: --check padding"),
])
def test_declarations_are_spoken_for_the_interface(text, pytest_form, python_form):
    assert spoken(text, "cli") == text
    assert spoken(text, "pytest") == pytest_form
    assert spoken(text, "python") == python_form


def test_a_result_is_spoken_whole():
    result = CheckResult("m", "causal", "cpu", Status.FAILED, reason="x --causal never y",
                         hint="declare --kv-grouping tiled to accept it", details=["--rope half"],
                         observations=["declare --causal always"])
    spoken_for_pytest = spoken_result(result, "pytest")
    assert spoken_for_pytest.reason == "x --attention-declare causal=never y"
    assert spoken_for_pytest.hint == "--attention-declare kv-grouping=tiled to accept it"
    assert spoken_for_pytest.details == ["--attention-declare rope=half"]
    assert spoken_for_pytest.observations == ["--attention-declare causal=always"]
    assert result.reason == "x --causal never y"  # the original is unchanged
