"""Every message once and true (issue 55): each message a newcomer saw said twice or garbled has
a test here that fails on the message as it was."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

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


class MaskRescales(torch.nn.Module):
    """Not causal; given any mask (even one keeping every key) its logits are also rescaled: no
    convention keeps an all-keep mask harmless."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)

    def forward(self, x, mask=None):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / (d // self.h) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf")) * 1.5
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)


def test_a_mask_note_names_causal_only_for_a_causal_module():
    """Was: "(does the mask replace the causal masking? see causal)" for a module that is not
    causal, whose causal check was skipped."""
    said = " ".join(texts(infer(MaskRescales).notes))
    assert "no convention keeps an all-keep mask harmless" in said
    assert "see causal" not in said and "(see padding)" in said


def test_a_mask_note_never_says_the_accepted_shape_raises_in_every_form():
    """Was: "mask: bool mask, True = attend, shape (B, Lk) (probed; forms tried before it: shape
    (B, Lk) raises in every form tried)" for the README's example."""
    spec = importlib.util.spec_from_file_location(
        "my_attention", ROOT / "examples" / "my-attention" / "my_attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (mask,) = [n for n in texts(infer(module.MyAttention).notes) if n.startswith("mask: ")]
    assert "shape (B, Lk) raises" not in mask and "forms tried before it: )" not in mask
    assert mask.startswith("mask: bool mask, True = attend, shape (B, Lk) (probed)")


class WindowArgumentNotCausal(torch.nn.Module):
    """A window argument in a module that is not causal (the window is unused)."""

    def __init__(self, d_model, num_heads, window_size=4):
        super().__init__()
        self.inner = MaskRescales(d_model, num_heads)

    def forward(self, x):
        return self.inner(x)


def test_a_declared_window_is_the_one_said_built_never_the_suites_wide_one():
    """Was: "constructed with window_size=2 (declared)" beside "built with window_size=1024 ...
    not checked as windowed" in one report."""
    from conformance.model.declarations import Declarations

    said = " ".join(texts(infer(WindowArgumentNotCausal,
                                declared=Declarations(init=(("window_size", 2),))).notes))
    assert "constructed with window_size=2 (declared)" in said
    assert "built with window_size=2 (declared), not checked as windowed" in said
    assert "1024" not in said
    bare = " ".join(texts(infer(WindowArgumentNotCausal).notes))
    assert "built with window_size=1024 (a window wider than any sequence)" in bare


class ConfigBuilt(torch.nn.Module):
    """Built from a config object: no argument of its own names a size."""

    def __init__(self, config):
        super().__init__()
        self.inner = MaskRescales(config.dim, config.num_heads)

    def forward(self, x):
        return self.inner(x)


def test_a_declared_size_argument_the_constructor_lacks_is_said_as_such():
    """Was: the undeclared case's "no constructor argument names the model width ... declare
    --width-arg NAME" again after --width-arg dim --heads-arg num_heads were declared."""
    import pytest

    from conformance.inference.plan import InferenceError
    from conformance.model.declarations import Declarations

    with pytest.raises(InferenceError) as raised:
        infer(ConfigBuilt, declared=Declarations(width_arg="dim", heads_arg="num_heads"))
    said = str(raised.value)
    assert ("the width argument declared, 'dim', is not an argument of its constructor (it "
            "takes config)") in said
    assert "no constructor argument names the model width" not in said


def test_the_rules_catch_each_message_a_newcomer_saw():
    """tests/message_rules.py, on the messages as issue 55 quotes them."""
    from tests.message_rules import problems, problems_in

    assert problems_in("on this platform, in bfloat16 only: on this platform, in bfloat16 only: "
                       "row 3 differs; the same case in float32 is clean; the same case in "
                       "float32 is clean")
    assert problems_in("no assignment of 18 tried reproduces its output, closest relative "
                       "error inf: the reference checks will show how it differs")
    assert problems_in("weights: wq/wk/wv/wo (found by behaviour: the float64 reference from "
                       "these weights reproduces its output (relative error 1.4e-16, 2 "
                       "assignment(s) tried)")
    report = {"results": [
        {"implementation": "Layer", "check": "causal", "status": "skipped", "reason": "x"},
        {"implementation": "Layer", "check": "padding", "status": "failed",
         "reason": "given a mask, the output changes in another way (does the mask replace "
                   "the causal masking? see causal)"}],
        "implementations": [{"name": "Layer", "inferred": [
            "constructed with window_size=2 (declared)",
            "window_size: a window argument, but the module is not always causal: built with "
            "window_size=1024 (a window wider than any sequence), not checked as windowed"]}]}
    found = " ".join(problems(report))
    assert "points to causal, skipped for it" in found
    assert "window_size=1024 said beside window_size=2 (declared)" in found
    # Sound messages pass.
    assert not problems_in("the fitted logit scale is 0.408, expected 1/sqrt(head_dim) = "
                           "1/sqrt(3) = 0.577")
    assert not problems_in("rows with every key masked give NaN (the declared policy nan)")


def test_rope_with_a_softcap_is_reproduced_at_every_width_it_builds():
    """Was: "at head width(s) [5, 10] no RoPE hypothesis ... reproduces its output" for a layer
    the float64 reference reproduces at every width: the RoPE measured at each width was held
    to a reference without the softcap found with it."""
    from tests.fixtures.new_architectures import SoftcapAttention

    said = " ".join(texts(infer(SoftcapAttention).notes))
    assert "logit softcap" in said and "RoPE on half-split pairs" in said
    assert "no RoPE hypothesis" not in said
