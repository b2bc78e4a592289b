"""The suite reproduces exactly the verdict matrix in conformance/implementations/expected_results.toml."""

from __future__ import annotations

import importlib

import pytest

from conformance import CHECK_NAMES, CheckResult, Status
from conformance.checks import mask_mistakes
from conformance.implementations import bundled, expected_results, expected_warnings
from conformance.implementations.kernel_mutants import KERNEL_MUTANT_MODULES
from conformance.implementations.mutants import MUTANT_MODULES
from conformance.numerics.platform_defects import PLATFORM_NOTE
from conformance.run.many import check_many
from tests.message_rules import problems_of, result_messages
from tests.selection import wanted
from tests.verdicts import counted_forks, seen

IMPLEMENTATIONS = {impl.name: impl for impl in bundled()}
MODERN = {"kv_groups", "position_shift", "alibi", "sliding_window", "kv_cache", "packed",
          "configuration"}
"""The modern-form checks, and the configuration of RoPE: a classic implementation declares
none of their forms."""
POSITIONAL = {"permutation"}
"""What a module with a relative position encoding inside skips: order matters by design (the
float64 reference applies its RoPE or ALiBi, so every reference check runs)."""
CORRECT = {  # correct implementations, and the checks they declare they can't take part in
    "reference-sdpa": MODERN,
    "reference-torch-mha": MODERN,
    "textbook": {"causal"} | MODERN,
    "textbook-causal": {"permutation"} | MODERN,
    # Causal and without dropout: permutation and dropout never apply; one mask format.
    # Its rope_theta is declared a setting: configuration varies it.
    "modern-llama": POSITIONAL | {"dropout", "mask_formats", "alibi", "sliding_window",
                                  "packed"},
    "modern-mistral": POSITIONAL | {"dropout", "mask_formats", "alibi", "packed",
                                    "configuration"},
    "modern-sliding-window": {"permutation", "dropout", "mask_formats", "alibi",
                              "position_shift", "configuration"},
    "modern-alibi": POSITIONAL | {"dropout", "mask_formats", "kv_groups", "sliding_window",
                                  "packed", "configuration"},
    # No mask: padding and fully_masked don't apply.
    "modern-llama-sdpa": POSITIONAL | {"dropout", "mask_formats", "padding", "fully_masked",
                                       "alibi", "sliding_window", "packed", "position_shift",
                                       "configuration"},
    "modern-varlen": {"permutation", "dropout", "mask_formats", "padding", "fully_masked",
                      "alibi", "sliding_window", "kv_cache", "position_shift", "configuration"},
}


def _implementation(params: dict) -> str | None:
    """The bundled implementation a test's parameters are about."""
    if "name" in params:
        return params["name"]
    module = params.get("module")
    return getattr(getattr(module, "IMPLEMENTATION", None), "name", None)


@pytest.fixture(scope="module")
def results(request) -> dict[str, dict[str, CheckResult]]:
    """The bundled implementations' verdicts on the CPU (quick profile, both cores): those the
    selected tests are about (``-k mask_inverted`` checks one), every one for a full run."""
    names = wanted(request, {"results", "matrix"}, _implementation)
    targets = [(name, impl) for name, impl in IMPLEMENTATIONS.items()
               if names is None or name in names]
    verdicts: dict[str, dict[str, CheckResult]] = {}
    for result in check_many(targets, devices=["cpu"], jobs=2):
        verdicts.setdefault(result.implementation, {})[result.check] = result
    return verdicts


@pytest.fixture(scope="module")
def shared_results(request) -> dict[str, tuple[list[CheckResult], int]]:
    """The same verdicts, each implementation's checks shared out over two processes
    (conformance.run.shared), one implementation after another; with the forks each made."""
    names = wanted(request, {"shared_results"}, _implementation)
    shared: dict[str, tuple[list[CheckResult], int]] = {}
    for name, impl in IMPLEMENTATIONS.items():
        if names is None or name in names:
            with counted_forks() as forks:
                shared[name] = (check_many([(name, impl)], devices=["cpu"], jobs=2), len(forks))
    return shared


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_sharing_the_checks_out_changes_no_verdict(results, shared_results, name):
    """Verdicts identical with one and two processes per implementation, over the bundled
    catalogue: status, reason, minimal case, details, hint and observations, in order; and
    shared they were (a fork made wherever the gate passed: a silent fall back to one process
    would compare one process with itself)."""
    verdicts, forks = shared_results[name]
    assert seen(verdicts) == seen([results[name][check] for check in CHECK_NAMES])
    blocked = results[name]["gate"].status in (Status.FAILED, Status.EXPECTED_FAILURE)
    assert forks == (0 if blocked else 1)


@pytest.fixture(scope="module")
def matrix(results) -> dict[str, dict[str, Status]]:
    """Raw verdicts: FAILED where the check failed, expected or not."""
    return {name: {check: Status.FAILED if r.status is Status.EXPECTED_FAILURE
                   else Status.PASSED if r.reason.startswith("expected to fail")
                   else r.status for check, r in by_check.items()}
            for name, by_check in results.items()}


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_failures_and_warnings_are_exactly_the_expected_ones(results, matrix, name):
    unexpected = [f"{r.check}: {r.reason}" for r in results[name].values()
                  if r.status is Status.FAILED]
    assert unexpected == []
    failed = {check for check, status in matrix[name].items() if status is Status.FAILED}
    assert failed == set(expected_results().get(name, {}))
    # A warning the suite attributes to the platform's kernels depends on the CPU.
    warned = {check for check, r in results[name].items()
              if r.status is Status.WARNED and not r.reason.startswith(PLATFORM_NOTE)}
    assert warned == set(expected_warnings().get(name, {}))


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_every_message_is_said_once_and_whole(results, name):
    """tests/message_rules.py on everything its report says: the verdicts' messages and what
    was inferred."""
    messages = [message for result in results[name].values()
                for message in result_messages(name, result)]
    messages += [(name, getattr(note, "text", note)) for note in IMPLEMENTATIONS[name].notes]
    skipped = {name: {check for check, r in results[name].items()
                      if r.status is Status.SKIPPED}}
    assert problems_of(messages, skipped) == []


@pytest.mark.parametrize("name", CORRECT)
def test_correct_implementations_pass_every_check_they_can_take(matrix, name):
    verdicts = matrix[name]
    assert all(status is not Status.FAILED for status in verdicts.values())
    skipped = {check for check, status in verdicts.items() if status is Status.SKIPPED}
    assert skipped == CORRECT[name] | {"kernel", "chunked"}  # none is a kernel, none chunked


@pytest.mark.parametrize("module", MUTANT_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_each_mutant_is_caught_by_the_check_it_targets(matrix, module):
    assert module.CATCHES in CHECK_NAMES
    assert matrix[module.IMPLEMENTATION.name][module.CATCHES] is Status.FAILED
    documented = expected_results()[module.IMPLEMENTATION.name]
    assert not documented[module.CATCHES].startswith("follows from the same bug")


def test_the_zoo_is_large_and_documented():
    assert len(MUTANT_MODULES) >= 25
    for module in MUTANT_MODULES:
        for part in ("Bug:", "Symptom:", "Caught by:"):
            assert part in module.__doc__, (module.__name__, part)


def test_every_check_fails_on_some_bundled_implementation(matrix):
    caught = {check for verdicts in matrix.values()
              for check, status in verdicts.items() if status is Status.FAILED}
    # The kernel twins are functions, inferred rather than declared: tests/test_kernels.py
    # asserts each fails the check it targets.
    assert caught | {module.CATCHES for module in KERNEL_MUTANT_MODULES} == set(CHECK_NAMES)


def test_every_expected_failure_and_warning_has_a_reason():
    for name, checks in [*expected_results().items(), *expected_warnings().items()]:
        assert name in IMPLEMENTATIONS
        for check, reason in checks.items():
            assert check in CHECK_NAMES, (name, check)
            assert len(reason.split()) >= 5, (name, check)


SEED_MODULES = {
    "000": "seed000_multihead_self_attention",
    "001": "seed001_self_attention_steps",
    "002": "seed002_multihead_attention_qkv",
    "003": "seed003_causal_multihead_attention",
    "004": "seed004_multihead_attention_q_length",
}


@pytest.mark.parametrize("number,module", SEED_MODULES.items())
def test_each_seed_module_names_the_seed_file_it_reproduces(number, module):
    doc = importlib.import_module(f"conformance.implementations.{module}").__doc__
    assert f"``{number}_" in doc


# Hints name a bug only where its signature was measured: every hint a mutant's results carry
# belongs to that mutant's own kind of bug, or names no cause at all (a pointer to the check
# that sees the failure itself).
MUTANT_KINDS = {
    "alibi_sign": "alibi", "alibi_slopes_reversed": "alibi",
    "batch_heads_mixed": "batch_heads",
    "bool_mask_inverted": "mask_inverted", "mask_inverted": "mask_inverted",
    "cache_causal_top_left": "cache", "cache_not_updated": "cache",
    "cache_prefill_unmasked": "cache", "cache_wrong_axis": "cache", "rope_no_offset": "cache",
    "causal_hides_current_token": "causal_hides", "causal_shows_next_token": "causal_shows",
    "mask_drops_causality": "causal_dropped", "encoder_with_causal_mask": "causal_undeclared",
    "cu_seqlens_off_by_one": "packing",
    "custom_softmax_backward": "backward", "detached_projection": "detached",
    "dropout_in_eval": "dropout_eval",
    "dropout_on_logits": "dropout_bias", "dropout_without_rescaling": "dropout_bias",
    "exp_without_max": "overflow", "fill_minus_1e9": "fill_value",
    "mask_dtype_promotes": "fill_value",
    "gqa_repeat": "kv_grouping",
    "heads_merged_without_transpose": "heads_merge", "heads_view_no_transpose": "heads_split",
    "in_place_input": "in_place", "kv_with_q_length": "shapes", "mask_required": "interface",
    "inference_path_unscaled": "scale", "scale_missing": "scale",
    "scale_applied_twice": "scale", "scale_sqrt_d_model": "scale",
    "causal_scale_sqrt_d_model": "scale", "causal_softmax_query_axis": "softmax_axis",
    "causal_heads_merged_without_transpose": "heads_merge",
    "mask_after_softmax": "mask_after_softmax",
    "mask_first_head_only": "mask_misapplied", "mask_on_query_axis": "mask_misapplied",
    "nan_repaired_after_softmax": "nan_repair", "norm_without_dim": "batch_reduction",
    "output_projection_skipped": "output_projection",
    "same_projection_for_k_and_v": "same_projection",
    "rope_mixed_pairing": "rope", "rope_over_d_model": "rope", "rope_theta_exponent": "rope",
    "rope_theta_ignored": "rope",
    "rotary_fraction_ignored": "rope",
    "softmax_query_axis": "softmax_axis", "streaming_half_accumulators": "precision",
    "window_off_by_one": "window", "chunk_off_by_one": "chunk",
}
"""Each bundled mutant's kind of bug."""

HINT_KINDS = [
    ("matches the reference at scale", {"scale"}), ("matches scale", {"scale"}),
    ("softmax over the wrong dimension", {"softmax_axis"}),
    ("with its softmax over the query axis", {"softmax_axis"}),
    ("without its output projection", {"output_projection"}),
    ("the output projection's weights do", {"output_projection"}),
    ("key projection used for the values", {"same_projection"}),
    ("the value projection's weights do", {"same_projection"}),
    ("view(B, H, L, Dh) and no transpose", {"heads_split"}),
    ("reshape(B, L, H * Dh) and no transpose back", {"heads_merge"}),
    ("reshape(H, B, L, Dh)", {"batch_heads"}),
    ("one common factor about one common point", {"batch_reduction"}),
    ("expanded with repeat", {"kv_grouping"}),
    ("the window is one key too", {"window"}), ("matches a window of", {"window"}),
    ("the chunk boundaries sit one position", {"chunk"}),
    ("matches RoPE", {"rope"}), ("RoPE makes attention depend on i - j", {"rope"}),
    ("stored and never read", {"rope"}), ("change something other than RoPE", {"rope"}),
    ("ALiBi bias added with the wrong sign", {"alibi"}),
    ("slopes in reverse head order", {"alibi"}),
    (mask_mistakes.Mistake.INVERTED.words, {"mask_inverted"}), ("reads its mask inverted", {"mask_inverted"}),
    (mask_mistakes.Mistake.AFTER_SOFTMAX.words, {"mask_after_softmax"}),
    (mask_mistakes.Mistake.HIDES_CURRENT.words, {"causal_hides"}),
    (mask_mistakes.Mistake.SHOWS_NEXT.words, {"causal_shows"}),
    (mask_mistakes.Mistake.IGNORES_CAUSAL.words, {"causal_dropped"}),
    (mask_mistakes.Mistake.REPLACES_CAUSAL.words, {"causal_dropped"}),
    ("the padding mask undoes the causal masking", {"causal_dropped"}),
    (mask_mistakes.Mistake.CAUSAL_UNDECLARED.words, {"causal_undeclared"}),
    ("exp taken without subtracting the row", {"overflow"}),
    ("the masking value overflows float16", {"fill_value"}),
    ("error that grows with the number of keys", {"precision"}),
    ("defaults to training=True", {"dropout_eval"}),
    ("randomness) active in eval mode", {"dropout_eval"}),
    ("train mode is biased", {"dropout_bias"}),
    ("is it detached", {"detached"}),
    ("a custom backward, an in-place op or a detach", {"backward", "detached", "in_place"}),
    ("an in-place op (mul_, masked_fill_, +=) on an argument", {"in_place"}),
    ("the decode step attends to key 0 alone", {"cache"}),
    ("is the cache returned or written at every call", {"cache"}),
    ("is the causal mask dropped when a cache is passed", {"cache"}),
    ("does the cache grow along the sequence axis", {"cache"}),
    ("positions offset by the cache length", {"cache"}),
    ("boundaries read from cu_seqlens off by one", {"packing"}),
    ("then the NaN repaired after it", {"nan_repair"}),
]
"""Each recognisable hint (a substring of it) and the kinds of bug it names."""

POINTERS = ("(see reference)", "(see padding)", "(see causal)", "(see batch_independence)",
            "(see padding and fully_masked)")
"""Hints that name no cause: the failure is another check's, which names it where it can."""


def hint_kinds(hint: str) -> set[str] | None:
    """The kinds of bug ``hint`` names (empty: none, it points elsewhere); None when the hint is
    not recognised."""
    kinds = [k for words, k in HINT_KINDS if words in hint]
    if kinds:
        return set().union(*kinds)
    return set() if any(pointer in hint for pointer in POINTERS) else None


@pytest.mark.parametrize("module", MUTANT_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_hint_a_mutant_gets_names_its_own_kind_of_bug(results, module):
    kind = MUTANT_KINDS[module.__name__.rsplit(".", 1)[-1]]
    for result in results[module.IMPLEMENTATION.name].values():
        if result.hint is None or result.status in (Status.PASSED, Status.SKIPPED):
            continue
        if result.reason.startswith(PLATFORM_NOTE):
            continue  # the platform's kernel, found only on CPUs that have its defect

        named = hint_kinds(result.hint)
        assert named is not None, f"{result.check}: unrecognised hint {result.hint!r}"
        assert not named or kind in named, f"{result.check} names {named}: {result.hint!r}"


def test_the_bugs_a_mutant_is_made_of_are_named_where_they_are_caught(results):
    def hint(name: str, check: str) -> str:
        return results[name][check].hint or ""

    assert hint("mutant-mask-inverted", "padding").startswith(mask_mistakes.Mistake.INVERTED.words)
    assert "inverted" in hint("mutant-bool-mask-inverted", "mask_formats")
    assert hint("mutant-mask-after-softmax", "padding").startswith(mask_mistakes.Mistake.AFTER_SOFTMAX.words)
    assert hint("mutant-causal-hides-current-token", "causal") == mask_mistakes.Mistake.HIDES_CURRENT.words
    assert hint("mutant-causal-shows-next-token", "causal") == mask_mistakes.Mistake.SHOWS_NEXT.words
    # Where a mask mistake surfaces in other checks, it is named there too.
    for check in ("reference", "head_split", "row_stochastic"):
        assert hint("mutant-mask-inverted", check) == mask_mistakes.Mistake.INVERTED.words, check
        assert hint("mutant-mask-after-softmax", check) == mask_mistakes.Mistake.AFTER_SOFTMAX.words, check
