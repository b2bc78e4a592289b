"""The weight step of inference: the projections and the position encoding, found by
reproducing the module's own float64 output (:mod:`conformance.inference.weights.weight_search`),
confirmed at a second head count, and the grouped key/value heads read from them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from conformance.errors import clipped
from conformance.inference.observing.core_observed import (
    ROUTED,
    capped,
    core_departures,
    core_softcap,
    observed_sites,
    unmapped_note,
)
from conformance.inference.observing.tracing import lower_precision_parts
from conformance.inference.weights.encoding_search import (
    hypotheses,
    position_dependent,
)
from conformance.inference.weights.reproduction import (
    LENGTH,
    Build,
    other_pair,
    probe_inputs,
    reproduction_pair,
)
from conformance.inference.weights.rotary_found import as_stated, rotary_across_widths
from conformance.inference.weights.weight_search import (
    REPRODUCED,
    REPRODUCED_FLOAT32,
    REPRODUCED_FLOAT64,
    Found,
    consistent,
    reproduction_error,
    search,
)
from conformance.inference.weights.weight_trace import trace
from conformance.model.forms import LogitScale, PositionEncoding
from conformance.model.layouts import ParameterProjections, RelabelledHeads
from conformance.model.remedies import Note, Option, Remedy
from conformance.model.weights import WeightLayout, WeightLayoutError, user_path
from conformance.subject.boundary import ImplementationError

WEIGHTS_REMEDY = Remedy.to("weights", "q,k,v[,o]", "name its projections")
KV_HEADS_REMEDY = Remedy.to("kv_heads_arg", None, "name the argument that sets them, if one does")


@dataclass
class WeightOutcome:
    """What the weight step found: the layout (None: no weight access), the position encoding
    that reproduced the output (None: none needed, or none found), whether the output depends
    on token positions at all, the key/value heads capability, and the notes."""

    layout: WeightLayout | None = None
    encoding: PositionEncoding | None = None
    dependent: bool = False
    reproduced: bool = False
    kv_heads: int | str | None = None
    kv_doubt: str | None = None
    weights_doubt: str | None = None
    unexplained_widths: tuple[int, ...] = ()
    float32_parts: list[str] = field(default_factory=list)
    variant_doubt: str | None = None
    unmodelled: str | None = None
    """What of its computation the float64 reference from these weights does not model (a
    per-head QK-norm): the checks that need the reference take the core route."""


def find(build: Build, cls: type, call: str, *, causal: bool, single_head: bool,
         kv_argument: str | None, pairs: tuple[tuple[int, int], ...] | None,
         max_len: int | None, notes: list[str | Note], grouping: str | None = None,
         rope: tuple[str, float | None, float | None] | None = None,
         output_applied: bool = False, scale: LogitScale | None = None) -> WeightOutcome:
    """The weight step (see the module docstring); every finding goes into ``notes``.
    ``grouping``: the declared pairing of grouped query and key/value heads (None: found);
    ``rope``: the declared RoPE (pairing, theta, fraction); ``output_applied``: an output
    projection is declared, so a layer shaped like one that the forward skips is read as it;
    ``scale``: the logit scale its design sets (measured), in every hypothesis."""
    outcome = WeightOutcome()
    heads, head_dim = reproduction_pair(pairs, single_head)
    kv = next((k for k in range(heads // 2, 0, -1) if heads % k == 0), None) if (
        kv_argument and heads > 2) else None
    length = min(LENGTH, max_len or LENGTH)
    try:
        instance = build(heads, head_dim, kv)
        inputs = probe_inputs(call, heads, head_dim, length)
        found_trace = trace(instance, inputs)
        outcome.float32_parts = lower_precision_parts(lambda: instance.forward(inputs))
        threshold = REPRODUCED_FLOAT32 if outcome.float32_parts else REPRODUCED
        outcome.dependent = position_dependent(instance, inputs, causal, threshold)
    except (ImplementationError, RuntimeError) as error:
        notes.append(f"weights not searched: the float64 call with {heads} heads of {head_dim} "
                     f"failed ({clipped(str(error), 120)}): the checks that need weights are skipped")
        return outcome
    root = instance.module
    sites = observed_sites(instance, inputs)
    softcap = core_softcap(sites)
    found = search(found_trace, root, heads, causal=causal, threshold=threshold,
                   encodings=lambda layout, weights: capped(hypotheses(
                       root.inner, cls, weights.head_dim, dependent=outcome.dependent,
                       causal=causal, tiled=isinstance(layout, RelabelledHeads)), softcap,
                       scale),
                   groupings=(grouping,) if grouping else ("interleaved", "tiled"),
                   loose=REPRODUCED_FLOAT32)
    if found.reproduced:
        # The assignment and encoding are found; the confirmations at other widths and head
        # counts rule out a coincidence (1e-3 and up), not rounding: a part computed once at a
        # lower precision (a RoPE table built in float32, which no call's dtype shows) may
        # reproduce at 9e-9 at one width and 3e-8 at another. The gate measures the precision
        # the checks then judge by.
        threshold = REPRODUCED_FLOAT32
    if found.layout is None:
        called = ", ".join(dict.fromkeys(user_path(s.path)
                                         for s in found_trace.sources)) or "none"
        notes.append(unmapped_note(sites, f"no assignment of its parameters to q, k, v (and an "
                                   f"output projection) fits: called layers with a 2-D weight: "
                                   f"{called}", WEIGHTS_REMEDY))
        return outcome
    encoding, unexplained = found.encoding if found.reproduced else None, ()
    if encoding is not None and encoding.rotary is not None:
        # Measured at every width first: the confirmation at another head count (and width)
        # reproduces with it.
        measured, unexplained = rotary_across_widths(
            build, found.layout, encoding, cls, call, causal, heads, head_dim, pairs,
            length, threshold)
        encoding = replace(encoding, rotary=measured)
    if not single_head and not _confirmed(build, replace(found, encoding=encoding), call, causal,
                                          pairs, heads, length, threshold, notes):
        return outcome
    outcome.layout, outcome.reproduced = found.layout, found.reproduced
    outcome.encoding, outcome.unexplained_widths = encoding, unexplained
    if encoding is not None and encoding.rotary is not None:
        rotary = as_stated(encoding.rotary, cls, rope, head_dim, notes)
        outcome.encoding = replace(encoding, rotary=rotary)
        if rotary.reversed:
            outcome.variant_doubt = (
                "its RoPE turns each pair by -p * theta^(-2i/r), the other way round from every "
                "published RoPE (a sign-flipped rotate_half: cat(x2, -x1) for cat(-x2, x1)): "
                "attention is still relative, but weights trained in the usual convention "
                "(a checkpoint loaded into it) see every relative distance negated")
            notes.append(Note(outcome.variant_doubt + " (probed: only the reversed rotation "
                              "reproduces its output)",
                              Remedy.to("rope", None, "hold it to the usual one")))
    if encoding is not None and encoding.alibi is not None and encoding.alibi.scaled:
        outcome.variant_doubt = (
            "its ALiBi bias is added before the logits' 1/sqrt(head_dim) scaling (Falcon-RW's "
            "(q k^T + alibi) * inv_norm_factor), so every slope acts divided by sqrt(head_dim): "
            "still a linear distance penalty, but not the paper's slopes, and a model trained "
            "with the paper's bias attends otherwise")
        notes.append(outcome.variant_doubt + " (probed: only the bias added before the scaling "
                     "reproduces its output)")
    describe = found.layout.describe().removeprefix("weights: ").removeprefix("weights from ")
    if found.reproduced:
        how = (f"found by behaviour: the float64 reference from these weights reproduces its "
               f"output (relative error {found.error:.1e}, {found.tried} assignment(s) tried)")
        if outcome.encoding is not None:
            how += f", with {outcome.encoding.describe()}"
        notes.append(f"weights: {describe} ({how})")
        if found.error > REPRODUCED_FLOAT64 and not outcome.float32_parts:
            notes.append(f"float64 runs agree with the float64 reference to {found.error:.1e} "
                         "only, and no call it makes computes in float32: a part is built at a "
                         "lower precision and cast (position tables in float32?); the gate "
                         "measures the gap, and every check judges float64 runs by it")
    else:
        unmapped = core_departures(sites, found.tried, found.error)
        if unmapped is not None:  # no textbook weights to find: checked through its core
            notes.append(unmapped)
            # Its grouped key/value heads are still read (a QK-norm layer has them): the
            # configurations generated build them, and kv_groups says why it can't judge them.
            kv_heads = _kv_heads(build, found.layout, kv_argument, heads, head_dim, kv,
                                 None if single_head else pairs, notes)
            return WeightOutcome(dependent=outcome.dependent, float32_parts=outcome.float32_parts,
                                 kv_heads=kv_heads)
        if any(site.qk_norm == "head" for site in sites):
            outcome.unmodelled = ("q and k are normalised per head after their projections (a "
                                  "QK-norm, Qwen 3's)")
            follows = (f"{outcome.unmodelled}, which the float64 reference from weights does not "
                       f"model: {ROUTED} judge it through its attention core, kv_groups changes "
                       "one key/value head through these weights")
        else:
            follows = "the reference checks will show how it differs"
        closest = (f"closest relative error {found.error:.1e}" if math.isfinite(found.error)
                   else "none of them gives a finite reference to compare")
        notes.append(f"weights: {describe} (by the roles its forward gives them: nudging a query "
                     "changes its own row, a value every row linearly, a key every row; no "
                     f"assignment of {found.tried} tried reproduces its output, {closest}: "
                     f"{follows})")
    outcome.kv_heads = _kv_heads(build, found.layout, kv_argument, heads, head_dim, kv,
                                 None if single_head else pairs, notes)
    skipped = _skipped_output(found_trace, found.layout, root, heads)
    name = user_path(skipped) if skipped else None
    if skipped is not None and output_applied:
        outcome.layout = _with_output(found.layout, skipped)
        notes.append(f"{name} is read as the output projection (declared: the layer applies "
                     "one), though the forward never calls it")
    elif skipped is not None:
        outcome.weights_doubt = (
            f"{name} has the shape of an output projection but the forward never calls it: "
            "the output is the concatenated heads, which is attention without an output "
            f"projection; if {name} is meant to be applied, it is skipped")
        notes.append(Note(outcome.weights_doubt + " (see reference)",
                          Remedy.to("output_projection", "applied",
                                    "check it as the output projection")))
    if isinstance(found.layout, RelabelledHeads) and grouping is None:
        outcome.kv_doubt = (
            "query head h reads key/value head h mod Hkv (tiled, as x-transformers and "
            "torch's repeat pair them), not h // G (interleaved: HuggingFace's repeat_kv, "
            "SDPA's enable_gqa): a relabelling of the heads, correct attention either way, "
            "but checkpoints in the other convention load wrongly")
        notes.append(Note(outcome.kv_doubt + " (probed: only the tiled reading reproduces its "
                          "output)", Remedy((Option("kv_grouping", "tiled", "accept it"),
                                             Option("kv_grouping", "interleaved",
                                                    "hold it to HuggingFace's")))))
    elif grouping is not None and outcome.kv_heads is not None:
        notes.append(f"key/value heads grouped {grouping} (declared)")
    return outcome


def _with_output(layout: WeightLayout, path: str) -> WeightLayout:
    """``layout`` with the submodule at ``path`` as its output projection."""
    if isinstance(layout, RelabelledHeads):
        return replace(layout, inner=_with_output(layout.inner, path))
    if "o" in {f.name for f in fields(layout)} and not isinstance(layout, ParameterProjections):
        return replace(layout, o=path)
    return layout


def _skipped_output(found_trace, layout: WeightLayout, root, heads: int) -> str | None:
    """Where the layout has no output projection: the path of a layer the forward never calls
    with the shape one would have (the concatenated heads to the output)."""
    weights = layout.read(root, heads)
    if weights.w_o is not None:
        return None
    width = weights.num_heads * weights.value_dim
    out_width = found_trace.output.shape[-1]
    for source in found_trace.sources:
        if source.reads == "unused" and (source.rows, source.cols) == (out_width, width):
            return source.path
    return None


def _confirmed(build: Build, found: Found, call: str, causal: bool,
               pairs: tuple[tuple[int, int], ...] | None, heads: int, length: int,
               threshold: float, notes: list[str | Note]) -> bool:
    """Whether the layout also reads (and, where it reproduced, reproduces) at another head
    count; says why not."""
    other = other_pair(pairs, heads)
    if other is None:
        return True
    try:
        instance = build(other[0], other[1], None)
        inputs = probe_inputs(call, other[0], other[1], length, seed=12)
        found_trace = trace(instance, inputs)
    except (ImplementationError, RuntimeError):
        return True  # the gate and the constraints report a configuration that fails
    width = inputs.query.shape[-1]
    weights = consistent(found.layout, instance.module, other[0], width,
                         found_trace.output.shape[-1], found_trace.used)
    if weights is None:
        notes.append(Note(f"weights {found.layout.describe().removeprefix('weights from ')} "
                          f"fit {heads} heads but not {other[0]}: the checks that need weights "
                          "are skipped", WEIGHTS_REMEDY))
        return False
    if found.reproduced:
        error = reproduction_error(weights, found_trace, causal, found.encoding)
        if error >= LAYOUT_MISMATCH:
            # A layout that holds at one head count only is not how it reads its weights (a
            # head-count-dependent interleave, CodeGen's): judged by it, every rebuilt
            # configuration would differ from the reference for no bug of the layer's.
            notes.append(Note(f"with {other[0]} heads of {other[1]} the same weights no longer "
                              f"reproduce its output (relative error {error:.1e}): the layout "
                              f"holds at {heads} heads only, so the checks that need weights "
                              "are skipped", WEIGHTS_REMEDY))
            return False
        if error > threshold:
            notes.append(f"with {other[0]} heads of {other[1]} the same weights no longer "
                         f"reproduce its output (relative error {error:.1e})")
    return True


LAYOUT_MISMATCH = 1.0
"""The relative error at another head count from which the weights found are read into the wrong
places there (an output no closer to the reference than its own size: CodeGen's 1.3), not a
position encoding fitted at one width and off at another (StableLM's partial RoPE: 0.23, the
checks then say how it differs)."""


def _kv_heads(build: Build, layout: WeightLayout, kv_argument: str | None, heads: int,
              head_dim: int, kv: int | None, pairs, notes: list[str | Note]) -> int | str | None:
    """``"config"`` when a constructor argument sets the key/value heads (confirmed: built
    with fewer, the layout reads that many), an int the module fixes at every head count, or
    None."""
    if kv_argument:
        if kv is None:
            notes.append(f"key/value heads = {kv_argument}: generated as divisors of num_heads "
                         "(grouped-query attention)")
            return "config"
        notes.append(f"key/value heads = {kv_argument}: generated as divisors of num_heads "
                     f"(grouped-query attention; probed: built with {kv_argument}={kv}, {kv} "
                     f"key/value heads for {heads} query heads, read by its "
                     f"{layout.describe().removeprefix('weights: ')})")
        return "config"
    counts = {}
    for h, d in [(heads, head_dim)] + ([other_pair(pairs, heads)] if other_pair(pairs, heads) else []):
        try:
            counts[h] = layout.read(build(h, d, None).module, h).num_kv_heads
        except (ImplementationError, WeightLayoutError, RuntimeError):
            continue
    if all(count == h for h, count in counts.items()):
        return None
    values = set(counts.values())
    if len(values) != 1:
        notes.append(Note(f"key/value heads {counts} for the head counts tried: grouped-query "
                          "attention whose count follows no rule", KV_HEADS_REMEDY))
        return None
    (count,) = values
    notes.append(Note(f"{count} key/value head(s) at every head count (read from the "
                      "projections: grouped-query attention whose constructor fixes them)",
                      KV_HEADS_REMEDY))
    return count
