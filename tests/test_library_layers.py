"""No false alarm on the attention layers people ship: real library layers, wrapped in a few lines
as a user wraps them, checked through the command line with nothing declared.

``tests/fixtures/library_transformers.py`` (HuggingFace transformers: Llama, Mistral, Qwen2,
Gemma, Phi-3, GPT-NeoX, Falcon 7B and 40B, BLOOM, GPT-2, BERT, Whisper encoder and decoder, and
more) and ``tests/fixtures/library_others.py`` (x-transformers with GQA, rotary, ALiBi and a
window; torchtune; ``nn.MultiheadAttention`` self and cross; ``nn.TransformerEncoderLayer``;
SDPA with ``enable_gqa``; diffusers), each proved correct by its own float64 oracle in
``tests/test_library_*_are_correct.py``.

A failure is allowed only where it is a true library bug, recorded in ``LIBRARY_BUGS`` with its
evidence, which ``test_the_recorded_library_bugs_are_real`` reproduces without the suite (if a
release fixes one, that test says so). The run is the quick profile on six layers that
between them have what makes the collection hard (weights fused per head, q plus a fused kv,
unused parameters; RoPE whole and partial; ALiBi counting kept tokens; 4-D whole masks; tiled
and interleaved groups), to keep ``make test`` short; the whole collection's measurements (every
layer, through the command line) are in the README.
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("x_transformers")

from conformance.frontends.cli import main
from tests.fixtures import library_others, library_transformers

TRANSFORMERS = "tests.fixtures.library_transformers"
OTHERS = "tests.fixtures.library_others"

CHECKED = [
    f"{TRANSFORMERS}:LlamaSelfAttention",          # RoPE half-split, GQA interleaved, 4-D masks
    f"{TRANSFORMERS}:GPTNeoXPartialRotaryAttention",  # fused per head, partial rotary
    f"{TRANSFORMERS}:Falcon7BMultiQueryAttention",    # fused q + one kv head
    f"{TRANSFORMERS}:BloomAlibiAttention",            # ALiBi, fused per head
    f"{OTHERS}:XTransformersGroupedQueryAttention",   # tiled grouping, no output at one head
    f"{OTHERS}:TorchEncoderLayerSelfAttention",       # unused feed-forward parameters
]

LIBRARY_BUGS = {
    # x-transformers 2.31: a batch element whose keys are all padding gets NaN gradients (its
    # softmax over -inf-filled logits; the forward zeroes the rows afterwards, the backward
    # doesn't), in every x-transformers layer: reproduced in test_the_recorded_library_bugs_are_real.
    ("library_others:XTransformersGroupedQueryAttention", "fully_masked"):
        "NaN gradients for a batch element with no key",
    ("library_others:XTransformersRotaryAttention", "fully_masked"):
        "NaN gradients for a batch element with no key",
    # transformers 5.23: GPT-2's Conv1D calls x.view(-1, width), which raises on an input that
    # is not contiguous (a transposed (L, B, D) tensor seen as (B, L, D)).
    ("library_transformers:GPT2Conv1DAttention", "contract"):
        "raises on non-contiguous input",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[int, dict]:
    path = tmp_path_factory.mktemp("report") / "report.json"
    code = main(["check", *CHECKED, "--jobs", "2", "--no-isolate", "--json", str(path)])
    return code, json.loads(path.read_text())


def _by_check(payload: dict) -> dict[str, dict[str, dict]]:
    found: dict[str, dict[str, dict]] = {}
    for result in payload["results"]:
        found.setdefault(result["implementation"], {})[result["check"]] = result
    return found


def test_no_failure_but_the_recorded_library_bugs(report):
    _, payload = report
    failures = {(r["implementation"], r["check"]): r["reason"]
                for r in payload["results"] if r["status"] == "failed"}
    assert set(failures) <= set(LIBRARY_BUGS), failures
    assert len({r["implementation"] for r in payload["results"]}) == len(CHECKED)


def test_weights_and_encodings_were_found_by_behaviour(report):
    """Every layer's weights were found by reproducing its output, and the position encoding
    each one has was measured and modelled, so the reference checks ran (passed, not skipped)."""
    _, payload = report
    inferred = {i["name"]: " ".join(i["inferred"]) for i in payload["implementations"]}
    for name, text in inferred.items():
        assert "found by behaviour" in text, (name, text)
    assert "RoPE on half-split pairs" in inferred["library_transformers:LlamaSelfAttention"]
    assert "ALiBi" in inferred["library_transformers:BloomAlibiAttention"]
    neox = inferred["library_transformers:GPTNeoXPartialRotaryAttention"]
    assert "fused" in neox and "RoPE" in neox
    verdicts = _by_check(payload)
    for name in ("library_transformers:LlamaSelfAttention",
                 "library_transformers:BloomAlibiAttention",
                 "library_transformers:GPTNeoXPartialRotaryAttention"):
        for check in ("reference", "head_split"):
            assert verdicts[name][check]["status"] in ("passed", "warning"), (name, check)


def test_relabelled_groups_are_warnings_naming_both_conventions(report):
    _, payload = report
    result = _by_check(payload)["library_others:XTransformersGroupedQueryAttention"]["kv_groups"]
    assert result["status"] == "warning"


def test_the_recorded_library_bugs_are_real():
    """x-transformers: with one batch element fully padded, the input's gradient is NaN there
    (the forward output is finite: its padded rows are zeroed)."""
    torch.manual_seed(0)
    layer = library_others.XTransformersGroupedQueryAttention(16, 4, kv_heads=2).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    keep = torch.tensor([[True] * 5, [False] * 5])
    out = layer(x, mask=keep)
    assert out.isfinite().all()
    out.sum().backward()
    assert x.grad[1].isnan().any()
    assert x.grad[0].isfinite().all()


def test_gpt2_raises_on_non_contiguous_input():
    layer = library_transformers.GPT2Conv1DAttention(16, 4)
    x = torch.randn(5, 2, 16).transpose(0, 1)  # (B, L, D), not contiguous
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        layer(x)
    assert layer(x.contiguous()).shape == (2, 5, 16)


def test_the_collections_are_the_proved_ones():
    assert len(library_transformers.LAYERS) >= 12 and len(library_others.LAYERS) >= 8


def test_a_huggingface_cache_object_is_understood():
    """LlamaAttention decoding through a DynamicCache (proved in
    test_library_caches_are_correct.py): the cache style is read from the annotation and
    confirmed by a prefill through it, so kv_cache runs."""
    from conformance.inference import infer
    from tests.fixtures.library_caches import LlamaDynamicCacheAttention

    capabilities = infer(LlamaDynamicCacheAttention).implementation.capabilities
    assert capabilities.cache.style is not None and capabilities.cache.style.value == "object"
    assert capabilities.cache.argument == "past_key_values"
    assert capabilities.position.encoding.rotary.describe() == (
        "RoPE on half-split pairs (i, i + r/2), every dim, theta 10000")
