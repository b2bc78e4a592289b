"""A forward returning no attention output gets one plain line naming what it returned and what
to do (inference, the command line), the likely bug in a check's failure (declared
implementations), and never an internal error of the suite."""

from __future__ import annotations

import pytest

from conformance import Capabilities, Implementation, Status, check
from conformance.frontends.cli import main
from conformance.inference import InferenceError, infer
from conformance.model.remedies import texts
from tests.fixtures import malformed_outputs

WORDS = {
    "PerHead": "that looks like the per-head output (batch, heads, length, head_dim)",
    "Weights": "that looks like the attention weights (batch, heads, q_len, kv_len)",
    "Transposed": "that looks like the output transposed to (length, batch, width)",
    "Pooled": "that looks pooled over the tokens (batch, width)",
    "IntOut": "output dtype is torch.int64, not floating point",
    "Scalar": "a 0-dim tensor (a scalar)",
}


@pytest.mark.parametrize("name", sorted(WORDS))
def test_inference_names_what_was_returned(name):
    with pytest.raises(InferenceError) as error:
        infer(getattr(malformed_outputs, name))
    assert WORDS[name] in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(("name", "words"), [
    ("PropertyForward", "PropertyForward.forward is a property, not a method"),
    ("numpy_kernel", "numpy_kernel returned a ndarray for inputs (2, 3, 5, 8): a kernel returns"),
    ("wrong_layout_kernel", "returned shape (2, 5, 3, 8) for inputs (2, 3, 5, 8): a kernel "
                            "returns its output as a tensor of its query's shape and layout"),
])
def test_forms_that_are_not_attention_are_one_line(capsys, name, words):
    code = main(["check", f"tests.fixtures.malformed_outputs:{name}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize(("name", "form"), [("ArgsForward", "forward(x)"),
                                            ("KwargsForward", "forward(x=...)")])
def test_a_variadic_forward_is_called_as_the_form_that_works(name, form):
    inferred = infer(getattr(malformed_outputs, name))
    assert any(note.startswith(f"forward takes *args/**kwargs: called as {form}")
               for note in texts(inferred.notes))
    results = check(inferred.implementation, devices=["cpu"], checks=["gate", "reference"])
    assert {r.status for r in results} == {Status.PASSED}


def test_a_variadic_forward_no_form_works_for_says_what_each_did():
    with pytest.raises(InferenceError, match=r"no call form gives attention's output \(forward"
                       r"\(x\) returned output has shape \(2, 2, 5, 4\)"):
        infer(malformed_outputs.ArgsNothingWorks)


def test_an_output_that_is_the_input_fails_the_gate_saying_so():
    (gate,) = check(malformed_outputs.Identity, devices=["cpu"], checks=["gate"])
    assert gate.status is Status.FAILED
    assert "the output is the input unchanged: no attention is computed" in gate.reason


def test_the_command_line_says_it_in_one_line_and_exits_2(capsys):
    code = main(["check", "tests.fixtures.malformed_outputs:PerHead"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "merge the heads and apply the output projection" in err


def test_a_declared_implementation_fails_the_gate_with_the_likely_bug():
    declared = Implementation("declared-per-head",
                              lambda c: malformed_outputs.PerHead(c.d_model, c.num_heads),
                              Capabilities(call="self"))
    (gate,) = check(declared, devices=["cpu"], checks=["gate"])
    assert gate.status is Status.FAILED
    assert gate.reason.startswith("basic call (float32, no mask): output has shape")
    assert gate.hint is not None and "per-head output" in gate.hint
