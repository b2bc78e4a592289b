"""What to declare, where behaviour can't settle a finding, is data (a Remedy) that each front
end says in its own words and a student never sees; it survives the results' JSON."""

from __future__ import annotations

import pytest

from conformance.frontends.interface_language import (
    declaration_words,
    error_words,
    note_words,
    remedy_words,
)
from conformance.frontends.report import failure_block
from conformance.grading.score.outcome import result_from_dict
from conformance.inference.plan import CALL_REMEDY, InferenceError
from conformance.loading.registry import ResolveError
from conformance.model.remedies import Note, Option, Remedy
from conformance.model.results import CheckResult, Status

REMEDY = Remedy((Option("kv_grouping", "interleaved", "hold it to HuggingFace's"),
                 Option("kv_grouping", "tiled", "accept it"),
                 Option("sequence_first", "true", "read it sequence-first")))


@pytest.mark.parametrize("interface,expected", [
    ("cli", "declare --kv-grouping tiled to accept it, or --kv-grouping interleaved to hold it "
            "to HuggingFace's"),
    ("pytest", "add --attention-declare kv-grouping=tiled to accept it, or --attention-declare "
               "kv-grouping=interleaved to hold it to HuggingFace's"),
    ("python", 'pass declare={"kv-grouping": "tiled"} to accept it, or declare={"kv-grouping": '
               '"interleaved"} to hold it to HuggingFace\'s'),
])
def test_a_remedy_is_said_in_each_front_ends_words(interface, expected):
    remedy = Remedy((Option("kv_grouping", "tiled", "accept it"),
                     Option("kv_grouping", "interleaved", "hold it to HuggingFace's")))
    assert remedy_words(remedy, interface) == expected


def test_a_switch_and_a_value_left_to_the_user():
    assert declaration_words("sequence_first", "true", "cli") == "--sequence-first"
    assert declaration_words("sequence_first", "true", "pytest") == (
        "--attention-declare sequence-first=true")
    assert declaration_words("mask_formats", "additive:broadcast", "cli") == (
        "--mask-format additive:broadcast")
    assert declaration_words("mask_formats", "additive:broadcast", "python") == (
        'declare={"mask-formats": "additive:broadcast"}')
    assert declaration_words("causal", None, "cli") == "--causal never|always|optional"


def test_a_note_and_an_error_carry_their_remedy_to_the_words():
    note = Note("not causal (probed)", Remedy.to("causal", "always", "say it is meant to be"))
    assert note_words(note, "cli") == ("not causal (probed); declare --causal always to say it "
                                       "is meant to be")
    assert note_words(Note("plain"), "pytest") == "plain"
    cause = InferenceError("M: forward takes no input tensor", CALL_REMEDY)
    try:
        raise ResolveError("m.py::M: M: forward takes no input tensor") from cause
    except ResolveError as error:
        words = error_words(error, "pytest")
    assert words == ("m.py::M: M: forward takes no input tensor: add --attention-declare "
                     "call=self to call it as f(x[, mask]), or --attention-declare call=qkv to "
                     "call it as f(q, k, v[, mask]), or --attention-declare call=cross to call "
                     "it as f(x, context[, mask])")


def test_a_failure_block_says_the_remedy_for_its_interface():
    result = CheckResult("impl", "kv_groups", "cpu", Status.WARNED, reason="tiled",
                         hint="inference can't know which was meant", remedy=REMEDY)
    assert "declare --kv-grouping interleaved" in failure_block(result)
    assert "--attention-declare kv-grouping=tiled" in failure_block(result, interface="pytest")


def test_a_remedy_survives_the_stored_results():
    result = CheckResult("impl", "kv_groups", "cpu", Status.WARNED, remedy=REMEDY)
    import json

    again = result_from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.remedy == REMEDY and again == result
