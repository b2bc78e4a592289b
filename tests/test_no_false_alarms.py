"""No false alarm on correct attention written in the wild: every correct module of the four
collections exits 0 with nothing declared, through the command line a user types.

``tests/fixtures/user_styles.py`` (12 styles), ``tests/fixtures/wild_styles.py`` (21 styles,
written independently of the suite and proved correct against their own float64 reference in
``tests/test_wild_styles_are_correct.py``; the HuggingFace wrappers where transformers imports)
and ``tests/fixtures/modern_styles.py`` (7 modern forms: KV caches in the three styles, sliding
windows in both counts, ALiBi, packed sequences; proved in
``tests/test_modern_styles_are_correct.py``) and ``tests/fixtures/homework_styles.py`` (10 correct
homework submissions, projections named the ways students name them; proved in
``tests/test_homework_styles_are_correct.py``).
Warnings are allowed: they are findings beyond the normal range, in dtypes nobody declared, or
about an intent inference can't know, and never change the exit status.

They run in this process (``--no-isolate``, about half the time): an isolated run gets the same
verdicts (``tests/test_worker.py``), and a correct module checked isolated beside misbehaving ones
passes (``tests/test_containment.py``).
"""

from __future__ import annotations

import json

import pytest
import torch

from conformance.frontends.cli import main
from conformance.numerics.platform_defects import PLATFORM_NOTE, matmul_spreads_nan
from tests.fixtures import homework_styles, modern_styles, user_styles, wild_styles
from tests.message_rules import problems

SPECS = ([f"tests.fixtures.user_styles:{cls.__name__}" for cls in user_styles.STYLES]
         + [f"tests.fixtures.wild_styles:{cls.__name__}" for cls in wild_styles.STYLES]
         + [f"tests.fixtures.modern_styles:{cls.__name__}" for cls in modern_styles.STYLES]
         + [f"tests.fixtures.homework_styles:{cls.__name__}" for cls in homework_styles.STYLES])


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[int, dict]:
    path = tmp_path_factory.mktemp("report") / "report.json"
    code = main(["check", *SPECS, "--jobs", "2", "--no-isolate", "--json", str(path)])
    return code, json.loads(path.read_text())


def test_every_correct_module_exits_0_with_nothing_declared(report):
    code, payload = report
    failures = [f"{r['implementation']} · {r['check']}: {r['reason']}"
                for r in payload["results"] if r["status"] == "failed"]
    assert failures == []
    assert code == 0
    assert len({r["implementation"] for r in payload["results"]}) == len(SPECS) >= 46


def test_every_message_is_said_once_and_whole(report):
    """tests/message_rules.py over the whole output of the four collections' run: no clause
    twice, no inf or nan for a measure, no sentence cut, no declared value said otherwise, no
    pointer to a check skipped for that layer."""
    _, payload = report
    assert problems(payload) == []


def test_the_hard_styles_were_understood(report):
    """What makes the wild collection hard was inferred, not skipped around."""
    _, payload = report
    inferred = {i["name"]: " ".join(i["inferred"]) for i in payload["implementations"]}
    assert "inputs are (length, batch, width) (probed" in inferred[
        "wild_styles:SeqFirstMultiheadAttention"]
    assert "computes part of attention in float32" not in inferred[  # said by the gate
        "wild_styles:Qwen2StyleAttention"]
    assert "head width = head_size" in inferred["wild_styles:Head"]
    assert "key/value heads = n_kv_heads: generated as divisors of num_heads" in inferred[
        "wild_styles:GroupedQueryAttention"]
    assert ("RoPE on half-split pairs (i, i + r/2), every dim, theta 10000 inside (found by "
            "behaviour") in inferred["wild_styles:RotarySelfAttention"]
    assert "bool mask, True = ignore" in inferred["wild_styles:TorchMHASelfAttention"]
    gate = {r["implementation"]: r for r in payload["results"] if r["check"] == "gate"}
    assert any("computes part of attention in float32 for float64 inputs" in note
               for note in gate["wild_styles:Qwen2StyleAttention"]["observations"])
    doubted = [r for r in payload["results"]
               if r["implementation"] == "wild_styles:MultiHeadedAttention"
               and r["check"] == "padding"]
    assert doubted[0]["status"] == "warning"  # OpenNMT: True = masked, under the name `mask`


def _verdicts(payload: dict) -> dict[str, dict[str, str]]:
    verdicts: dict[str, dict[str, str]] = {}
    for result in payload["results"]:
        verdicts.setdefault(result["implementation"], {})[result["check"]] = result["status"]
    return verdicts


def test_the_modern_forms_were_understood_and_checked(report):
    """What each modern module is was inferred and said, and its checks ran (passed, not
    skipped): grouped key/value heads, the three cache styles, both window counts, ALiBi,
    packing, relative positions."""
    _, payload = report
    inferred = {i["name"]: " ".join(i["inferred"]) for i in payload["implementations"]}
    said = {
        "modern_styles:NanoGPTCachedAttention": "KV cache: layer_past in, use_cache=True, the "
                                                "present cache out beside the output",
        "modern_styles:MetaLlamaCachedAttention": "KV cache: buffers it keeps, start_pos = the "
                                                  "new tokens' first position",
        "modern_styles:MistralStyleAttention": "sliding_window: a causal sliding window, W keys "
                                               "per row, itself included",
        "modern_styles:LocalCausalAttention": "window_size: a causal sliding window, W keys "
                                              "before the row, plus itself",
        "modern_styles:MPTAlibiAttention": "ALiBi with the paper's slopes, -m (i - j) inside "
                                           "(found by behaviour",
        "modern_styles:PackedSequenceAttention": "cu_seqlens: packed sequences, tokens (1, "
                                                 "total, D) (probed)",
        "wild_styles:GroupedQueryAttention": "probed: built with n_kv_heads=2",
    }
    for name, words in said.items():
        assert words in inferred[name], name
    verdicts = _verdicts(payload)
    ran = {
        "modern_styles:NanoGPTCachedAttention": {"kv_cache", "reference", "head_split"},
        "modern_styles:MetaLlamaCachedAttention": {"kv_cache", "kv_groups"},
        "modern_styles:MistralStyleAttention": {"kv_cache", "kv_groups", "sliding_window",
                                                "position_shift"},
        "modern_styles:LocalCausalAttention": {"reference", "head_split"},
        # The float64 reference applies their RoPE and ALiBi: the reference checks ran.
        "modern_styles:MPTAlibiAttention": {"alibi", "position_shift", "reference", "head_split",
                                            "scale"},
        "modern_styles:PackedSequenceAttention": {"packed", "kv_groups", "reference"},
        # The grouped-query wild style now gets the grouped reference and head split.
        "wild_styles:GroupedQueryAttention": {"kv_groups", "head_split", "reference", "scale"},
        "wild_styles:RotarySelfAttention": {"position_shift", "reference", "head_split", "scale",
                                            "stability"},
        "wild_styles:LlamaAttentionMeta": {"position_shift", "reference", "head_split"},
    }
    if "modern_styles:HFLlamaCachedAttention" in verdicts:
        ran["modern_styles:HFLlamaCachedAttention"] = {"kv_cache", "kv_groups", "position_shift"}
        ran["wild_styles:HFLlamaSelfAttention"] = {"kv_groups", "position_shift"}
    for name, checks in ran.items():
        assert {check: verdicts[name][check] for check in checks} == dict.fromkeys(
            checks, "passed"), name
    # window_size=W lets each row see W + 1 keys: FlashAttention's count, or a window off by
    # one; only its author knows which, so its window is checked as it counts, and doubted.
    window = next(r for r in payload["results"] if r["check"] == "sliding_window"
                  and r["implementation"] == "modern_styles:LocalCausalAttention")
    assert window["status"] == "warning" and "each row sees 4 keys" in window["reason"]


def test_every_homework_style_matches_the_reference_whatever_its_names(report):
    """Students name their projections query_proj, W_query, Wq, q_lin, proj_q, lin_q,
    queries/fc_out, Q/K/V, clones(nn.Linear, 4) or fuse them per head: the weights are found by
    reproducing the output, so the reference points are evaluated, and earned."""
    _, payload = report
    inferred = {i["name"]: " ".join(i["inferred"]) for i in payload["implementations"]}
    verdicts = _verdicts(payload)
    for cls in homework_styles.STYLES:
        name = f"homework_styles:{cls.__name__}"
        assert "found by behaviour" in inferred[name], name
        assert verdicts[name]["reference"] == "passed", name
        assert verdicts[name]["scale"] == "passed", name


def test_the_twelve_user_styles_pass_everything_they_can(report):
    """Nothing fails; the findings allowed are warnings: computing q @ k^T before scaling
    overflows float16 for q/k of std ~80, beyond the normal range; and a defect of this
    platform's bfloat16 matmul (NaN rows of fully masked elements spread to their neighbours)."""
    _, payload = report
    styles = [r for r in payload["results"] if r["implementation"].startswith("user_styles:")]
    assert len({r["implementation"] for r in styles}) >= 12
    for result in styles:
        name = (result["implementation"], result["check"], result["reason"])
        if result["status"] == "warning" and result["reason"].startswith(PLATFORM_NOTE):
            assert matmul_spreads_nan(torch.bfloat16), name
        elif result["status"] == "warning":
            assert result["check"] == "stability", name
            assert result["reason"].startswith("in float16 with q and k of std 80"), name
            assert "overflow float16" in result["hint"]
    overflowing = {r["implementation"] for r in styles
                   if r["status"] == "warning" and r["check"] == "stability"}
    assert "user_styles:SDPAInside" not in overflowing  # SDPA scales q first
    passed: dict[str, set[str]] = {}
    for r in styles:
        if r["status"] == "passed":
            passed.setdefault(r["implementation"], set()).add(r["check"])
    # Weights were found for every style: the checks that need them ran.
    assert all({"head_split", "reference", "scale"} <= checks or "row_stochastic" in checks
               for checks in passed.values())
    assert "causal" in passed["user_styles:GPTStyleNoBias"]
    assert "causal" in passed["user_styles:SDPAInside"]
    assert "dropout" in passed["user_styles:WithDropout"]
