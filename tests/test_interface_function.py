"""An attention function in ``transformers``' ``AttentionInterface`` form is a kernel too
(conformance.inference.functions.interface_function): called as a model calls it, each correct
one passes with nothing declared, transformers' own two included, and each twin fails the check
named for its bug."""

from __future__ import annotations

import pytest

from conformance import Status
from conformance.inference import infer_function
from conformance.inference.functions.interface_function import is_interface_function
from conformance.loading.registry import resolve
from conformance.model.remedies import texts
from conformance.run.many import check_many
from tests.fixtures import interface_functions as functions

LIBRARY = ("transformers.models.llama.modeling_llama:eager_attention_forward",
           "transformers.integrations.sdpa_attention:sdpa_attention_forward")
"""transformers' own attention functions, checked as a user names them."""


def spec(function) -> str:
    return f"tests.fixtures.interface_functions:{function.__name__}"


@pytest.fixture(scope="module")
def checked():
    names = [spec(f) for f in [*functions.CORRECT, *functions.BROKEN]]
    pytest.importorskip("transformers")
    names += list(LIBRARY)
    by_name: dict[str, dict] = {}
    for result in check_many([(name, resolve(name)[0]) for name in names], devices=["cpu"],
                             jobs=2):
        by_name.setdefault(result.implementation.split(":")[-1], {})[result.check] = result
    return by_name


def test_the_form_is_told_by_its_signature():
    assert all(is_interface_function(f) for f in [*functions.CORRECT, *functions.BROKEN])
    assert not is_interface_function(lambda q, k, v, mask=None: q)
    assert not is_interface_function(functions.repeat_kv)


def test_it_is_called_as_a_model_calls_it():
    said = " ".join(texts(infer_function(functions.eager_written).notes))
    assert "AttentionInterface form" in said
    assert "the softmax scale set by scaling=" in said
    assert "takes fewer key/value heads than query heads" in said
    assert "attention_mask: additive float mask" in said


@pytest.mark.parametrize("name", [f.__name__ for f in functions.CORRECT]
                         + [n.split(":")[-1] for n in LIBRARY])
def test_no_correct_function_fails(checked, name):
    results = checked[name]
    failed = {check: r.reason for check, r in results.items()
              if r.status in (Status.FAILED, Status.SUITE_ERROR)}
    assert not failed
    assert sum(r.status is Status.PASSED for r in results.values()) >= 12
    assert results["kv_groups"].status is Status.PASSED


@pytest.mark.parametrize(("function", "check"), list(functions.BROKEN.items()),
                         ids=lambda v: getattr(v, "__name__", v))
def test_each_twin_fails_the_check_named_for_its_bug(checked, function, check):
    assert checked[function.__name__][check].status is Status.FAILED
