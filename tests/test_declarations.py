"""Declarations override inference, item by item: CLI flags and pyproject.toml."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conformance.frontends.cli import main
from conformance.inference import Declarations, InferenceError, infer
from conformance.inference.plan import CALL_REMEDY, SIZES_REMEDY
from conformance.loading.registry import ResolveError, resolve
from conformance.model.remedies import remedy_of, texts
from tests.fixtures.user_styles import EinsumAttention

SPEC = "tests.fixtures.user_styles:OddlyNamed"


class ThreeSizes(nn.Module):
    """Three required sizes no name explains: more than the trial fills together."""

    def __init__(self, a, b, c):
        super().__init__()
        self.inner = EinsumAttention(a, b)

    def forward(self, q, k, v, mask=None):
        return self.inner(q, k, v, mask)


def test_sizes_no_name_explains_are_read_from_behaviour():
    """Was: "no constructor argument names the model width" for OddlyNamed(model_width,
    n_attn); each role is now measured."""
    said = texts(resolve(SPEC)[0].notes)
    assert "constructor width = model_width, heads = n_attn" in said
    assert any(note.startswith("n_attn: the head count (filled by trial") for note in said)


def test_a_constructor_behaviour_cant_settle_names_the_declaration_to_add(capsys):
    spec = "tests.test_declarations:ThreeSizes"
    with pytest.raises(ResolveError, match="can't fill constructor argument") as caught:
        resolve(spec)
    assert remedy_of(caught.value) == SIZES_REMEDY
    assert "check that instance" in str(caught.value)  # the route that needs no constructor
    assert "--width-arg" not in str(caught.value)  # the command line's words are the CLI's
    assert main(["check", spec, "--check", "gate"]) == 2
    assert "declare --width-arg NAME to name the model width's argument" in capsys.readouterr().err


def test_flags_fill_what_inference_cannot(capsys):
    code = main(["check", SPEC, "--width-arg", "model_width", "--heads-arg", "n_attn",
                 "--check", "gate", "--check", "padding", "--check", "head_split"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "constructor width = model_width, heads = n_attn" in out


def test_declared_items_are_not_probed_and_say_so():
    notes = texts(infer(EinsumAttention, declared=Declarations(
        mask="keep_bool:broadcast", causal="never", weights="w_q,w_k,w_v,w_o")).notes)
    assert "mask: bool mask, True = attend, shape (B, 1, 1, Lk) (declared)" in notes
    assert "causal: never (declared)" in notes
    assert "weights from w_q/w_k/w_v/w_o (declared)" in notes  # the user's own names


def test_pyproject_table_declares_for_an_impl(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.attention-conformance.declare."{SPEC}"]\n'
        'width-arg = "model_width"\nheads-arg = "n_attn"\nmask = "keep_int:broadcast"\n')
    monkeypatch.chdir(tmp_path)
    (impl,) = resolve(SPEC)
    assert "mask: int mask, 0 = masked, shape (B, 1, 1, Lk) (declared)" in texts(impl.notes)
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.attention-conformance.declare."{SPEC}"]\nwidth = "model_width"\n')
    with pytest.raises(ResolveError, match="unknown declaration"):
        resolve(SPEC)


def test_init_and_mask_format_flags(capsys):
    code = main(["check", "conformance.implementations.mutants.textbook:TextbookAttention", "--init",
                 "causal=True", "--mask-format", "keep_bool:broadcast", "--check", "gate",
                 "--check", "causal", "--check", "mask_formats"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "constructed with causal=True (declared)" in out
    assert "also takes bool mask, True = attend, shape (B, 1, 1, Lk) (declared)" in out
    assert main(["check", "conformance.implementations.mutants.textbook:TextbookAttention", "--init",
                 "causal"]) == 2
    assert "use NAME=VALUE" in capsys.readouterr().err


def test_a_forward_of_no_known_shape_is_one_line(capsys):
    class NoInputs(torch.nn.Module):
        def __init__(self, d_model, num_heads):
            super().__init__()

        def forward(self):
            return None

    with pytest.raises(InferenceError, match=r"forward takes no input tensor") as caught:
        infer(NoInputs)
    assert caught.value.remedy == CALL_REMEDY


def test_declarations_per_layer_class_apply_to_that_class_alone_over_the_rest():
    from conformance.model.declaration_sources import for_layer, from_mapping
    from conformance.model.declarations import DeclarationError

    stated = from_mapping({"dtypes": "float32", "LlamaAttention": {"kv-grouping": "tiled",
                                                                   "init": {"causal": True}},
                           "layer": {"BertSelfAttention": {"dtypes": "float64"}}}, "declare")
    assert stated.layer == ("BertSelfAttention:dtypes=float64", "LlamaAttention:kv-grouping=tiled",
                            "LlamaAttention:init=causal=True")
    llama = for_layer(stated, "LlamaAttention")
    assert (llama.kv_grouping, llama.init, llama.dtypes, llama.layer) == (
        "tiled", (("causal", True),), "float32", None)
    assert for_layer(stated, "BertSelfAttention").dtypes == "float64"
    other = for_layer(stated, "MistralAttention")
    assert (other.kv_grouping, other.dtypes) == (None, "float32")
    with pytest.raises(DeclarationError, match="use CLASS:NAME=VALUE"):
        from_mapping({"layer": "LlamaAttention:kv_groupingtiled"}, "declare")
    with pytest.raises(DeclarationError, match="kv-grouping"):
        for_layer(from_mapping({"layer": "LlamaAttention:kv-grouping=sideways"}, "declare"),
                  "LlamaAttention")
