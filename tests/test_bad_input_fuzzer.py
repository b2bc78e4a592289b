"""A fuzzer for bad input: malformed modules made from a correct one (hypothesis draws the
malformation), each of which gets a plain verdict or one plain line, never an internal error of
the suite, in bounded time.

The malformations are the mistakes of issue 27's collection: the output permuted, reduced or
cast; the return wrapped in a tuple, dict, list or generator, or None; forward raising at its
k-th call; NaN or inf at some rows; the input modified in place; printing; sleeping in every
call (each check then cut short by its time budget, saying so). The suite runs inside
the fuzzer's own ``@given``, as inside a user's hypothesis test: that is no error of the suite's
either.
"""

from __future__ import annotations

import time

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance import Status, check
from conformance.errors import ConformanceError
from tests.fixtures.malformed_outputs import Base


def _wrap(output, form: str):
    return {"tuple": (output,), "dict": {"out": output}, "list": [output],
            "generator": (o for o in [output]), "none": None}[form]


MALFORMATIONS = st.one_of(
    st.tuples(st.just("permute"), st.sampled_from([(1, 0, 2), (2, 1, 0), (0, 2, 1)])),
    st.tuples(st.just("reduce"), st.sampled_from([0, 1, 2])),
    st.tuples(st.just("cast"), st.sampled_from([torch.int64, torch.bool, torch.float64])),
    st.tuples(st.just("wrap"), st.sampled_from(["tuple", "dict", "list", "generator", "none"])),
    st.tuples(st.just("raise_at"), st.integers(1, 6)),
    st.tuples(st.just("nan_rows"), st.sampled_from([float("nan"), float("inf")])),
    st.tuples(st.just("in_place"), st.just(None)),
    st.tuples(st.just("prints"), st.just(None)),
    st.tuples(st.just("sleeps"), st.sampled_from([0.01, 0.05])),
)

BUDGET = 2.0
"""Each check's time budget here: a sleeping module's checks are cut short at it (a warning)."""


def malformed(kind: str, parameter: object) -> type:
    """A module class: correct attention, then ``kind`` done to it."""

    class Malformed(Base):
        calls = 0

        def forward(self, x):
            type(self).calls += 1
            if kind == "raise_at" and type(self).calls >= parameter:
                raise RuntimeError(f"failed at call {type(self).calls}")
            if kind == "sleeps":
                time.sleep(parameter)
            if kind == "in_place":
                x.mul_(1.0)  # writes its input (a no-op in value, a write all the same)
            out = self.merged(x)
            if kind == "permute":
                return out.permute(*parameter)
            if kind == "reduce":
                return out.sum(parameter)
            if kind == "cast":
                return out.to(parameter)
            if kind == "wrap":
                return _wrap(out, parameter)
            if kind == "nan_rows":
                return torch.where(torch.arange(out.shape[1])[None, :, None] == 0, parameter, out)
            if kind == "prints":
                print("forward called")
            return out

    Malformed.__name__ = Malformed.__qualname__ = f"Malformed_{kind}"
    return Malformed


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(MALFORMATIONS)
def test_every_malformed_module_gets_a_plain_verdict_never_a_suite_error(malformation):
    kind, parameter = malformation
    start = time.perf_counter()
    try:
        results = check(malformed(kind, parameter), devices=["cpu"], time_budget=BUDGET,
                        checks=["gate", "contract", "reference", "batch_independence"])
    except ConformanceError as error:  # bad input: one plain line naming its problem
        assert "\n" not in str(error) and str(error), (kind, parameter)
        return
    assert not [r for r in results if r.status is Status.SUITE_ERROR], (kind, parameter)
    assert all(r.reason for r in results if r.status is Status.FAILED), (kind, parameter)
    assert not [r for r in results if "Traceback" in (r.reason or "")], (kind, parameter)
    # Within its budget: no example starts after it, and the minimum's few calls are seconds.
    assert all(r.seconds < BUDGET + 10 for r in results if r.check != "gate"), (kind, parameter)
    assert time.perf_counter() - start < 120, (kind, parameter)
