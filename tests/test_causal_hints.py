"""The causal check names a causal-mask mistake only where the module's behaviour reproduces it.

Mutants that scramble heads, mix batch and heads or use the key projection for the values, made
causal with a correct causal mask, fail the causal check (their outputs mix positions) but must
not be told their mask hides the current token or shows the next one; the mutants whose causal
mask is off by one are told so, with weight access (the output matches the reference under that
mask) and without (which rows each position changes), called with q, k, v or with x alone. Each
mistake is named with its kind of bug, the one other checks give it; a softmax over the query
axis (later queries share each key's weight) is named where the weights tell it apart.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from torch import nn

from conformance import Implementation, Status
from conformance.checks import mask_mistakes
from conformance.checks.diagnosis import Bug
from conformance.checks.invariants.causal import QUERY_AXIS
from conformance.checks.invariants.causal_core import QUERY_AXIS_IN_CORE
from conformance.implementations.mutants import (
    batch_heads_mixed,
    causal_hides_current_token,
    causal_shows_next_token,
    heads_merged_without_transpose,
    heads_view_no_transpose,
    mask_drops_causality,
    same_projection_for_k_and_v,
    softmax_query_axis,
)
from conformance.implementations.mutants.textbook import TextbookAttention, declare
from conformance.run.many import check_many

CAUSAL_WORDS = (mask_mistakes.Mistake.HIDES_CURRENT.words, mask_mistakes.Mistake.SHOWS_NEXT.words,
                mask_mistakes.Mistake.IGNORES_CAUSAL.words, mask_mistakes.Mistake.REPLACES_CAUSAL.words,
                "the padding mask undoes the causal masking", "softmax over the query axis")


def _mutant_class(module) -> type[TextbookAttention]:
    """The TextbookAttention subclass a mutant module defines."""
    (cls,) = [value for value in vars(module).values() if isinstance(value, type)
              and issubclass(value, TextbookAttention) and value is not TextbookAttention]
    return cls


def _causal(module, *, weights: bool = True, call: str = "qkv") -> Implementation:
    """The mutant made causal (its causal mask correct unless the mutant is about it)."""
    cls = _mutant_class(module)
    name = f"{module.IMPLEMENTATION.name}-causal-{call}{'' if weights else '-no-weights'}"
    impl = declare(name, cls, causal=True, description="the mutant, causal")
    factory = impl.factory
    if call == "self":
        def factory(config, make=impl.factory):
            return _SelfCall(make(config))
    capabilities = replace(impl.capabilities, call=call, cross_attention=False)
    layout = impl.weight_layout
    if call == "self" and layout is not None:
        layout = type(layout)(**{role: f"inner.{path}" for role, path in vars(layout).items()})
    return Implementation(name, factory, capabilities, layout if weights else None,
                          description="the mutant, causal")


class _SelfCall(nn.Module):
    """``forward(x, mask=None)``: the inner q, k, v module on x."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x, mask=None):
        return self.inner(x, x, x, mask)


def _causal_result(impl: Implementation):
    (result,) = check_many([(impl.name, impl)], devices=["cpu"], checks=["causal"])
    return result


@pytest.mark.parametrize("module", [same_projection_for_k_and_v, heads_view_no_transpose,
                                    batch_heads_mixed, heads_merged_without_transpose],
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
@pytest.mark.parametrize("weights", [True, False], ids=["weights", "no-weights"])
def test_a_correct_causal_mask_is_never_blamed_for_another_bug(module, weights):
    result = _causal_result(_causal(module, weights=weights))
    assert result.status is not Status.SKIPPED, result.reason
    assert not any(words in (result.hint or "") for words in CAUSAL_WORDS), result.hint


@pytest.mark.parametrize("call", ["qkv", "self"])
@pytest.mark.parametrize("weights", [True, False], ids=["weights", "no-weights"])
@pytest.mark.parametrize("module,words", [
    (causal_hides_current_token, mask_mistakes.Mistake.HIDES_CURRENT.words),
    (causal_shows_next_token, mask_mistakes.Mistake.SHOWS_NEXT.words),
], ids=["hides-current", "shows-next"])
def test_a_causal_mask_off_by_one_is_named(module, words, weights, call):
    result = _causal_result(_causal(module, weights=weights, call=call))
    assert result.status is Status.FAILED
    assert result.hint == words
    # With its kind, the one other checks give the same mistake (a grade charges it once).
    assert result.bug == mask_mistakes.kind_of(mask_mistakes.Mistake(words))


def test_a_padding_mask_replacing_the_causal_one_is_named_with_its_kind():
    result = _causal_result(mask_drops_causality.IMPLEMENTATION)
    assert result.status is Status.FAILED
    assert result.hint.startswith(mask_mistakes.Mistake.REPLACES_CAUSAL.words)
    assert result.bug == mask_mistakes.kind_of(mask_mistakes.Mistake.REPLACES_CAUSAL)


@pytest.mark.parametrize("call", ["qkv", "self"])
def test_a_softmax_over_the_query_axis_is_named_with_its_kind(call):
    result = _causal_result(_causal(softmax_query_axis, call=call))
    assert result.status is Status.FAILED
    assert result.hint == QUERY_AXIS and result.bug == Bug.SOFTMAX_OVER_QUERIES.value


@pytest.mark.parametrize("call", ["qkv", "self"])
def test_a_softmax_over_the_query_axis_is_named_at_its_core_without_weights(call):
    """Without a weight layout there is no reference to match, and which rows each key changes
    can't tell it from a mask (called with x, the pattern of a causal mask not applied): the
    core observed in the forward shows the softmax's axis, as the row_stochastic check sees it."""
    result = _causal_result(_causal(softmax_query_axis, weights=False, call=call))
    assert result.status is Status.FAILED
    assert result.hint == QUERY_AXIS_IN_CORE and result.bug == Bug.SOFTMAX_OVER_QUERIES.value
