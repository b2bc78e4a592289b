"""No false alarm on correct attention written in the wild: every correct module of both
collections exits 0 with nothing declared, through the command line a user types.

``tests/fixtures/user_styles.py`` (12 styles) and ``tests/fixtures/wild_styles.py`` (21 styles,
written independently of the suite and proved correct against their own float64 reference in
``tests/test_wild_styles_are_correct.py``; the HuggingFace wrappers where transformers imports).
Warnings are allowed: they are findings beyond the normal range, in dtypes nobody declared, or
about an intent inference can't know, and never change the exit status.

They run in this process (``--no-isolate``, about half the time): an isolated run gets the same
verdicts (``tests/test_worker.py``), and a correct module checked isolated beside misbehaving ones
passes (``tests/test_containment.py``).
"""

from __future__ import annotations

import json

import pytest

from conformance.cli import main
from tests.fixtures import user_styles, wild_styles

SPECS = ([f"tests.fixtures.user_styles:{cls.__name__}" for cls in user_styles.STYLES]
         + [f"tests.fixtures.wild_styles:{cls.__name__}" for cls in wild_styles.STYLES])


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
    assert len({r["implementation"] for r in payload["results"]}) == len(SPECS) >= 30


def test_the_hard_styles_were_understood(report):
    """What makes the wild collection hard was inferred, not skipped around."""
    _, payload = report
    inferred = {i["name"]: " ".join(i["inferred"]) for i in payload["implementations"]}
    assert "inputs are (length, batch, width) (probed" in inferred[
        "wild_styles:SeqFirstMultiheadAttention"]
    assert "computes part of attention in float32" not in inferred[  # said by the gate
        "wild_styles:Qwen2StyleAttention"]
    assert "head width = head_size" in inferred["wild_styles:Head"]
    assert "builds only with num_heads a multiple of 2" in inferred[
        "wild_styles:GroupedQueryAttention"]
    assert "rotary position embeddings" in inferred["wild_styles:RotarySelfAttention"]
    assert "bool mask, True = ignore" in inferred["wild_styles:TorchMHASelfAttention"]
    gate = {r["implementation"]: r for r in payload["results"] if r["check"] == "gate"}
    assert any("computes part of attention in float32 for float64 inputs" in note
               for note in gate["wild_styles:Qwen2StyleAttention"]["observations"])
    doubted = [r for r in payload["results"]
               if r["implementation"] == "wild_styles:MultiHeadedAttention"
               and r["check"] == "padding"]
    assert doubted[0]["status"] == "warning"  # OpenNMT: True = masked, under the name `mask`
