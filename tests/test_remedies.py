"""What to declare, where behaviour can't settle a finding, is data (a Remedy) that each front
end says in its own words and a student never sees; it survives the results' JSON."""

from __future__ import annotations

from conformance.frontends.interface_language import remedy_words
from conformance.frontends.report import failure_block
from conformance.grading.outcome import result_from_dict
from conformance.model.remedies import Option, Remedy
from conformance.model.results import CheckResult, Status

REMEDY = Remedy((Option("kv_grouping", "interleaved", "hold it to HuggingFace's"),
                 Option("kv_grouping", "tiled", "accept it"),
                 Option("sequence_first", "true", "read it sequence-first")))


def test_each_interface_says_it_in_its_own_words():
    assert remedy_words(REMEDY, "cli") == (
        "declare --kv-grouping interleaved to hold it to HuggingFace's, or --kv-grouping tiled "
        "to accept it, or --sequence-first to read it sequence-first")
    assert remedy_words(REMEDY, "pytest").startswith(
        "declare --attention-declare kv-grouping=interleaved to hold it to HuggingFace's")
    assert 'declare={"kv-grouping": "tiled"} to accept it' in remedy_words(REMEDY, "python")


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
