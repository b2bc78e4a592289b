"""The malformed collection (``tests/fixtures/malformed_collection.py`` and
``malformed_outputs.py``): every entry gets a verdict that names its problem (a check's reason or
likely bug, or one plain line where it can't be checked at all), never an internal error of the
suite, each check within its time budget. The count of internal errors is asserted to be zero
over the whole collection."""

from __future__ import annotations

import contextlib
import io

import pytest

from conformance import Status, check
from conformance.errors import ConformanceError
from tests.fixtures import malformed_collection, malformed_outputs

BUDGET = 2.0
"""Each check's time budget here (the slow entry is cut short by it)."""

SLACK = 10.0
"""Seconds a check may run past its budget: its searches' minimum examples."""

CHECKS = ["gate", "contract", "reference", "autograd"]

PASSES = "passes"
"""An entry that is no mistake after all (a form the suite accepts): every check passes."""

EXPECTED = {
    # What forward returns.
    "ReturnsNone": "forward returned NoneType, not a tensor",
    "ReturnsTupleWithWeights": PASSES,
    "ReturnsDict": "forward returned dict, not a tensor",
    "ReturnsList": "forward returned list, not a tensor",
    "ReturnsGenerator": "forward returned generator, not a tensor",
    "ReturnsString": "forward returned str, not a tensor",
    "ReturnsPythonList": "forward returned list, not a tensor",
    "ReturnsNumpy": "forward returned ndarray, not a tensor",
    "ExtraLeadingDim": "output has shape (1, 2, 6, 8) for input (2, 6, 8)",
    "DoubledWidth": "output has shape (2, 5, 16) for input (2, 5, 8)",
    "OneTokenShort": "output has shape (2, 5, 8) for input (2, 6, 8)",
    "Float64Output": "output dtype is torch.float64, inputs are torch.float32",
    "BoolOutput": "output dtype is torch.bool, not floating point",
    "PerHead": "that looks like the per-head output",
    "Weights": "that looks like the attention weights",
    "Transposed": "that looks like the output transposed",
    "Pooled": "that looks pooled over the tokens",
    "IntOut": "output dtype is torch.int64, not floating point",
    "Scalar": "a 0-dim tensor (a scalar)",
    "Identity": "the output is the input unchanged",
    # What forward computes.
    "AllNaN": "output row 0 of batch 0 is NaN",
    "InfAtFirstRow": "output row 0 of batch 0 is infinite",
    "Zeros": "the output does not require grad",
    "Noise": "the same inputs called twice give outputs differing",
    "SoftmaxOverQueries": "softmax over the wrong dimension",
    "NoScale": "is the 1/sqrt(head_dim) factor missing",
    "HeadsMixedByView": "matches heads split with view(B, H, L, Dh) and no transpose",
    "DetachedOutput": "the output does not require grad",
    "ChangesEveryCall": "keeps state between calls",
    "NoParameters": PASSES,
    # How forward runs.
    "AlwaysRaises": "forward raised NotImplementedError: TODO: implement attention",
    "RaisesAtThirdCall": "forward raised RuntimeError: ran out of cache",
    "Recurses": "forward raised RecursionError",
    "ModifiesInputInPlace": "forward modified its input(s) x in place",
    "PrintsALot": "forward printed 111 characters to stdout",
    "Slow": "cut short: its time budget (2 s) ran out",
    "WritesToStderr": PASSES,
    "ArgsForward": PASSES,
    "KwargsForward": PASSES,
    "ArgsNothingWorks": "no call form gives attention's output",
    # What the class is.
    "NoForward": "defines no forward method",
    "ForwardNotCallable": "ForwardNotCallable.forward is int, not a method",
    "PropertyForward": "PropertyForward.forward is a property, not a method",
    "InitRaises": "constructing it raised ValueError",
    "InitForgetsSuper": "cannot assign module before Module.__init__() call",
    "ForwardTakesNothing": "forward takes no input tensor",
    "ForwardNeedsAnUnknownArgument": "missing 1 required positional argument: 'temperature'",
    "HardCodedWidth": PASSES,
    "NotAModule": "is a class but not a torch.nn.Module",
    # Functions (kernels).
    "function_returning_tuple": PASSES,
    "function_returning_none": "function_returning_none returned a NoneType",
    "function_of_one_argument": "a core function takes (q, k, v",
    "numpy_kernel": "numpy_kernel returned a ndarray",
    "wrong_layout_kernel": "a kernel returns its output as a tensor of its query's shape",
}


def _entry(name: str) -> object:
    for module in (malformed_collection, malformed_outputs):
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(name)


def _verdict(name: str) -> tuple[str, list]:
    """What the suite says of the entry: its one line, or its results."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return "", check(_entry(name), devices=["cpu"], checks=CHECKS, time_budget=BUDGET)
        except ConformanceError as error:  # can't be checked at all: one plain line
            return str(error), []


def test_the_collection_is_at_least_forty_and_every_entry_is_expected():
    defined = {name for module in (malformed_collection, malformed_outputs)
               for name, value in vars(module).items()
               if getattr(value, "__module__", None) == module.__name__ and name != "Base"
               and callable(value)}
    assert defined == set(EXPECTED)
    assert len(EXPECTED) >= 40


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_entry_gets_a_verdict_naming_its_problem(name):
    line, results = _verdict(name)
    suite_errors = [r for r in results if r.status is Status.SUITE_ERROR]
    assert not suite_errors, suite_errors
    assert all("Traceback" not in (r.reason or "") for r in results)
    assert all(r.seconds < BUDGET + SLACK for r in results if r.check != "gate")
    words = EXPECTED[name]
    if line:
        assert "\n" not in line and words in line, line
        return
    if words == PASSES:
        assert {r.status for r in results} <= {Status.PASSED, Status.SKIPPED}, results
        assert any(r.status is Status.PASSED and r.check == "reference" for r in results) or \
            name in {"NoParameters", "function_returning_tuple"}, results
        return
    said = [f"{r.reason} {r.hint or ''}" for r in results
            if r.status in (Status.FAILED, Status.WARNED)]
    assert any(words in text for text in said), said
