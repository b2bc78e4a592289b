"""A model class is a target (conformance.inference.models): its attention layers found by
behaviour in the smallest model of its architecture, each kind checked driven through that model
(conformance.subject.layer_in_model), nothing declared."""

from __future__ import annotations

import pytest
import torch

from conformance import Status
from conformance.inference.models.attention_layers import attention_paths, kinds
from conformance.inference.models.model_route import (
    is_model_class,
    model_implementations,
    wanted,
)
from conformance.inference.models.tiny_config import LONGEST, takes_kv_heads, tiny_config
from conformance.loading.registry import resolve
from conformance.model.remedies import texts
from conformance.model.spec import FIRST
from conformance.run.many import check_many
from conformance.subject.layer_in_model import LayerInModel

transformers = pytest.importorskip("transformers")

PASSING = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "PhiForCausalLM",
           "BertModel", "Gemma2ForCausalLM", "GPT2LMHeadModel", "BloomForCausalLM")
"""Models whose attention passes driven through them, nothing declared (Phi: RoPE on half its
head width; BERT: an encoder over token ids, its output projection a sibling module; Gemma 2:
RoPE with a logit softcap, and a scale set by query_pre_attn_scalar; GPT-2: a fused Conv1D
projection whose ``view`` needs the contiguous states its model hands it; BLOOM: ALiBi, and a
residual its attention's forward adds, measured and kept out)."""

QWEN3 = "transformers.models.qwen3.modeling_qwen3:Qwen3Attention"
"""An attention class built from a config, whose forward takes the position embeddings its model
computes: checked through the model it is defined with (a per-head QK-norm, through SDPA)."""


def tiny_llama():
    return transformers.LlamaForCausalLM(tiny_config(transformers.LlamaConfig, 16, 2, 1)).eval()


def test_the_attention_layers_are_found_by_what_their_forward_runs():
    found = attention_paths(tiny_llama(), lambda m: m(torch.zeros(1, 4, dtype=torch.long)))
    assert list(found) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert kinds(found) == {"LlamaAttention": list(found)}


def test_a_layer_driven_by_its_model_takes_hidden_states_and_only_its_parameters_learn():
    model = tiny_llama()
    driven = LayerInModel(model, "model.layers.1.self_attn")  # fed token ids, the default
    x = torch.randn(2, 5, 16, requires_grad=True)
    out = driven(x, attention_mask=torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]))
    assert out.shape == (2, 5, 16)
    out.sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0
    learning = {name for name, p in driven.named_parameters() if p.requires_grad}
    assert learning and all(name.startswith("layer.") or ".layers.1.self_attn." in name
                            for name in learning)


def test_a_layer_in_its_model_is_judged_by_its_own_weights_alone():
    """BERT's output projection is a sibling module its model calls after the layer: no spare
    layer of the attention, so no doubt about one; the positions are the model's."""
    (inferred,) = model_implementations(transformers.BertModel, "transformers:BertModel")
    said = " ".join(texts(inferred.notes))
    assert "no output projection" in said and "never calls it" not in said
    assert inferred.implementation.capabilities.max_len == LONGEST


def test_a_model_class_is_told_from_a_layer_class():
    assert is_model_class(transformers.LlamaForCausalLM)
    assert not is_model_class(transformers.models.llama.modeling_llama.LlamaAttention)
    assert takes_kv_heads(transformers.LlamaConfig) and not takes_kv_heads(transformers.BertConfig)


def test_each_kind_says_the_paths_it_stands_for_and_that_its_model_drives_it():
    (found,) = model_implementations(transformers.LlamaForCausalLM, "transformers:LlamaForCausalLM")
    assert found.implementation.name == "transformers:LlamaForCausalLM:model.layers.0.self_attn"
    said = texts(found.notes)
    assert said[0].startswith("model.layers.0.self_attn: LlamaAttention, also "
                              "model.layers.1.self_attn: driven by its model")
    assert any("RoPE on half-split pairs" in note for note in said)


def test_a_worker_that_wants_one_kind_infers_that_kind_alone():
    """Each kind is named ``origin:first path``; a name that is one keeps that kind alone (a
    worker checking it infers no other), any other keeps them all."""
    groups = {"BartAttention (encoder self)": ["model.encoder.layers.0.self_attn"],
              "BartAttention (cross)": ["model.decoder.layers.0.encoder_attn"]}
    assert wanted(groups, "bart", "bart:model.decoder.layers.0.encoder_attn") == {
        "BartAttention (cross)": ["model.decoder.layers.0.encoder_attn"]}
    assert wanted(groups, "bart", None) == wanted(groups, "bart", "bart:elsewhere") == groups
    others: list[str] = []
    assert wanted(groups, "bart", FIRST, others) == {
        "BartAttention (encoder self)": ["model.encoder.layers.0.self_attn"]}
    assert others == ["bart:model.decoder.layers.0.encoder_attn"]  # named, for its own worker


def test_a_layer_class_built_from_a_config_is_driven_through_the_model_it_is_defined_with():
    (impl,) = resolve(QWEN3)
    assert impl.name == "modeling_qwen3:Qwen3Attention:layers.0.self_attn"
    assert texts(impl.notes)[0].startswith(
        "layers.0.self_attn: Qwen3Attention, also layers.1.self_attn: driven by its model "
        "(Qwen3Model built from Qwen3Config")


OWN = ("tests.fixtures.own_models:gpt", "tests.fixtures.own_models:encoder",
       "tests.fixtures.own_models:vit")
"""Model instances of one's own, not from transformers: a GPT on token ids, an encoder over
hidden states with a padding mask (nn.MultiheadAttention inside), a ViT on images."""


def test_a_model_instance_of_ones_own_is_checked_through_itself():
    (gpt,) = resolve(OWN[0])
    assert gpt.name == "own_models:gpt:blocks.0.attn"
    assert texts(gpt.notes)[0].startswith("blocks.0.attn: CausalSelfAttention, also "
                                          "blocks.1.attn: driven by its model (the instance (GPT")
    assert gpt.capabilities.causality.kind == "always" and gpt.capabilities.mask is None
    (encoder,) = resolve(OWN[1])
    assert encoder.name == "own_models:encoder:attentions.0.attention"
    assert encoder.capabilities.mask.layout.value == "key_padding"
    (vit,) = resolve(OWN[2])  # fed an image of its own size: the cases replace what its patches give
    assert vit.name == "own_models:vit:attentions.0"
    assert vit.capabilities.causality.kind == "never" and vit.capabilities.mask is None


def test_an_attention_layer_instance_is_still_checked_as_one():
    (layer,) = resolve("tests.fixtures.own_models:layer")
    assert layer.name == "own_models:layer"
    assert not any("driven by its model" in note for note in texts(layer.notes))


JUDGED = {"gpt": ("reference", "causal", "autograd", "scale"),
          "vit": ("reference", "autograd", "scale", "head_split", "permutation"),
          "encoder": ("reference", "padding", "autograd", "scale"),
          "BertModel": ("reference", "padding", "autograd", "scale", "head_split"),
          "PhiForCausalLM": ("reference", "causal", "padding", "kv_groups", "autograd", "scale",
                             "kv_cache"),
          "GPT2LMHeadModel": ("contract", "reference", "causal", "padding", "autograd", "scale",
                              "kv_cache"),
          "BloomForCausalLM": ("reference", "causal", "padding", "autograd", "scale", "alibi",
                               "position_shift")}
"""The checks each own model must be judged by (no mask in the GPT, nothing causal in the
encoder, no grouped heads in either; BERT is not causal and has no grouped heads). A decoder's
KV cache is decoded through the model's own cache object."""


ENCODER_DECODERS = {
    "BartForConditionalGeneration": {
        "model.encoder.layers.0.self_attn": ("reference", "padding", "autograd", "scale"),
        "model.decoder.layers.0.self_attn": ("reference", "padding", "causal", "autograd",
                                             "scale", "kv_cache"),
        "model.decoder.layers.0.encoder_attn": ("reference", "padding", "autograd", "scale")},
    "T5ForConditionalGeneration": {
        "encoder.block.0.layer.0.SelfAttention": ("reference", "padding", "autograd",
                                                  "position_shift"),
        "decoder.block.0.layer.0.SelfAttention": ("reference", "padding", "causal", "autograd",
                                                  "position_shift", "kv_cache"),
        "decoder.block.0.layer.1.EncDecAttention": ("reference", "padding", "autograd")},
    "WhisperForConditionalGeneration": {
        "model.encoder.layers.0.self_attn": ("reference", "autograd", "scale"),
        "model.decoder.layers.0.self_attn": ("reference", "padding", "causal", "autograd",
                                             "scale", "kv_cache"),
        "model.decoder.layers.0.encoder_attn": ("reference", "autograd", "scale")},
}
"""Encoder-decoders, each kind of layer (encoder self, decoder self, cross) with the checks that
must pass it: T5's relative bias is checked by position_shift (its scale of 1 warns: intent);
Whisper passes its encoder and its cross-attention no mask; the decoder's KV cache is decoded
through the model's own (an EncoderDecoderCache)."""


DESIGNED = {"GraniteForCausalLM": Status.PASSED, "GPTNeoForCausalLM": Status.WARNED}
"""Models whose scale their architecture sets, and the scale check's verdict: Granite's layer
declares its (``scaling``, its config's ``attention_multiplier``), and is held to it; GPT-Neo's
logits are unscaled, which nothing declares: a warning, once (the reference computes with it)."""


@pytest.fixture(scope="module")
def checked():
    targets = [(QWEN3, impl) for impl in resolve(QWEN3)]
    targets += [(spec, impl) for spec in OWN for impl in resolve(spec)]
    for name in (*PASSING, *ENCODER_DECODERS, *DESIGNED):
        targets += [(f"transformers:{name}", impl) for impl in resolve(f"transformers:{name}")]
    by_kind: dict[str, dict] = {}
    for result in check_many(targets, devices=["cpu"], jobs=2):
        by_kind.setdefault(result.implementation, {})[result.check] = result
    return by_kind


def _kinds(checked, name: str) -> dict[str, dict]:
    """Each kind of layer checked in model ``name``: its path, and its results."""
    return {implementation.rsplit(":", 1)[1]: results
            for implementation, results in checked.items()
            if implementation.split(":")[1] == name}


@pytest.mark.parametrize("name", [*PASSING, "Qwen3Attention", "gpt", "encoder", "vit"])
def test_the_model_from_its_class_name_alone_passes(checked, name):
    for path, results in _kinds(checked, name).items():
        failed = {check: r.reason for check, r in results.items()
                  if r.status in (Status.FAILED, Status.SUITE_ERROR)}
        assert not failed, path
        # Judged, each: passed, or (reference) warning that RoPE is undefined at head width 1.
        for check in JUDGED.get(name, ("reference", "causal", "padding", "kv_groups",
                                       "autograd", "scale", "kv_cache")):
            assert results[check].status in (Status.PASSED, Status.WARNED), (check, path)
        # Through the weights (RoPE found by behaviour); Qwen 3's QK-norm, and a window the
        # layer fixes itself (measured after the weight search, which doesn't apply it),
        # through its core.
        through_core = (name == "Qwen3Attention"
                        or results["sliding_window"].status is Status.PASSED)
        assert results["reference"].route.value == ("core" if through_core else "weights")


def test_what_its_model_never_hands_a_layer_is_stated_not_judged(checked):
    """GPT-2's attention reshapes its states with ``view``, which raises on non-contiguous
    ones; its model hands it a norm's contiguous output only (observed), so ``contract`` says
    those layouts are outside its domain and passes, where the layer alone is held to them."""
    from conformance.checks.invariants.contract import OUTSIDE_ITS_DOMAIN

    (results,) = _kinds(checked, "GPT2LMHeadModel").values()
    assert results["contract"].status is Status.PASSED
    assert OUTSIDE_ITS_DOMAIN in results["contract"].observations
    llama = next(iter(_kinds(checked, "LlamaForCausalLM").values()))
    assert OUTSIDE_ITS_DOMAIN in llama["contract"].observations


def test_what_a_layers_forward_adds_besides_attention_is_measured_and_kept_out(checked):
    """BLOOM's attention adds its ``residual`` argument to its output inside its forward: the
    output moves by exactly it (measured), so the layer is driven with zeros there, its weights
    and ALiBi are found, and the reference holds (before: no weights found, half the checks
    skipped)."""
    (results,) = _kinds(checked, "BloomForCausalLM").values()
    (implementation,) = [impl for impl in resolve("transformers:BloomForCausalLM")]
    assert "its forward adds its argument at position 1 to its output unchanged" in texts(
        implementation.notes)[0]
    assert results["reference"].status is Status.PASSED
    assert results["alibi"].status is Status.PASSED


@pytest.mark.parametrize("name", list(DESIGNED))
def test_a_scale_the_architecture_sets_is_judged_once_against_what_its_model_declares(
        checked, name):
    """No FAIL: the scale is judged by ``scale`` alone, against the layer's own ``scaling``
    where its model declares one (Granite), else a warning naming it (GPT-Neo, both its global
    and its local kinds, built from a tiny config whose layer pattern covers its layers)."""
    kinds = _kinds(checked, name)
    assert len(kinds) == (2 if name == "GPTNeoForCausalLM" else 1), list(kinds)
    for path, results in kinds.items():
        assert not [c for c, r in results.items() if r.status is Status.FAILED], path
        assert results["scale"].status is DESIGNED[name], results["scale"].reason
        assert results["reference"].status in (Status.PASSED, Status.WARNED), path


def test_sliding_layers_are_a_kind_of_their_own_and_their_window_is_checked(checked):
    """Gemma 2's alternating sliding and full layers (its config's layer_types) are two kinds;
    Mistral's layers are all sliding. The window (4 keys in the smallest model) is measured in
    what each row sees, and sliding_window passes where it is, and only there."""
    gemma = _kinds(checked, "Gemma2ForCausalLM")
    assert set(gemma) == {"model.layers.0.self_attn", "model.layers.1.self_attn"}
    assert gemma["model.layers.0.self_attn"]["sliding_window"].status is Status.PASSED
    assert gemma["model.layers.1.self_attn"]["sliding_window"].status is Status.SKIPPED
    (mistral,) = _kinds(checked, "MistralForCausalLM").values()
    assert mistral["sliding_window"].status is Status.PASSED


def test_pytest_parametrizes_a_model_by_its_kinds_of_attention_layer():
    from conformance.testing import parametrize_with_checks
    from tests.fixtures.own_models import gpt

    mark = parametrize_with_checks(gpt, devices=("cpu",), checks=["gate", "causal"])
    assert [param.id for param in mark.args[1]] == ["GPT:blocks.0.attn-gate",
                                                    "GPT:blocks.0.attn-causal"]


@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_an_encoder_decoder_is_checked_on_both_sides_and_across(checked, name):
    """Each side's self-attention and the decoder's cross-attention over the encoder's states
    are kinds of their own, driven through the model: each passes what applies to it."""
    kinds_checked = _kinds(checked, name)
    assert set(kinds_checked) == set(ENCODER_DECODERS[name])
    for path, results in kinds_checked.items():
        failed = {check: r.reason for check, r in results.items()
                  if r.status in (Status.FAILED, Status.SUITE_ERROR)}
        assert not failed, path
        for check in ENCODER_DECODERS[name][path]:
            assert results[check].status is Status.PASSED, (check, path)


def test_the_side_of_each_layer_is_observed_and_so_is_the_mask_that_reaches_it():
    """One forward with the encoder's input and the decoder's of different lengths tells each
    layer's side; hiding a key through the model's mask for that side tells whether a mask
    reaches it (Whisper's encoder and cross-attention take none); a call with ``use_cache``
    whether the model hands it a KV cache (its decoder's self-attention alone; not BERT's
    encoder, though BertModel's forward takes ``past_key_values``)."""
    from conformance.inference.models.sides import feeds, found_by_running
    from conformance.subject.layer_in_model import First, Side

    model = transformers.WhisperForConditionalGeneration(
        tiny_config(transformers.WhisperConfig, 16, 2)).eval()
    first, found = found_by_running(model, {"use_cache": False})
    assert first.first is First.FIXED and first.shape == (8, 16)  # 8 mel bins, 16 frames
    fed = feeds(model, first, found, {"use_cache": False}, masked=True)
    assert {path: (feed.side, feed.mask, feed.cached) for path, feed in fed.items()
            if ".0." in path} == {
        "model.encoder.layers.0.self_attn": (Side.ENCODER, None, False),
        "model.decoder.layers.0.self_attn": (Side.DECODER, "decoder_attention_mask", True),
        "model.decoder.layers.0.encoder_attn": (Side.CROSS, None, False)}
    assert fed["model.decoder.layers.0.encoder_attn"].context == "key_value_states"
    assert list(kinds(found, model.config, {p: f.side.value for p, f in fed.items()})) == [
        "WhisperAttention (encoder self)", "WhisperAttention (decoder self)",
        "WhisperAttention (cross)"]
    bert = transformers.BertModel(tiny_config(transformers.BertConfig, 16, 2)).eval()
    first, found = found_by_running(bert, {"use_cache": False})
    assert not any(feed.cached for feed in feeds(bert, first, found, {"use_cache": False},
                                                 masked=True).values())


def test_declarations_apply_per_layer_class_inside_a_model():
    """``declare={"CausalSelfAttention": {...}}`` (``--layer CLASS:NAME=VALUE``) states it for
    the layers of that class alone: the GPT's scale declared 1/w is held to that; declared for a
    class the model doesn't hold, nothing changes."""
    from conformance.model.declarations import Declarations
    from conformance.testing import parametrize_with_checks

    (gpt,) = resolve(OWN[0], Declarations(layer=("CausalSelfAttention:scale=head_dim",)))
    law = gpt.capabilities.position.encoding.scale
    assert law.declared and law.power == -1.0
    (other,) = resolve(OWN[0], Declarations(layer=("ViTAttention:scale=head_dim",)))
    assert other.capabilities.position.encoding is None or \
        other.capabilities.position.encoding.scale is None
    mark = parametrize_with_checks(OWN[0], devices=("cpu",), checks=["scale"],
                                   declare={"CausalSelfAttention": {"scale": "head_dim"}})
    (param,) = mark.args[1]
    assert param.id == "own_models:gpt:blocks.0.attn-scale"


def test_a_model_is_built_from_a_declared_config_file_and_checked_as_that_instance(tmp_path):
    """``--config FILE.json``: a config that can't be made tiny, or sizes of one's own; the
    model is built from that file and checked as that instance is (its sizes and weights); a
    file it can't be built from is one line naming it."""
    from conformance.loading.registry import ResolveError
    from conformance.model.declarations import Declarations

    path = tmp_path / "config.json"
    transformers.LlamaConfig(hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
                             intermediate_size=96, num_hidden_layers=1, vocab_size=32,
                             max_position_embeddings=256,
                             initializer_range=48 ** -0.5).to_json_file(str(path))
    (impl,) = resolve("transformers:LlamaForCausalLM", Declarations(config=str(path)))
    said = texts(impl.notes)
    assert f"built from the declared config {path} (LlamaConfig, width 48)" in said
    assert impl.capabilities.max_len == 256
    results = check_many([("transformers:LlamaForCausalLM", impl)], devices=["cpu"],
                         checks=["reference", "kv_groups"], declared=Declarations(config=str(path)))
    assert {r.check: r.status for r in results} == {"reference": Status.PASSED,
                                                    "kv_groups": Status.PASSED}
    with pytest.raises(ResolveError, match=r"^transformers:LlamaForCausalLM: LlamaForCausalLM "
                                           r"could not be built from the declared config "
                                           r".*missing\.json \(FileNotFoundError"):
        resolve("transformers:LlamaForCausalLM", Declarations(config=str(tmp_path / "missing.json")))


class _Router(torch.nn.Module):
    """Each token's weights over the experts: a softmax over logits a parameter makes."""

    def __init__(self, width: int, experts: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(width, experts)

    def forward(self, h):
        return self.gate(h.reshape(-1, h.shape[-1])).softmax(dim=-1)


class _Routed(torch.nn.Module):
    """Attention, then a mixture of experts routed by a softmax over its experts' logits."""

    def __init__(self, width: int = 8, experts: int = 8) -> None:
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(width, 2, batch_first=True)
        self.router = _Router(width, experts)

    def forward(self, x):
        h = self.attention(x, x, x)[0]
        return h * self.router(h).max(dim=-1).values.view(*h.shape[:-1], 1)


def test_a_softmax_over_what_a_module_holds_is_no_attention():
    """Attention normalises over tokens: a router's softmax over its experts (an axis none of
    its inputs has) is seen and skipped, named with the size it normalised over."""
    skipped: dict[str, int] = {}
    found = attention_paths(_Routed(), lambda m: m(torch.randn(1, 5, 8)), skipped)
    assert list(found) == ["attention"] and skipped == {"router": 8}


@pytest.mark.parametrize("name", ["MixtralForCausalLM", "GptOssForCausalLM"])
def test_a_mixture_of_experts_router_is_not_taken_for_attention(name):
    """Mixtral's gate and gpt-oss's router are listed as seen and skipped; their attention
    layers (gpt-oss's with a sink logit beside the keys, sliding and full) are the kinds."""
    implementations = resolve(f"transformers:{name}")
    assert implementations and all(i.name.endswith("self_attn") for i in implementations)
    said = " ".join(texts(implementations[0].notes))
    assert "seen and skipped, not attention: model.layers.0.mlp." in said


@pytest.mark.parametrize("name", ["GPTJForCausalLM", "CodeGenForCausalLM", "FalconForCausalLM",
                                  "GPTNeoForCausalLM"])
def test_a_tiny_config_fills_what_its_config_asks_for(name):
    """GPT-J's and CodeGen's rotated width in proportion to the head (their 64 is wider than a
    tiny head), Falcon's ``head_dim`` left to the property that computes it, GPT-Neo's
    ``attention_types`` covering two layers: each smallest model builds and runs."""
    model_class = getattr(transformers, name)
    model = model_class(tiny_config(model_class.config_class, 64, 4)).eval()
    with torch.no_grad():
        assert model(torch.zeros(1, 5, dtype=torch.long)).logits.shape == (1, 5, 32)


def test_a_weight_layout_that_holds_at_one_head_count_only_is_not_used():
    """CodeGen reads its fused projection in groups whose layout depends on the head count: the
    layout found at 4 heads does not reproduce its output at 8, so it is said and the checks
    that need weights skip (they would fail a correct model at every other head count)."""
    (implementation,) = resolve("transformers:CodeGenForCausalLM")
    assert any("the layout holds at 4 heads only" in note for note in texts(implementation.notes))
    assert not implementation.capabilities.weights


def test_a_pattern_names_every_model_class_the_library_lists():
    """``transformers:PATTERN`` matches the class names of the library's own auto mappings
    (causal LMs, base models, encoder-decoders, masked LMs, image classifiers)."""
    from conformance.loading.model_names import is_pattern, model_names

    assert is_pattern("transformers:*ForCausalLM") and not is_pattern("transformers:GPT2Model")
    assert model_names("transformers:Bloom*") == ["transformers:BloomForCausalLM",
                                                  "transformers:BloomModel"]
    causal = model_names("transformers:*ForCausalLM")
    assert len(causal) > 100 and "transformers:LlamaForCausalLM" in causal


def test_a_sweep_checks_each_model_and_says_each_it_could_not(monkeypatch, capsys):
    """Each model a pattern names is a target; one that can't be built or run is one line and
    the others are checked (DeepSeek-V3's tiny config can't be run)."""
    from conformance.frontends import cli, command_targets

    monkeypatch.setattr(command_targets, "model_names", lambda spec: [
        "transformers:BloomForCausalLM", "transformers:DeepseekV3ForCausalLM"])
    assert cli.main(["check", "transformers:Sweep*", "--check", "gate"]) == 0
    out, err = capsys.readouterr()
    assert "transformers:BloomForCausalLM:transformer.h.0.self_attention  PASS" in out
    assert "not checked: transformers:DeepseekV3ForCausalLM: the smallest model" in err
    assert "1 of the 2 model(s) transformers:Sweep* names not checked (each said above)" in err
