"""The attention function a model calls, checked inside the models that will use it
(``--attn-implementation``): the smallest model of each architecture built with a function in
``AttentionInterface``'s form, its layers driven through it. A correct function passes in every
model; each one-bug twin fails the check named for its bug (issue 54)."""

from __future__ import annotations

import pytest

from conformance import Status
from conformance.loading.attn_implementation import registered
from conformance.loading.registry import ResolveError, resolve
from conformance.model.declarations import Declarations
from conformance.model.remedies import texts
from conformance.run.many import check_many
from tests.fixtures import interface_functions as functions

transformers = pytest.importorskip("transformers")

MODELS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM",
          "PhiForCausalLM", "BertModel")
GROUPED = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM",
           "PhiForCausalLM"}
"""The models whose tiny config groups key/value heads (2 for 4 query heads)."""

FILE = "tests/fixtures/interface_functions.py"


def declared(function) -> Declarations:
    return Declarations(attn_implementation=f"{FILE}::{function.__name__}")


def built_with(model: str, function) -> list:
    return resolve(f"transformers:{model}", declared(function))


def test_the_model_is_built_with_the_function_and_says_so():
    (impl,) = built_with("LlamaForCausalLM", functions.through_sdpa)
    said = texts(impl.notes)
    assert said[1].startswith(f"built with attn_implementation={FILE}::through_sdpa (registered "
                              "as 'attention_conformance.function_")  # its name says sdpa
    assert said[1].endswith("); its mask made by transformers' sdpa_mask (a boolean mask, True = "
                            "attend, as it was observed to take)")
    name, said = registered(f"{FILE}::eager_written", lambda spec: functions.eager_written)
    assert name == "attention_conformance.eager_written"
    assert texts(said) == [
        f"built with attn_implementation={FILE}::eager_written (registered as "
        "'attention_conformance.eager_written'); its mask made by transformers' eager_mask (an "
        "additive float mask, as it was observed to take)"]


def test_a_name_nothing_registered_and_a_target_that_is_no_model_are_one_line_each():
    with pytest.raises(ResolveError, match="no attention function is registered under that "
                                           "name"):
        resolve("transformers:LlamaForCausalLM", Declarations(attn_implementation="mine"))
    with pytest.raises(ResolveError, match="is no transformers model"):
        resolve("tests/fixtures/user_styles.py::FusedQKV",
                Declarations(attn_implementation="sdpa"))
    with pytest.raises(ResolveError, match="not a function in AttentionInterface's form"):
        resolve("transformers:LlamaForCausalLM",
                Declarations(attn_implementation=f"{FILE}::repeat_kv"))


@pytest.fixture(scope="module")
def checked():
    checks = sorted(set(functions.IN_MODELS.values()))
    by_target: dict[tuple[str, str], dict] = {}
    for model in MODELS:
        for function in (functions.through_sdpa, *functions.IN_MODELS):
            if function is functions.kv_heads_tiled and model not in GROUPED:
                continue
            kinds = built_with(model, function)  # Gemma 2: its sliding and its full layers
            # Two kinds run in two processes, each resolving the model again: with the
            # declaration, as the command line passes it.
            results = check_many([(f"transformers:{model}", impl) for impl in kinds],
                                 declared=declared(function), devices=["cpu"], checks=checks,
                                 jobs=2)
            by_target[(model, function.__name__)] = results
    return by_target


@pytest.mark.parametrize("model", MODELS)
def test_a_correct_function_passes_in_every_model(checked, model):
    results = checked[(model, "through_sdpa")]
    assert [(r.implementation, r.check, r.status) for r in results
            if r.status not in (Status.PASSED, Status.SKIPPED)] == []
    judged = {"padding", "scale"} | ({"kv_groups"} if model in GROUPED else set())
    for kind in {r.implementation for r in results}:  # every kind of layer in it
        assert {r.check for r in results
                if r.implementation == kind and r.status is Status.PASSED} >= judged, kind


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("twin", [f.__name__ for f in functions.IN_MODELS])
def test_each_twin_fails_the_check_named_for_its_bug(checked, model, twin):
    if twin == "kv_heads_tiled" and model not in GROUPED:
        pytest.skip("no grouped key/value heads in this model: the tiled repeat is the same")
    named = next(check for f, check in functions.IN_MODELS.items() if f.__name__ == twin)
    for result in checked[(model, twin)]:  # in every kind of layer in it
        if result.check == named:
            assert result.status is Status.FAILED, (result.implementation, result.reason)
