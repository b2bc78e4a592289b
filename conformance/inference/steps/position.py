"""Inference steps about positions: a RoPE or ALiBi inside (the one that reproduces the output),
how ALiBi counts, and the form of a position input."""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.inference.inquiry import Inquiry
from conformance.inference.names.convention import FILLABLE_POSITIONS, START_NAMES
from conformance.inference.names.positional import position_encoding
from conformance.inference.observing.core_observed import WORDS, position_bias
from conformance.inference.observing.probing import probe_case
from conformance.inference.weights.encoding_search import setting_arguments
from conformance.inference.weights.weight_search import REPRODUCED_FLOAT32, relative_error
from conformance.model.declarations import Declarations
from conformance.model.forms import AlibiBias, PositionEncoding, PositionForm, Rotary, Setting
from conformance.model.remedies import Note, Option, Remedy
from conformance.model.spec import Config
from conformance.model.weights import WeightLayoutError
from conformance.numerics.core_fit import BiasForm
from conformance.numerics.reference import reference_attention
from conformance.subject.boundary import ImplementationError

POSITION_WORDS = {"rotary": "rotary position embeddings (RoPE)", "alibi": "ALiBi position biases",
                  "positions": "a position input"}


def encoding_inside(inquiry: Inquiry) -> None:
    """A position encoding inside: the RoPE or ALiBi that reproduced the module's output (the
    float64 reference then models it), else what names and a position argument suggest (the
    checks that need the reference skip), or nothing where the output is position-free."""
    plan, declared, capabilities, notes = (inquiry.plan, inquiry.declared, inquiry.capabilities,
                                           inquiry.notes)
    probe, outcome = inquiry.probe, inquiry.outcome
    stated = declared.declared_encoding()
    reproduced = outcome.encoding
    if reproduced is not None and reproduced.softcap is not None:
        capabilities.set(position={"encoding": reproduced})
        notes.append(f"a logit softcap c·tanh(logits / c), c = {reproduced.softcap:g}, before the "
                     "mask (observed at its attention core, and the float64 reference with it "
                     "reproduces its output): the reference checks apply it")
    if reproduced is not None and reproduced.positional and stated in (
            None, "rotary" if reproduced.rotary else "alibi"):
        kind = "rotary" if reproduced.rotary else "alibi"
        capabilities.set(position={"positional": f"{reproduced.describe()} (reproduced)",
                                   "relative": kind, "encoding": reproduced})
        text = (f"{reproduced.describe()} inside (found by behaviour: its output depends on "
                "the tokens' positions, and the float64 reference with this encoding reproduces "
                "it; the reference checks apply it); position_shift checks that shifting every "
                "position changes nothing")
        if kind == "alibi":
            capabilities.set(position={"alibi": declared.alibi or "standard"})
            text += "; alibi holds the slopes to the paper's (they reproduced the output)"
        notes.append(text)
        # A RoPE the reference models by a rule (not a table measured per width) can be built
        # with another theta or share, and followed.
        # Not an instance checked as it is: it is never rebuilt, so nothing of it can vary.
        by_rule = (kind == "rotary" and not reproduced.rotary.table
                   and plan.instance is None)
        configured = tuple((setting, name) for setting, name in zip(
            (Setting.ROPE_THETA, Setting.ROTARY_FRACTION), setting_arguments(plan.cls),
            strict=True) if name is not None) if by_rule else ()
        if configured:
            capabilities.set(configured=configured)
            notes.append(", ".join(name for _, name in configured) + ": RoPE settings of its "
                         "constructor; configuration builds it with other values and checks "
                         "that the rotation it measures follows them")
        return
    found = position_encoding(probe.module.inner, plan.convention.positions)
    if found is not None and not outcome.dependent and outcome.layout is not None:
        # Names suggest a position encoding, behaviour shows none (permuting the tokens
        # permutes the output): behaviour decides.
        notes.append(Note(f"{found[1]} suggests a position encoding, but its output does not "
                          "depend on the tokens' positions (probed): checked as position-free",
                          Remedy.to("position_encoding", found[0],
                                    "say it is meant to have one")))
        found = None
    measured = (position_bias(probe, probe.config, plan.convention.call)
                if found is None and stated is None and outcome.dependent else None)
    if measured in WORDS:
        # Its attention core shows where the position dependence is: a bias in its logits that
        # the tokens don't move (a learned relative bias, T5's), not tokens mixed up.
        capabilities.set(position={
            "positional": f"a position bias in its logits (measured: {measured.value})"})
        relative = measured is BiasForm.RELATIVE
        if relative:
            capabilities.set(position={"relative": "bias"})
        notes.append(f"a position bias in its logits: its output depends on the tokens' "
                     f"positions, and at its attention core the logits carry a bias the tokens "
                     f"don't move that is {WORDS[measured]} (measured from two forwards): the "
                     "checks that assume position-free attention skip"
                     + ("; position_shift checks that shifting every position changes nothing"
                        if relative else ""))
        return
    if found is None and stated is None and outcome.dependent:
        # Said, and still checked as position-free: a layer that mixes tokens up (heads split
        # without a transpose) depends on their positions as much as an unknown encoding does,
        # and, where its core shows no position bias, behaviour can't tell the two apart.
        notes.append(Note(
            "its output depends on the tokens' positions (probed: moving the tokens changes "
            "more than their order), and no RoPE or ALiBi hypothesis reproduces it and no name "
            "suggests one: checked as position-free",
            Remedy((Option("rope", None, "hold it to the RoPE it has"),
                    Option("alibi", "standard", "hold it to the paper's ALiBi"),
                    Option("position_encoding", None, "skip the reference's comparisons")))))
    if stated == "none":
        found = None
        notes.append("no position encoding (declared)")
    elif stated is not None:
        found = (stated, "declared")
    if found is not None:
        kind, evidence = found
        origin = "declared" if evidence == "declared" else f"inferred from {evidence}"
        capabilities.set(position={"positional": f"{POSITION_WORDS[kind]} ({origin})"})
        options = () if evidence == "declared" else (
            Option("position_encoding", "none", "say it has none"),)
        text = (f"{POSITION_WORDS[kind]} inside ({origin}): the checks that assume "
                "position-free attention skip")
        if kind in ("rotary", "alibi"):
            capabilities.set(position={"relative": kind})
            text += "; position_shift checks that shifting every position changes nothing"
        if kind == "alibi":
            capabilities.set(position={"alibi": declared.alibi or "measured"})
            text += "; alibi measures the slopes" + (
                " against the paper's (declared)" if declared.alibi == "standard" else "")
            if declared.alibi != "standard":
                options += (Option("alibi", "standard", "hold the slopes to the paper's"),)
        held = declared_encoding(kind, declared)
        if held is not None:
            # Behaviour could not reproduce it, but what is meant is declared: the reference
            # holds the module to it.
            capabilities.set(position={"encoding": held})
            text += (f"; no encoding behaviour tried reproduces its output, so the reference "
                     f"checks hold it to the declared {held.describe()}")
        notes.append(Note(text, Remedy(options) if options else None))


def alibi_counting(inquiry: Inquiry) -> None:
    """Whether ALiBi's positions count every token or only the kept ones (BLOOM's
    ``build_alibi_tensor`` numbers the tokens by the mask's cumulative sum): decided by which
    reproduces its output under a mask with padding before kept keys, at the kept rows."""
    plan, capabilities, layout = inquiry.plan, inquiry.capabilities, inquiry.layout
    heads, head_dim = inquiry.heads, inquiry.head_dim
    encoding = capabilities.caps.position.encoding
    if (not isinstance(encoding, PositionEncoding) or encoding.alibi is None
            or capabilities.caps.mask is None or layout is None):
        return
    config = Config(batch=2, q_len=6, kv_len=6, d_model=heads * head_dim, num_heads=heads,
                    num_kv_heads=None, dtype=torch.float64)
    causal = capabilities.caps.causality.kind == "always"
    try:
        instance = inquiry.build(config, layout)
        inputs = probe_case(heads, head_dim, causal=causal, dtype="float64").inputs(
            plan.convention.call)
        output = instance.forward(inputs)
        weights = instance.read_weights()
    except (ImplementationError, WeightLayoutError, RuntimeError):
        return
    rows = inputs.keep if inputs.is_self else torch.ones_like(inputs.keep)
    errors = {}
    for counts_kept in (False, True):
        candidate = replace(encoding, alibi=replace(encoding.alibi, counts_kept=counts_kept))
        expected = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                       keep=inputs.keep, causal=causal,
                                       encoding=candidate).output
        errors[counts_kept] = relative_error(output[rows], expected[rows])
    if errors[True] < REPRODUCED_FLOAT32 <= errors[False]:
        capabilities.set(position={"encoding": replace(encoding, alibi=replace(
            encoding.alibi, counts_kept=True))})
        inquiry.notes.append("ALiBi positions count the kept tokens only (BLOOM's cumulative sum of "
                     f"the mask; probed: relative error {errors[True]:.1e} with it, "
                     f"{errors[False]:.1e} counting every token)")


def declared_encoding(kind: str, declared: Declarations) -> PositionEncoding | None:
    """The encoding the declarations spell out in full, for a module of ``kind``: ALiBi with
    the paper's slopes, or RoPE with its pairing (and theta, fraction) declared."""
    if kind == "alibi" and declared.alibi == "standard":
        return PositionEncoding(alibi=AlibiBias())
    rope = declared.rotary()
    if kind == "rotary" and rope is not None:
        pairing, theta, fraction = rope
        return PositionEncoding(rotary=Rotary(pairing, theta or 10000.0, fraction or 1.0))
    return None


POSITION_FORM_WORDS = {PositionForm.IDS: "(B, L) int64", PositionForm.VECTOR: "(L,) int64",
                       PositionForm.START: "the first position, an int"}


def position_input(inquiry: Inquiry) -> None:
    """A position argument the suite can fill (declared, or read from its name)."""
    plan, declared, capabilities = inquiry.plan, inquiry.declared, inquiry.capabilities
    stated_positions = declared.position_argument()
    if stated_positions is not None:
        argument, form = stated_positions
        how = "declared"
    elif plan.convention.position_argument:
        argument = plan.convention.position_argument
        form = FILLABLE_POSITIONS[argument]
        buffers_start = argument == plan.convention.cache and argument in START_NAMES
        if buffers_start and not plan.convention.position_required:
            return  # the cache's start position, passed only with the cache
        how = "its name says so"
    else:
        return
    capabilities.set(position={"argument": argument, "form": form})
    inquiry.notes.append(f"{argument}: the tokens' positions, passed as {POSITION_FORM_WORDS[form]} "
                 f"({how})")

