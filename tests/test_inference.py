"""Interface inference: every bundled implementation is checkable with nothing declared, and gets
the verdicts of its hand-written registration."""

from __future__ import annotations

import inspect

import pytest
import torch

from conformance import Config, Status
from conformance import check as check_target
from conformance.implementations import bundled, expected_results, expected_warnings
from conformance.implementations import seed000_multihead_self_attention as seed000
from conformance.implementations.mutants import MUTANT_MODULES
from conformance.implementations.mutants.mask_inverted import MaskInverted
from conformance.inference import Declarations, InferenceError, infer
from conformance.loading.registry import implementations_of, resolve
from conformance.model.remedies import Note, Remedy, Topic, texts
from conformance.numerics.platform_defects import PLATFORM_NOTE
from conformance.run.many import check_many
from tests.selection import wanted

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
    "mutant-causal-scale-sqrt-d-model": Declarations(causal="always"),
    "mutant-causal-softmax-query-axis": Declarations(causal="always"),
    "mutant-causal-heads-merged-without-transpose": Declarations(causal="always"),
    # Its bug is a declaration (non-causal) its behaviour contradicts: inference alone reads the
    # behaviour and says "always causal (probed)"; the declaration is the one flag.
    "mutant-encoder-with-causal-mask": Declarations(causal="never"),
    # Its bug lives in an alternative mask format, which is declared, not inferred.
    "mutant-bool-mask-inverted": Declarations(mask_formats=("keep_bool:broadcast",)),
    # Packing through a block-diagonal mask is a promise nothing in a signature shows.
    "modern-sliding-window": Declarations(packed="mask"),
    # Its bug breaks a promise (the paper's slopes) inference can't know was made: it measures
    # the slopes and holds them only to ALiBi's form (linear, positive).
    "mutant-alibi-slopes-reversed": Declarations(alibi="standard"),
    # Query heads reading key/value heads tiled (h mod Hkv) is a relabelling of the heads, a bug
    # only where HuggingFace's interleaved pairing is meant: bare, inference warns; declared,
    # the mismatch fails.
    "mutant-gqa-repeat": Declarations(kv_grouping="interleaved"),
}
CHECKED = {impl.name: _spec(impl) for impl in bundled()}
COMPARED_WITH_REFERENCE = ("reference", "head_split", "stability", "low_precision", "scale",
                           "fully_masked")
MUTANTS = {module.IMPLEMENTATION.name: module for module in MUTANT_MODULES}


def _inverse_width(caps) -> bool:
    """Whether inference measured a logit scale of 1/w no setting explains (a warning)."""
    encoding = caps.position.encoding
    return encoding is not None and encoding.scale is not None and encoding.scale.ambiguous


@pytest.fixture(scope="module")
def inferred_findings(request) -> dict[str, tuple[set[str], set[str], object]]:
    """(failed checks, warned checks, the inferred implementation) of each registration's class,
    inferred (plus its one flag, where listed), keyed by the registration's name: those the
    selected tests are about (``-k mask_inverted`` infers and checks one), every one for a full
    run."""
    names = wanted(request, {"inferred_findings"}, lambda params: params.get("name"))
    plain = {name: (spec, resolve(spec)[0]) for name, spec in CHECKED.items()
             if name not in ONE_FLAG and (names is None or name in names)}
    flagged = {name: (CHECKED[name], resolve(CHECKED[name], declared)[0])
               for name, declared in ONE_FLAG.items() if names is None or name in names}
    unique = list({impl.name: (spec, impl) for spec, impl in plain.values()}.values())
    results = check_many(unique, devices=["cpu"], jobs=2)
    for spec, impl in flagged.values():
        results += check_many([(spec, impl)], devices=["cpu"])
    by_label: dict[str, tuple[set[str], set[str]]] = {}
    for result in results:
        failed, warned = by_label.setdefault(result.implementation, (set(), set()))
        if result.status is Status.FAILED:  # inferred: nothing is expected, every failure shows
            failed.add(result.check)
        elif result.status is Status.WARNED and not result.reason.startswith(PLATFORM_NOTE):
            warned.add(result.check)
    return {name: (*by_label[impl.name], impl) for name, (_, impl) in {**plain, **flagged}.items()}


@pytest.mark.parametrize("name", list(CHECKED))
def test_inference_alone_finds_what_the_registration_finds(inferred_findings, name):
    """Inference never invents a finding, and finds every mutant's bug. Where it reports less than
    the hand-written registration, it is for a stated reason: float16/bfloat16 are assumed, not
    declared (findings there are warnings), or no mask convention could be inferred (padding
    fails once, the checks that need the mask skip), or a mask is read with the polarity the
    module uses where its name suggests the other (a warning: inference can't know the intent), or a layer the
    forward never calls has the shape of the output projection the found weights lack
    (``reference`` warns: behaviour can't tell a skipped projection from a spare layer), or a
    position encoding no hypothesis reproduces (a broken RoPE or ALiBi: the reference checks
    skip, the encoding's own check fails), or a scale of 1/w, which muP's design gives as well as
    1/sqrt(w) applied twice (``scale`` warns naming both; the reference computes with the scale
    measured, so the checks that compare with it pass)."""
    failed, warned, impl = inferred_findings[name]
    registered = set(expected_results().get(name, {}))
    registered_warnings = set(expected_warnings().get(name, {}))
    assert failed <= registered, CHECKED[name]
    assert warned <= registered | registered_warnings, CHECKED[name]
    caps = impl.capabilities
    for check in registered - failed:
        explained = ((check in warned and caps.floats.assumed)
                     or caps.doubts.mask_problem is not None or caps.doubts.mask_polarity is not None
                     or (check in (*COMPARED_WITH_REFERENCE, "autograd")
                         and "reference" in warned and caps.doubts.weights is not None)
                     or (check in COMPARED_WITH_REFERENCE
                         and caps.position.positional is not None and caps.position.encoding is None)
                     or (check in COMPARED_WITH_REFERENCE and "scale" in warned
                         and _inverse_width(caps)))
        assert explained, (CHECKED[name], check)
    mutant = MUTANTS.get(name)
    if mutant is not None:
        assert mutant.CATCHES in failed | warned, (CHECKED[name], mutant.CATCHES)
    if registered or registered_warnings:
        assert failed | warned, CHECKED[name]
    else:
        assert not failed and not warned, CHECKED[name]


def test_the_report_opens_with_what_was_inferred():
    notes = infer(seed000.MultiHeadAttention).notes
    assert notes[0].text == "self-attention forward(X, attention_mask)"
    # The user's own attribute paths: nothing of the suite's wrapper (its ``inner``).
    assert any(note.text.startswith("weights: q_proj/k_proj/v_proj/out_proj "
                                    "(found by behaviour: the float64 reference from these "
                                    "weights reproduces its output") for note in notes)
    assert not any("inner." in note.text for note in notes)
    # What would state each otherwise is data beside the words, said by each front end.
    assert Note("attention_mask: int mask, 0 = masked, shape (B, 1, 1, Lk) (probed; forms tried "
                "before it: shape (B, Lk) raises in every form tried)",
                Remedy.to("mask", "keep_int:broadcast@attention_mask", "state it"), Topic.MASK,
                plain="attention_mask: int mask, 0 = masked, shape (B, 1, 1, Lk)") in notes
    assert Note("not causal (probed: rows see later positions)",
                Remedy.to("causal", "always", "say it is meant to be")) in notes


def test_a_mask_whose_name_settles_its_polarity_read_the_other_way_is_a_warning():
    """Names order the search; behaviour decides. A HuggingFace-named mask that behaves as a mask
    read 1 = masked is that (which polarity was meant is intent): a warning with the evidence,
    never a failure; declared, the mismatch is a failure."""
    spec = "tests.fixtures.user_impls:InvertedAttentionMask"
    (impl,) = resolve(spec)
    assert impl.capabilities.mask.kind.value == "ignore_bool"
    assert impl.capabilities.doubts.mask_problem is None
    assert ("the opposite of what a mask named 'attention_mask' strongly means (1/True = "
            "attend)") in impl.capabilities.doubts.mask_polarity.text
    assert "or the mask is inverted" in impl.capabilities.doubts.mask_polarity.text
    (result,) = check_many([(spec, impl)], devices=["cpu"], checks=["padding"])
    assert result.status is Status.WARNED
    declared = Declarations(mask="keep_int:key_padding@attention_mask")
    (impl,) = resolve(spec, declared)
    (result,) = check_many([(spec, impl)], devices=["cpu"], checks=["padding"],
                           declared=declared)
    assert result.status is Status.FAILED


def test_a_mask_named_mask_read_the_other_way_is_accepted_and_doubted():
    impl = infer(MaskInverted).implementation
    assert impl.capabilities.mask.kind.value == "ignore_bool"
    polarity = impl.capabilities.doubts.mask_polarity
    assert "the opposite of what a mask named 'mask' usually means" in polarity.text
    assert polarity.remedy.options[0].value.startswith("ignore_bool:")
    (result,) = check_many([("conformance.implementations.mutants.mask_inverted:MaskInverted", impl)],
                           devices=["cpu"], checks=["padding"])
    assert result.status is Status.WARNED


def test_torch_multihead_attention_through_inference_alone():
    notes = texts(infer(torch.nn.MultiheadAttention).notes)
    assert any(note.startswith("forward returns a tuple: its first element is taken as the "
                               "output") for note in notes)
    assert any(note.startswith("key_padding_mask: bool mask, True = ignore, shape (B, Lk) "
                               "(probed") for note in notes)
    assert any(note.startswith("weights: in_proj_weight/out_proj (found by "
                               "behaviour") for note in notes)


def test_unfillable_constructor_is_one_clear_line():
    class NeedsVocabulary(torch.nn.Module):
        def __init__(self, d_model, num_heads, vocabulary):
            super().__init__()
            self.words = list(vocabulary)  # an int fills nothing here

        def forward(self, x):
            return x

    with pytest.raises(InferenceError, match="can't fill constructor argument"):
        infer(NeedsVocabulary)


def test_core_function_tier_checks_a_plain_function():
    from tests.fixtures import core_functions

    (good,) = resolve("tests.fixtures.core_functions:attention")
    assert texts(good.notes)[0].startswith("core function over (batch, heads, length, head_dim)")
    assert "causal when is_causal=True" in texts(good.notes)
    assert any(n.startswith("mask: bool mask, True = attend, shape (B, 1, 1, Lk)")
               for n in texts(good.notes))
    (bad,) = resolve("tests.fixtures.core_functions:attention_softmax_over_queries")
    targets = [("tests.fixtures.core_functions:attention", good),
               ("tests.fixtures.core_functions:attention_softmax_over_queries", bad)]
    results = check_many(targets, devices=["cpu"], jobs=2)
    failed = {(r.implementation, r.check) for r in results if r.status is Status.FAILED}
    assert not {check for name, check in failed if name.endswith(":attention")}
    assert ("core_functions:attention_softmax_over_queries", "row_stochastic") in failed
    assert core_functions.attention.__name__ == "attention"  # the wrapper leaves it untouched


def test_an_instance_is_checked_as_it_is():
    """Its own width, head count, key/value heads and weights, found from what it computes; the
    checks build deep copies, never the class, and the instance is left as it was."""
    from conformance.implementations.modern import LlamaAttention

    instance = LlamaAttention(64, 8, num_kv_heads=2)
    before = {name: p.detach().clone() for name, p in instance.state_dict().items()}
    (impl,) = implementations_of(instance)
    notes = " ".join(texts(impl.notes))
    assert "an instance, checked as it is" in notes and "64 wide" in notes
    assert "8 heads, fixed by the module" in notes
    assert "2 key/value head(s)" in notes
    assert impl.capabilities.heads == 8 and impl.capabilities.shapes == ((8, 8),)
    assert impl.capabilities.configured == ()  # never rebuilt: no constructor setting varies
    built = impl.factory(Config(batch=1, q_len=2, kv_len=2, d_model=64, num_heads=8))
    assert built.inner is not instance
    assert torch.equal(built.inner.q_proj.weight, instance.q_proj.weight)
    results = check_target(instance, devices=["cpu"], checks=["gate", "reference", "kv_groups"])
    assert {r.status for r in results} == {Status.PASSED}, results
    assert all(torch.equal(before[n], p) for n, p in instance.state_dict().items())


class _WidthThroughKwargs(torch.nn.Module):
    """A constructor that reads its width from ``**kwargs``: the declared argument sets it."""

    def __init__(self, num_heads, **kwargs):
        super().__init__()
        width = kwargs["d_model"]
        self.heads, self.qkv = num_heads, torch.nn.Linear(width, 3 * width)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)\
            .reshape(b, n, d)


class _WidthSwallowed(_WidthThroughKwargs):
    """d2l's form: the width is ``num_hiddens``; anything else goes to ``**kwargs`` unread."""

    def __init__(self, num_hiddens, num_heads, **kwargs):
        super().__init__(num_heads, d_model=num_hiddens)


def test_a_declared_width_swallowed_by_kwargs_is_said_in_one_line():
    """A declared width argument that only ``**kwargs`` takes, and that sets no width (the
    output is as wide whatever it is), is a declaration that does not fit; one the constructor
    reads from ``**kwargs`` is followed."""
    infer(_WidthThroughKwargs, declared=Declarations(width_arg="d_model", heads_arg="num_heads"))
    with pytest.raises(InferenceError, match=r"'d_model', sets no width: the constructor has no "
                                             r"argument 'd_model', only \*\*kwargs.*its arguments: "
                                             r"num_hiddens, num_heads"):
        infer(_WidthSwallowed, declared=Declarations(width_arg="d_model", heads_arg="num_heads"))
