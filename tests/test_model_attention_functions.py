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
          "PhiForCausalLM", "BertModel", "BartForConditionalGeneration",
          "T5ForConditionalGeneration", "WhisperForConditionalGeneration")
GROUPED = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM",
           "PhiForCausalLM"}
"""The models whose tiny config groups key/value heads (2 for 4 query heads)."""

UNSCALED = {"T5ForConditionalGeneration", "WhisperForConditionalGeneration"}
"""Models whose layers pass their attention function a scaling of 1 (T5 folds 1/sqrt(w) into q's
initialisation; Whisper multiplies q by it first): there dropping the scaling changes nothing,
and the scale bug is the other one, 1/sqrt(head_dim) put in whatever the layer passes
(scale_ignored)."""

FILE = "tests/fixtures/interface_functions.py"


def twins(model: str) -> dict:
    """Each one-bug twin that is a bug in ``model``, with the check named for it."""
    found = dict(functions.IN_MODELS)
    if model in UNSCALED:
        del found[functions.scaling_dropped]
        found[functions.scale_ignored] = "scale"
    if model not in GROUPED:
        del found[functions.kv_heads_tiled]
    return found


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


_CHECKED: dict[tuple[str, str], list] = {}


def _checked(model: str, function) -> list:
    """The results of ``model`` built with ``function``, in every kind of layer in it (Gemma 2:
    its sliding and its full layers; BART: encoder self, decoder self, cross), each computed
    once."""
    if (model, function.__name__) not in _CHECKED:
        checks = sorted({*functions.IN_MODELS.values(), "causal"})
        kinds = built_with(model, function)
        # In this process, the kinds resolved above: three checks are quick, resolving the model
        # again in each worker is not. Gemma 2's two kinds run in two processes, each resolving
        # the model again, with the declaration, as the command line passes it.
        _CHECKED[(model, function.__name__)] = check_many(
            [(f"transformers:{model}", impl) for impl in kinds], declared=declared(function),
            devices=["cpu"], checks=checks, jobs=2 if model == "Gemma2ForCausalLM" else 1)
    return _CHECKED[(model, function.__name__)]


@pytest.fixture(scope="module")
def checked():
    """The checking of a model built with a function (lazy: a test selected alone builds only
    its own model)."""
    return _checked


@pytest.mark.parametrize("model", MODELS)
def test_a_correct_function_passes_in_every_model(checked, model):
    results = checked(model, functions.through_sdpa)
    assert [(r.implementation, r.check, r.status) for r in results
            if r.status not in (Status.PASSED, Status.SKIPPED)] == []
    judged = {"scale"} | ({"kv_groups"} if model in GROUPED else set())
    for kind in {r.implementation for r in results}:  # every kind of layer in it
        passed = {r.check for r in results if r.implementation == kind and r.status is
                  Status.PASSED}
        assert passed >= judged, kind
    # padding wherever the model passes a mask (Whisper's encoder and cross-attention take none)
    assert any(r.check == "padding" and r.status is Status.PASSED for r in results)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("twin", [f.__name__ for f in (*functions.IN_MODELS,
                                                       functions.scale_ignored)])
def test_each_twin_fails_the_check_named_for_its_bug(checked, model, twin):
    bugs = {f.__name__: (f, check) for f, check in twins(model).items()}
    if twin not in bugs:
        pytest.skip("no bug in this model: " + (
            "no grouped key/value heads, the tiled repeat is the same" if "kv" in twin else
            "the scaling its layers pass is this twin's (1/sqrt(head_dim), or 1 for T5 and "
            "Whisper)"))
    function, named = bugs[twin]
    judged = [r for r in checked(model, function) if r.check == named
              and r.status is not Status.SKIPPED]  # a kind no mask reaches skips padding
    assert judged and all(r.status is Status.FAILED for r in judged), [
        (r.implementation, r.status, r.reason) for r in judged]


@pytest.mark.parametrize("model", ["LlamaForCausalLM", "Gemma2ForCausalLM",
                                   "BartForConditionalGeneration"])
def test_a_function_that_drops_the_mask_fails_causal_in_every_causal_layer(checked, model):
    """Causality is the model's convention (its own attention's, probed), held to whatever mask
    the model hands a function: one that drops the mask sees the future in every causal layer
    (a decoder's, each kind of Gemma 2's) and fails ``causal``, where it passed before as a
    layer no causal mask reaches."""
    judged = [r for r in checked(model, functions.mask_ignored) if r.check == "causal"
              and r.status is not Status.SKIPPED]  # an encoder's and a cross-attention's
    assert judged and all(r.status is Status.FAILED for r in judged), [
        (r.implementation, r.status, r.reason) for r in judged]
    assert all(r.status is Status.PASSED for r in checked(model, functions.through_sdpa)
               if r.check == "causal" and r.implementation in {j.implementation for j in judged})


CACHED = {"LlamaForCausalLM": "model.layers.0.self_attn",
          "BartForConditionalGeneration": "model.decoder.layers.0.self_attn"}
"""A decoder, and an encoder-decoder's decoder self-attention: each model's kind that keeps a KV
cache, decoded through the model's own cache object."""


@pytest.fixture(scope="module")
def cached_decoding():
    """kv_cache's verdict on each CACHED kind of a model built with a function (lazy)."""
    seen: dict[tuple[str, str], object] = {}

    def verdict(model: str, function) -> object:
        if (model, function.__name__) not in seen:
            (kind,) = [impl for impl in built_with(model, function)
                       if impl.name.endswith(f":{CACHED[model]}")]
            (seen[(model, function.__name__)],) = check_many(
                [(f"transformers:{model}", kind)], declared=declared(function), devices=["cpu"],
                checks=["kv_cache"], jobs=1)
        return seen[(model, function.__name__)]
    return verdict


@pytest.mark.parametrize("model", CACHED)
def test_decoding_through_the_models_own_cache_passes_a_correct_function(cached_decoding, model):
    """Prefill then decode, the model handed its own cache object (the one it makes, then the
    one it handed its layer), equals the full forward: checked, not skipped."""
    result = cached_decoding(model, functions.through_sdpa)
    assert result.status is Status.PASSED, result.reason


@pytest.mark.parametrize("model", CACHED)
def test_a_function_that_keeps_as_many_keys_as_queries_fails_kv_cache(cached_decoding, model):
    """Right over a whole sequence, wrong in a cached decoding (fewer queries than keys): only
    decoding through the cache shows it."""
    result = cached_decoding(model, functions.keys_as_many_as_queries)
    assert result.status is Status.FAILED and "decode call" in result.reason, result.reason
