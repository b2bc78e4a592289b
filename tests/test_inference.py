"""Interface inference: every bundled implementation is checkable with nothing declared, and gets
the verdicts of its hand-written registration."""

from __future__ import annotations

import inspect

import pytest
import torch

from conformance import Config, Status
from conformance.catalogue import check_many
from conformance.inference import Declarations, InferenceError, infer
from conformance.registry import resolve
from implementations import bundled, expected_results
from implementations import seed000_multihead_self_attention as seed000
from implementations.mutants.mask_inverted import MaskInverted

PROBE = Config(batch=1, q_len=2, kv_len=2, d_model=8, num_heads=2)


def _spec(impl) -> str:
    """The IMPL a user would type for the class behind a bundled registration."""
    config = PROBE if impl.capabilities.heads is None else Config(
        batch=1, q_len=2, kv_len=2, d_model=8, num_heads=impl.capabilities.heads)
    cls = type(impl.factory(config))
    return f"{inspect.getmodule(cls).__name__}:{cls.__name__}"


ONE_FLAG = {
    # Registrations that build the class causal (causal=True): `--causal always` declares it, and
    # sets the constructor's causal argument.
    "textbook-causal": Declarations(causal="always"),
    "mutant-causal-shows-next-token": Declarations(causal="always"),
    "mutant-causal-hides-current-token": Declarations(causal="always"),
    # Its bug is a declaration (non-causal) its behaviour contradicts: inference alone reads the
    # behaviour and says "always causal (probed)"; the declaration is the one flag.
    "mutant-encoder-with-causal-mask": Declarations(causal="never"),
    # Its bug lives in an alternative mask format, which is declared, not inferred.
    "mutant-bool-mask-inverted": Declarations(mask_formats=("keep_bool:broadcast",)),
}
CHECKED = {impl.name: _spec(impl) for impl in bundled()}


@pytest.fixture(scope="module")
def inferred_failures() -> dict[str, set[str]]:
    """Failed checks of each registration's class, inferred (plus its one flag, where listed),
    keyed by the registration's name."""
    plain = {name: (spec, resolve(spec)[0]) for name, spec in CHECKED.items()
             if name not in ONE_FLAG}
    by_label: dict[str, set[str]] = {impl.name: set() for _, impl in plain.values()}
    unique = list({impl.name: (spec, impl) for spec, impl in plain.values()}.values())
    for result in check_many(unique, devices=["cpu"], jobs=2):
        if result.status is Status.FAILED:  # inferred: nothing is expected, every failure shows
            by_label[result.implementation].add(result.check)
    failures = {name: by_label[impl.name] for name, (_, impl) in plain.items()}
    for name, declared in ONE_FLAG.items():
        (impl,) = resolve(CHECKED[name], declared)
        failures[name] = {r.check for r in check_many([(CHECKED[name], impl)], devices=["cpu"])
                          if r.status is Status.FAILED}
    return failures


@pytest.mark.parametrize("name", list(CHECKED))
def test_inference_alone_gives_the_registrations_verdicts(inferred_failures, name):
    assert inferred_failures[name] == set(expected_results().get(name, {})), CHECKED[name]


def test_the_report_opens_with_what_was_inferred():
    notes = infer(seed000.MultiHeadAttention).notes
    assert notes[0] == "self-attention forward(X, attention_mask)"
    assert "weights from inner.q_proj/inner.k_proj/inner.v_proj/inner.out_proj" in notes
    assert "attention_mask: int mask, 0 = masked, shape (B, 1, 1, Lk) (probed)" in notes


def test_an_inverted_mask_is_reported_not_accepted():
    notes = infer(MaskInverted).notes
    assert any("is the mask inverted?" in note for note in notes)
    assert any(note.startswith("mask: int mask, 0 = masked") for note in notes)


def test_torch_multihead_attention_through_inference_alone():
    notes = infer(torch.nn.MultiheadAttention).notes
    assert "forward returns a tuple: its first element is taken as the output" in notes
    assert "key_padding_mask: bool mask, True = ignore, shape (B, Lk) (probed)" in notes
    assert "weights from inner.in_proj_weight/inner.out_proj" in notes


def test_unfillable_constructor_is_one_clear_line():
    class NeedsVocabulary(torch.nn.Module):
        def __init__(self, d_model, num_heads, vocabulary):
            super().__init__()

    with pytest.raises(InferenceError, match="can't fill constructor argument"):
        infer(NeedsVocabulary)


@pytest.fixture(scope="module")
def style_results():
    from tests.fixtures import user_styles

    targets = [(f"tests.fixtures.user_styles:{cls.__name__}", impl)
               for cls in user_styles.STYLES
               for impl in resolve(f"tests.fixtures.user_styles:{cls.__name__}")]
    results: dict[str, list] = {}
    for result in check_many(targets, devices=["cpu"], jobs=2):
        results.setdefault(result.implementation, []).append(result)
    return results


def test_twelve_user_styles_are_inferred_and_pass_everything_they_can(style_results):
    assert len(style_results) >= 12
    # The one finding allowed: computing q @ k^T before scaling overflows float16 for q/k of
    # std ~80 (inference declares float16: an nn.Module runs in it). Nothing else may fail.
    for name, results in style_results.items():
        for result in results:
            if result.status is Status.FAILED:
                assert result.check == "stability", (name, result.check, result.reason)
                assert result.reason.startswith("in float16 with q and k of std 80"), name
                assert "overflow float16" in result.hint
    overflowing = {name for name, results in style_results.items()
                   if any(r.status is Status.FAILED for r in results)}
    assert "user_styles:SDPAInside" not in overflowing  # SDPA scales q first
    passed = {name: {r.check for r in results if r.status is Status.PASSED}
              for name, results in style_results.items()}
    # Weights were found for every style: the checks that need them ran.
    assert all({"head_split", "reference", "scale"} <= checks or "row_stochastic" in checks
               for checks in passed.values())
    assert "causal" in passed["user_styles:GPTStyleNoBias"]
    assert "causal" in passed["user_styles:SDPAInside"]
    assert "dropout" in passed["user_styles:WithDropout"]


def test_core_function_tier_checks_a_plain_function():
    from tests.fixtures import core_functions

    (good,) = resolve("tests.fixtures.core_functions:attention")
    assert good.notes[0].startswith("core function over (batch, heads, length, head_dim)")
    assert "causal when is_causal=True" in good.notes
    assert any(n.startswith("mask: bool mask, True = attend, shape (B, 1, 1, Lk)")
               for n in good.notes)
    (bad,) = resolve("tests.fixtures.core_functions:attention_softmax_over_queries")
    targets = [("tests.fixtures.core_functions:attention", good),
               ("tests.fixtures.core_functions:attention_softmax_over_queries", bad)]
    results = check_many(targets, devices=["cpu"], jobs=2)
    failed = {(r.implementation, r.check) for r in results if r.status is Status.FAILED}
    assert not {check for name, check in failed if name.endswith(":attention")}
    assert ("core_functions:attention_softmax_over_queries", "row_stochastic") in failed
    assert core_functions.attention.__name__ == "attention"  # the wrapper leaves it untouched


def test_an_instance_is_checked_through_its_class():
    import tests.fixtures.user_styles as styles

    styles.an_instance = styles.FusedQKV(16, 4)
    (impl,) = resolve("tests.fixtures.user_styles:an_instance")
    assert impl.notes[0].startswith("an instance of FusedQKV: checked through its class")
