"""Attention as the courses teach it (``tests/fixtures/courses/``: d2l, nanoGPT, minGPT, the "Let's
build GPT" lecture, The Annotated Transformer, CS231n), each written as the course writes it and
checked from its class with nothing declared: every correct form passes, and each one-bug twin
its students write fails the check named for its bug.

What the suite must see to build and call them, each by behaviour: a config object's fields
(nanoGPT's ``GPTConfig``, minGPT's ``CfgNode``), a width no argument sets (the lecture's global
``n_embd``), a width argument no name explains (d2l's ``num_hiddens``) with lazy projections,
valid lengths as a mask (d2l's required ``valid_lens``, (B,) and (B, Lq)), a module with no
parameters that takes any width, a causal triangle transposed, a longest length that follows a
width.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from conformance import Status
from conformance.frontends.cli import main
from conformance.inference import infer
from conformance.loading.registry import ResolveError, resolve
from conformance.model.declarations import DeclarationError, Declarations
from conformance.model.mask_forms import MaskConvention, MaskKind, MaskLayout
from conformance.model.remedies import texts
from conformance.run.many import check, check_many
from conformance.subject.masks import MaskEncodingError, encode_mask

COURSES = ("d2l", "nanogpt", "mingpt", "lecture", "annotated", "cs231n")
MODULES = {name: importlib.import_module(f"tests.fixtures.courses.{name}") for name in COURSES}
CORRECT = [(name, cls) for name, module in MODULES.items() for cls in module.CORRECT]
BROKEN = [(name, cls, check) for name, module in MODULES.items()
          for cls, check in module.BROKEN.items()]


def spec(course: str, cls: type) -> str:
    return f"tests.fixtures.courses.{course}:{cls.__name__}"


def notes(cls: type) -> list[str]:
    return texts(infer(cls).notes)


@pytest.fixture(scope="module")
def checked():
    targets, by_name = [], {}
    for course, cls in [*CORRECT, *((c, k) for c, k, _ in BROKEN)]:
        try:
            targets.append((spec(course, cls), resolve(spec(course, cls))[0]))
        except ResolveError as error:
            by_name[spec(course, cls)] = {"load": str(error)}
    for result in check_many(targets, devices=["cpu"], jobs=2):
        by_name.setdefault(f"tests.fixtures.courses.{result.implementation}", {})[
            result.check] = result
    return by_name


@pytest.mark.parametrize(("course", "cls"), CORRECT, ids=lambda v: getattr(v, "__name__", v))
def test_every_course_form_passes_with_nothing_declared(checked, course, cls):
    results = checked[spec(course, cls)]
    assert "load" not in results, results["load"]
    failed = {name: r.reason for name, r in results.items()
              if r.status in (Status.FAILED, Status.SUITE_ERROR)}
    assert not failed
    assert sum(r.status is Status.PASSED for r in results.values()) >= 10


@pytest.mark.parametrize(("course", "cls", "check"), BROKEN,
                         ids=lambda v: getattr(v, "__name__", v))
def test_each_students_twin_fails_the_check_named_for_its_bug(checked, course, cls, check):
    results = checked[spec(course, cls)]
    assert "load" not in results, results["load"]
    assert results[check].status is Status.FAILED, results[check]


def test_a_config_object_is_read_by_what_the_layer_reads_from_it():
    nanogpt, mingpt = MODULES["nanogpt"], MODULES["mingpt"]
    said = notes(nanogpt.CausalSelfAttention)
    assert "constructor width = config.n_embd, heads = config.n_head, dropout = config.dropout" in said
    # The flash path never reads block_size: it is no field of this layer's.
    assert ("config is a config object: it reads n_embd, n_head, bias, dropout; built as a "
            "GPTConfig of those fields (observed)") in said
    plan_config = infer(nanogpt.CausalSelfAttention).implementation.factory
    built = plan_config(__import__("conformance.model.spec", fromlist=["Config"]).Config(
        batch=1, q_len=3, kv_len=3, d_model=12, num_heads=3))
    assert built.inner.n_head == 3 and built.inner.n_embd == 12
    said = notes(mingpt.CausalSelfAttention)
    assert any("built as a CfgNode of those fields" in note and "attn_pdrop" in note
               for note in said), said
    assert any("context = config.block_size" in note for note in said), said


def test_sizes_no_name_explains_are_read_from_behaviour():
    d2l, lecture = MODULES["d2l"], MODULES["lecture"]
    said = notes(d2l.MultiHeadAttention)
    assert any(note.startswith("num_hiddens: the model width (filled by trial") for note in said)
    assert any(note.startswith("weights: W_q/W_k/W_v/W_o") and "reproduces its output" in note
               for note in said), said  # its LazyLinear made by a first call, then read
    assert any("module fixes it at 64" in note for note in notes(lecture.MultiHeadAttention))
    assert any("takes at most 32 tokens" in note for note in notes(lecture.Head))
    assert any("inputs of any width" in note for note in notes(d2l.DotProductAttention))


def test_valid_lengths_are_a_mask_in_both_shapes():
    implementation = infer(MODULES["d2l"].MultiHeadAttention).implementation
    caps = implementation.capabilities
    assert caps.mask == MaskConvention(MaskKind.LENGTHS, MaskLayout.PER_SEQUENCE, "mask")
    assert [m.layout for m in caps.mask_formats] == [MaskLayout.PER_ROW]
    keep = torch.tensor([[True, True, False], [True, True, True]])
    per_sequence = encode_mask(keep, caps.mask, num_heads=2, q_len=2, dtype=torch.float32)
    assert per_sequence.tolist() == [2, 3]
    per_row = encode_mask(keep, caps.mask_formats[0], num_heads=2, q_len=2, dtype=torch.float32)
    assert per_row.tolist() == [[2, 2], [3, 3]]
    with pytest.raises(MaskEncodingError, match="keeps a key after a masked one"):
        encode_mask(torch.tensor([[True, False, True]]), caps.mask, num_heads=2, q_len=2,
                    dtype=torch.float32)
    assert Declarations(mask="lengths:per_row@valid_lens").mask_convention("mask").layout \
        is MaskLayout.PER_ROW
    with pytest.raises(DeclarationError, match="valid lengths take the layouts"):
        Declarations(mask="lengths:key_padding").mask_convention("mask")


def test_a_transposed_triangle_is_checked_as_the_causal_mask_it_meant():
    said = notes(MODULES["lecture"].TransposedTriangle)
    assert any(note.startswith("causal, its mask transposed") for note in said), said


def test_a_printed_one_token_case_replays(capsys):
    """Was: ZeroDivisionError in the causal check's cut (``case.seed % (case.q_len - 1)``)."""
    code = main(["check", spec("mingpt", MODULES["mingpt"].CausalSelfAttention), "--no-isolate",
                 "--check", "causal", "--replay",
                 "Case(batch=2, q_len=1, kv_len=1, num_heads=2, head_dim=4, dtype='float32', "
                 "seed=5, causal=True)"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "ZeroDivisionError" not in out.out + out.err


def test_an_instance_whose_scale_is_wrong_is_judged_at_the_heads_its_core_computes():
    """Was: a nanoGPT instance of 4 heads of 16 scaled by 1/sqrt(n_embd) read as one head of 64
    (no weights reproduce it at any count), so its scale bug was "expected 1/sqrt(64)"."""
    nanogpt = MODULES["nanogpt"]
    config = nanogpt.GPTConfig(n_embd=64, n_head=4, block_size=128)
    (scale,) = check(nanogpt.WidthScale(config), devices=["cpu"], checks=["scale"])
    assert scale.status is Status.FAILED
    assert "expected 1/sqrt(head_dim) = 1/sqrt(16)" in scale.reason, scale.reason
    assert "1/sqrt(d_model) = 1/sqrt(64)" in str(scale.hint)
    (good,) = check(nanogpt.ManualCausalSelfAttention(config), devices=["cpu"], checks=["scale"])
    assert good.status is Status.PASSED, good


@pytest.mark.parametrize(("name", "built"), [("HFStyle", "a TinyConfig"),
                                             ("DictStyle", "a dict")])
def test_a_config_object_of_any_kind_is_built_of_its_own_kind(name, built):
    from tests.fixtures import config_forms

    cls = getattr(config_forms, name)
    assert any(f"built as {built} of those fields" in note for note in notes(cls)), notes(cls)
    results = {r.check: r.status for r in check(cls, devices=["cpu"],
                                                 checks=["gate", "reference", "head_split"])}
    assert set(results.values()) == {Status.PASSED}, results


def test_sizes_beside_a_config_are_read_by_behaviour_too():
    """GPT-2's first port, ``Attention(nx, n_ctx, config)``: was "no constructor argument names
    the model width"."""
    from tests.fixtures.config_forms import GPT2Attention

    said = notes(GPT2Attention)
    assert ("constructor width = nx, heads = config.n_head, dropout = config.attn_pdrop, "
            "context = n_ctx") in said, said
    assert any(note.startswith("config is a config object: it reads n_head, attn_pdrop, "
                               "resid_pdrop") for note in said), said


@pytest.mark.parametrize("replayed", [
    "Case(batch=2, q_len=1, kv_len=1, num_heads=2, head_dim=4, dtype='float32', seed=5)",
    "Case(batch=1, q_len=1, kv_len=3, num_heads=2, head_dim=4, dtype='float32', seed=2)",
    "Case(batch=2, q_len=2, kv_len=2, num_heads=2, head_dim=4, dtype='float32', seed=0, "
    "kept=(1, 2))",
])
@pytest.mark.parametrize(("course", "name"), [("mingpt", "CausalSelfAttention"),
                                              ("d2l", "MultiHeadAttention")])
def test_a_printed_case_replays_through_every_check(course, name, replayed):
    """The replay of a case the suite printed runs in every check it is given to: none ends in
    the suite's own error (a one-token case divided by zero in causal)."""
    results = check(getattr(MODULES[course], name), devices=["cpu"], replay=replayed)
    errors = {r.check: r.reason for r in results if r.status is Status.SUITE_ERROR}
    assert not errors


class IgnoresItsHeadCount(torch.nn.Module):
    """A ``num_heads`` argument it never uses: one head whatever it is given."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_a_role_a_name_gives_is_said_unconfirmed_where_behaviour_disagrees():
    assert ("num_heads: the head count by its name, unconfirmed (built with 1, 2, 4, its "
            "attention core computes 1, 1, 1 maps per sequence)") in notes(IgnoresItsHeadCount)
    assert not any("unconfirmed" in note for note in notes(MODULES["cs231n"].MultiHeadAttention))
