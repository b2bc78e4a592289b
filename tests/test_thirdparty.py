"""Third-party attention: HuggingFace transformers (optional extra) and torch's own MHA."""

from __future__ import annotations

import pytest

from conformance import Status
from conformance.loading.registry import resolve
from conformance.run.many import check_many


def test_huggingface_bert_and_gpt2_attention():
    pytest.importorskip("transformers")
    targets = [("conformance.implementations.huggingface:IMPLEMENTATIONS", impl)
               for impl in resolve("conformance.implementations.huggingface:IMPLEMENTATIONS")]
    results = check_many(targets, devices=["cpu"], jobs=2)
    verdicts = {(r.implementation, r.check): r for r in results}
    for name in ("hf-bert-self-attention", "hf-gpt2-attention"):
        for check in ("gate", "padding", "row_stochastic", "head_split", "reference", "scale",
                      "permutation", "batch_independence", "autograd", "dropout"):
            result = verdicts[(name, check)]
            assert result.status is Status.PASSED, (name, check, result.reason)
    assert verdicts[("hf-bert-self-attention", "contract")].status is Status.PASSED
    # A finding, not a declaration slip: Conv1D's forward calls x.view(-1, x.size(-1)), so
    # GPT2Attention raises on non-contiguous input.
    gpt2 = verdicts[("hf-gpt2-attention", "contract")]
    assert gpt2.status is Status.FAILED
    assert gpt2.reason.startswith("non-contiguous inputs (transposed memory layout): forward raised")
    assert "use reshape()" in gpt2.hint


def test_torch_multihead_attention_through_inference_alone():
    (impl,) = resolve("torch.nn:MultiheadAttention")
    results = check_many([("torch.nn:MultiheadAttention", impl)], devices=["cpu"],
                         checks=["gate", "contract", "padding", "head_split", "reference"])
    assert [r.check for r in results if r.status is not Status.PASSED] == []
