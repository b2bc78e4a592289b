"""Every message once and true (issue 55): each message a newcomer saw said twice or garbled has
a test here that fails on the message as it was."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from conformance.checks.invariants.platform import platform_or
from conformance.checks.invariants.violation import Violation
from conformance.inference.infer import infer
from conformance.model.remedies import texts
from conformance.numerics.platform_defects import PLATFORM_NOTE

ROOT = Path(__file__).resolve().parents[1]


def _modern_llama():
    """examples/modern/llama.py, as a module (its GQA and GQARepeat layers)."""
    spec = importlib.util.spec_from_file_location("modern_llama",
                                                  ROOT / "examples" / "modern" / "llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_platform_clause_is_said_once_when_a_check_rechecks_through_it():
    """Was: "on this platform, in bfloat16 only: on this platform, in bfloat16 only: ... the same
    case in float32 is clean; the same case in float32 is clean"."""
    said = Violation(f"{PLATFORM_NOTE}, in bfloat16 only: row 3 differs; the same case in "
                     "float32 is clean", severity="warn")
    again = platform_or(None, None, said, lambda case: None)
    assert again is said and str(again).count(PLATFORM_NOTE) == 1


def test_the_key_value_heads_note_of_a_tiled_grouping_reads_as_one_sentence():
    """Was: "...(tiled), read as the canonical grouping read 2 key/value heads for 4 query
    heads)"."""
    module = _modern_llama()
    said = " ".join(texts(infer(module.GQARepeat).notes))
    assert "2 key/value heads for 4 query heads, read by its weights from wq/wk/wv/wo;" in said
    assert "grouping read" not in said and "grouping)" in said


def test_every_note_of_an_inferred_layer_closes_what_it_opens():
    """Was: "weights: wq/wk/wv/wo (found by behaviour: ... reproduces its output (relative error
    1.4e-16, 2 assignment(s) tried)", one parenthesis left open."""
    module = _modern_llama()
    for cls in (module.GQA, module.GQARepeat):
        for note in texts(infer(cls).notes):
            assert note.count("(") == note.count(")"), note
