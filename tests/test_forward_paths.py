"""Every path a forward offers (``tests/fixtures/paths.py``): a switch that claims the same
attention (``need_weights``, ``output_attentions``) is found in forward's signature, confirmed
by a call, and held to the default call's output, causal calls included; a path declared is held
the same way; a switch of another name that changes the output is said, not held."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from torch import nn

from conformance import Status
from conformance.inference import infer
from conformance.model.declarations import Declarations
from conformance.model.remedies import texts
from conformance.run.many import check
from tests.fixtures import paths


@pytest.mark.parametrize("cls", paths.CORRECT, ids=lambda c: c.__name__)
def test_each_correct_layer_agrees_on_every_path(cls):
    results = {r.check: r for r in check(cls, devices=["cpu"], checks=["path_agreement",
                                                                        "causal"])}
    assert results["path_agreement"].status is Status.PASSED, results["path_agreement"]
    assert results["causal"].status is Status.PASSED, results["causal"]


@pytest.mark.parametrize(("cls", "name"), list(paths.BROKEN.items()),
                         ids=lambda v: getattr(v, "__name__", v))
def test_a_path_that_computes_other_attention_fails_path_agreement(cls, name):
    result = next(iter(check(cls, devices=["cpu"], checks=[name])))
    assert result.status is Status.FAILED, result
    assert "differs from the no-grad eval call" in result.reason


def test_a_weights_path_that_drops_the_causal_mask_is_named_for_it():
    result = next(iter(check(paths.WeightsDropCausal, devices=["cpu"],
                             checks=["path_agreement"])))
    assert "computes the attention without its causal mask" in str(result.hint), result


def test_the_switches_are_found_and_said():
    assert any(note.startswith("need_weights=True: another path to the same attention")
               for note in texts(infer(paths.WeightsOnRequest).notes))
    caps = infer(paths.ReturnsAttentions).implementation.capabilities
    assert caps.paths == (("output_attentions=True", (("output_attentions", True),)),)


class Sharpened(nn.Module):
    """A switch of its own: ``sharpen=True`` doubles the logits (a setting, not a path)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.inner = nn.MultiheadAttention(d_model, num_heads, batch_first=True)

    def forward(self, x, sharpen=False):
        return self.inner(x * (2.0 if sharpen else 1.0), x, x, need_weights=False)[0]


def test_a_switch_of_another_name_is_a_setting_unless_declared():
    said = texts(infer(Sharpened).notes)
    assert any(note.startswith("sharpen=True changes its output: a setting of its own")
               for note in said), said
    assert infer(Sharpened).implementation.capabilities.paths == ()
    declared = infer(Sharpened, declared=Declarations(paths=("sharpen=true",)))
    assert declared.implementation.capabilities.paths == (
        ("sharpen=true", (("sharpen", True),)),)
    result = next(iter(check(Sharpened, devices=["cpu"], checks=["path_agreement"],
                             declare={"paths": ["sharpen=true"]})))
    assert result.status is Status.FAILED


def test_the_default_calls_value_of_need_weights_is_false():
    """nn.MultiheadAttention's form defaults need_weights to True; the suite's calls pass False
    (the fast path), so the other path is True."""
    from conformance.inference.names.convention import read_forward

    assert read_forward(nn.MultiheadAttention.forward).switches[0] == ("need_weights", False,
                                                                        (True,))


class ChoosesItsKernel(nn.Module):
    """``attn_impl: Literal["sdpa", "eager"]``: two ways to the same attention; the eager one
    forgets the scale when ``broken``."""

    broken = False

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, attn_impl: Literal["sdpa", "eager"] = "sdpa"):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        if attn_impl == "sdpa":
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            scale = 1.0 if self.broken else q.shape[-1] ** -0.5
            y = (q @ k.transpose(-2, -1) * scale).softmax(-1) @ v
        return y.transpose(1, 2).reshape(b, n, d)


class EagerUnscaled(ChoosesItsKernel):
    """BROKEN twin: the eager choice never scales its logits. Caught by: path_agreement."""

    broken = True


def test_a_choice_of_kernel_is_a_path_of_each_value():
    caps = infer(ChoosesItsKernel).implementation.capabilities
    assert caps.paths == (("attn_impl=eager", (("attn_impl", "eager"),)),)
    (good,) = check(ChoosesItsKernel, devices=["cpu"], checks=["path_agreement"])
    (bad,) = check(EagerUnscaled, devices=["cpu"], checks=["path_agreement"])
    assert (good.status, bad.status) == (Status.PASSED, Status.FAILED), (good, bad)
