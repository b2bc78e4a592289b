"""Causal chunked attention (Llama 4's): what each row sees is measured, the chunk an argument
states is checked by ``chunked``, and a row its chunk and the padding leave empty is unjudged
outside ``fully_masked`` (tests/fixtures/chunk_forms.py)."""

from __future__ import annotations

import pytest
import torch

from conformance import Status
from conformance.checks.invariants.chunked import EARLY_HINT
from conformance.generation.cases import Case
from conformance.inference import Declarations, infer
from conformance.inference.calls.chunk import chunk_of, pattern
from conformance.loading.registry import resolve
from conformance.model.remedies import texts
from conformance.numerics.reference import allowed_keys
from conformance.run.many import check_many
from tests.fixtures import chunk_forms as forms


def test_a_chunk_lets_row_t_see_its_own_chunk_up_to_itself():
    allowed = allowed_keys(1, 7, 7, None, True, chunk=3)[0, 0]
    for row in range(7):
        seen = [int(p) for p in torch.nonzero(allowed[row]).flatten()]
        assert seen == list(range(3 * (row // 3), row + 1))
    # Queries that come last (a cached call): row i is position i + offset.
    late = allowed_keys(1, 2, 7, None, True, offset=5, chunk=3)[0, 0]
    assert late[0].nonzero().flatten().tolist() == [3, 4, 5]
    assert late[1].nonzero().flatten().tolist() == [6]


def test_a_pattern_is_named_as_the_chunk_it_is_and_no_other():
    assert chunk_of(pattern(3)) == 3
    assert chunk_of(pattern(5)) == 5
    assert chunk_of(pattern(None)) is None
    shifted = allowed_keys(1, 9, 9, None, True, offset=1, chunk=3)[0, 0] & pattern(None, 9)
    assert chunk_of(shifted) is None


def test_a_row_its_chunk_and_the_padding_leave_empty_has_no_key():
    case = Case(batch=1, q_len=6, kv_len=6, num_heads=1, head_dim=2, kept=(3,), mask_seed=None,
                causal=True, chunk=3)
    assert case.attendable_rows()[0].tolist() == [True, True, True, False, False, False]
    assert case.config.chunk == 3


def test_an_argument_that_sets_chunks_is_probed_and_checked_as_chunked():
    inferred = infer(forms.ChunkedAttention)
    assert inferred.implementation.capabilities.chunk == "config"
    assert any("attention_chunk_size: causal chunks" in note and "probed" in note
               for note in texts(inferred.notes))


def test_a_chunk_argument_that_only_tiles_the_computation_is_left_at_its_default():
    inferred = infer(forms.QueryTiledAttention)
    assert inferred.implementation.capabilities.chunk is None
    assert any("chunk_size: not a visibility structure" in note
               for note in texts(inferred.notes))
    declared = infer(forms.QueryTiledAttention, declared=Declarations(chunk_arg="chunk_size"))
    assert declared.implementation.capabilities.chunk == "config"


def test_chunks_a_module_fixes_itself_are_measured():
    inferred = infer(forms.FixedChunks)
    assert inferred.implementation.capabilities.chunk == 4
    assert any("causal chunks of 4, fixed by the module (measured" in note
               for note in texts(inferred.notes))


def test_a_window_a_module_fixes_itself_is_measured_and_checked():
    """Was: no window inferred without a window argument, so causal failed a correct layer."""
    inferred = infer(forms.FixedWindow)
    assert inferred.implementation.capabilities.window == 3
    assert any("a causal sliding window of 3 keys per row, itself included, fixed by the module "
               "(measured" in note for note in texts(inferred.notes))
    results = {r.check: r.status for r in check_many(
        [("tests.fixtures.chunk_forms:FixedWindow", inferred.implementation)], devices=["cpu"],
        checks=["causal", "sliding_window", "reference"])}
    assert results == dict.fromkeys(("causal", "sliding_window", "reference"), Status.PASSED)


def test_boundaries_off_the_argument_are_said_and_checked_as_the_argument_states():
    inferred = infer(forms.ChunkIdsOneBased)
    assert inferred.implementation.capabilities.chunk == "config"
    assert any("not chunks of 3 counted from position 0" in note
               for note in texts(inferred.notes))


CHECKS = ("causal", "chunked", "reference", "fully_masked", "autograd", "head_split")


@pytest.fixture(scope="module")
def verdicts():
    names = ("ChunkedAttention", "ChunkIdsOneBased", "QueryTiledAttention", "FixedChunks")
    targets = [(f"tests.fixtures.chunk_forms:{name}",
                resolve(f"tests.fixtures.chunk_forms:{name}")[0]) for name in names]
    results = check_many(targets, devices=["cpu"], checks=CHECKS)
    by_name: dict[str, dict] = {}
    for result in results:
        by_name.setdefault(result.implementation.split(":")[-1], {})[result.check] = result
    return by_name


@pytest.mark.parametrize("name", ["ChunkedAttention", "QueryTiledAttention", "FixedChunks"])
def test_correct_chunked_forms_pass_every_check(verdicts, name):
    failed = {check: r.reason for check, r in verdicts[name].items()
              if r.status in (Status.FAILED, Status.SUITE_ERROR)}
    assert not failed


def test_the_chunked_check_runs_on_chunks_and_skips_without(verdicts):
    assert verdicts["ChunkedAttention"]["chunked"].status is Status.PASSED
    assert verdicts["FixedChunks"]["chunked"].status is Status.PASSED
    assert verdicts["QueryTiledAttention"]["chunked"].status is Status.SKIPPED


def test_a_boundary_off_by_one_fails_chunked_for_its_own_reason(verdicts):
    result = verdicts["ChunkIdsOneBased"]["chunked"]
    assert result.status is Status.FAILED
    assert result.hint == EARLY_HINT
    # What its rows see of their past is chunked's alone: causal judges the future only.
    assert verdicts["ChunkIdsOneBased"]["causal"].status is Status.PASSED
