"""Inference steps about the declared-or-probed features: a sliding window, causal chunks, a KV
cache, packed sequences, a per-query mask, the key-padding mask's convention."""

from __future__ import annotations

from dataclasses import replace

import conformance.inference.calls.chunk as chunking
import conformance.inference.calls.kv_cache as kv_cache
import conformance.inference.calls.packing as packing
import conformance.inference.calls.window as window
from conformance.generation.cases import own_queries
from conformance.inference.inquiry import Inquiry
from conformance.inference.observing.probing import (
    BOOLEAN_POLARITY,
    infer_mask,
    mask_behaviour,
    probe_case,
)
from conformance.inference.plan import WIDE_WINDOW, InferenceError, declarations_read
from conformance.model.declarations import DeclarationError
from conformance.model.forms import CacheStyle, PackedForm
from conformance.model.mask_forms import LENGTH_LAYOUTS, QUERY_AXIS_LAYOUTS, MaskConvention, right_padded
from conformance.model.remedies import Note, Remedy, Topic
from conformance.model.spec import Doubts
from conformance.subject.boundary import ImplementationError


def _built(plan, name: str, why: str) -> str:
    """What ``name`` is built with where its structure is not checked: the declared value
    (``--init``), which the construction passes, else the suite's wide one."""
    given = dict(plan.init)
    if name in given:
        return f"{name}={given[name]!r} (declared)"
    return f"{name}={WIDE_WINDOW} ({why})"


def window_form(inquiry: Inquiry) -> None:
    """A sliding-window argument: how it counts (declared, settled by its name, or probed)."""
    plan, declared, capabilities, notes = (inquiry.plan, inquiry.declared, inquiry.capabilities,
                                           inquiry.notes)
    heads, head_dim = inquiry.heads, inquiry.head_dim
    name = plan.roles.window
    if not name or plan.length_window is not None:  # a length it sets: said where found
        return
    if capabilities.caps.causality.kind != "always":
        notes.append(f"{name}: a window argument, but the module is not always causal: built "
                     f"with {_built(plan, name, 'a window wider than any sequence')}, not checked "
                     "as windowed")
        return
    stated = declared.window()
    remedy = None
    if stated is not None:
        convention, how = stated[1], "declared"
    elif name in window.SETTLED:
        convention = window.SETTLED[name]
        other = "left" if convention == "keys" else "keys"
        how = "its name says so"
        remedy = Remedy.to("window_arg", f"{name}:{other}", "say it counts the other way")
    else:
        def built(width: int):
            return inquiry.build(replace(inquiry.config, window=width))

        case = probe_case(heads, head_dim, kept=None, batch=1, q_len=window.LENGTH,
                          kv_len=window.LENGTH, causal=True)
        convention, seen = window.probe_convention(built, case, plan.convention.call)
        if convention is None:
            convention = "keys"
            how = (f"probed: built with {name}={window.PROBE_WINDOW}, the last row sees "
                   f"positions {seen}, neither convention; checked as W keys (see "
                   "sliding_window)")
            remedy = Remedy.to("window_arg", f"{name}:left",
                               "count it as the keys before each row, if that is meant")
        else:
            other = "left" if convention == "keys" else "keys"
            how = (f"probed: built with {name}={window.PROBE_WINDOW}, the last row sees "
                   f"{len(seen)} positions")
            remedy = Remedy.to("window_arg", f"{name}:{other}", "say the other count was meant")
            if convention == "left":
                # One more key than its own argument says: FlashAttention's count, or a window
                # off by one; only its author knows which was meant.
                capabilities.doubt(window=(
                    f"built with {name}={window.PROBE_WINDOW}, each row sees "
                    f"{window.PROBE_WINDOW + 1} keys ({window.PROBE_WINDOW} before it and "
                    f"itself): FlashAttention's window_size counts so, most layers' "
                    f"{name} counts {window.PROBE_WINDOW} keys in all; checked as it counts"))
    plan.window_offset = -1 if convention == "left" else 0
    capabilities.set(window="config")
    notes.append(Note(f"{name}: a causal sliding window, {window.CONVENTION_WORDS[convention]} "
                      f"({how}); generated as 1 to 8 keys", remedy))


def chunk_form(inquiry: Inquiry) -> None:
    """Causal chunks: an argument's (declared, or a name that orders the search), confirmed by
    what the rows see when built in chunks of 3; or a chunk (or a sliding window) the module
    fixes itself, measured.
    A chunk argument under which every row still sees every earlier position sets no structure
    (a computation tile) and is left at its default."""
    plan, capabilities, notes = inquiry.plan, inquiry.capabilities, inquiry.notes
    name = plan.roles.chunk
    caps = capabilities.caps
    if caps.causality.kind != "always" or caps.window is not None:
        if name:
            notes.append(f"{name}: a chunk argument, but the module is not always causal"
                         f"{'' if caps.window is None else ' or has a sliding window'}: built "
                         f"with {_built(plan, name, 'wider than any sequence')}, not checked as "
                         "chunked")
        return
    case = probe_case(inquiry.heads, inquiry.head_dim, kept=None, batch=1,
                      q_len=chunking.LENGTH, kv_len=chunking.LENGTH, causal=True)
    if not name:
        try:
            seen = chunking.dependence(inquiry.build(), case, plan.convention.call)
        except ImplementationError:
            return
        fixed = chunking.chunk_of(seen)
        if fixed is not None:
            capabilities.set(chunk=fixed)
            notes.append(Note(f"causal chunks of {fixed}, fixed by the module (measured: "
                              f"{chunking.rows_words(seen)}); checked as chunked", None))
            return
        width = chunking.window_of(seen)
        if width is not None:  # a window it sets itself (its config's, inside a model)
            capabilities.set(window=width)
            notes.append(Note(f"a causal sliding window of {width} keys per row, itself "
                              f"included, fixed by the module (measured: "
                              f"{chunking.rows_words(seen)}); checked as windowed", None))
        return
    declared = inquiry.declared.chunk_arg == name
    seen_kind, seen = chunking.probe_chunk(
        lambda size: inquiry.build(replace(inquiry.config, chunk=size)), case,
        plan.convention.call)
    probed = f"built with {name}={chunking.PROBE_CHUNK}"
    if seen_kind is chunking.Seen.CAUSAL and not declared:
        plan.roles.chunk = None  # built with its own default from here on
        notes.append(Note(f"{name}: not a visibility structure ({probed}, every row sees every "
                          "earlier position: a computation tile?); left at its default",
                          Remedy.to("chunk_arg", name, "declare it, if it is meant to be a "
                                    "causal chunk")))
        return
    if declared:
        how = "declared"
    elif seen_kind is chunking.Seen.CHUNKS:
        how = (f"probed: {probed}, row t sees {chunking.PROBE_CHUNK} * (t // "
               f"{chunking.PROBE_CHUNK}) .. t")
    elif seen is None:
        how = f"its name says so; {probed} it raised"
    else:
        how = (f"its name says so; {probed}: {chunking.rows_words(seen)}, not chunks of "
               f"{chunking.PROBE_CHUNK} counted from position 0 (see chunked)")
    capabilities.set(chunk="config")
    notes.append(Note(f"{name}: causal chunks, row t sees C * (t // C) .. t ({how}); generated "
                      "as 2 to 8 positions", None))


def cache_form(inquiry: Inquiry) -> None:
    """A KV cache argument: its style (declared, or read from the signature), confirmed by a
    prefill through it."""
    plan, declared, capabilities, notes = (inquiry.plan, inquiry.declared, inquiry.capabilities,
                                           inquiry.notes)
    heads, head_dim = inquiry.heads, inquiry.head_dim
    stated = declared.cache()
    if stated == "none":
        notes.append("no KV cache (declared)")
        return
    if stated is not None:
        style, argument, factory = stated
        options = (((plan.convention.use_cache, True),) if plan.convention.use_cache else ())
        found = kv_cache.CacheProtocol(style, argument, options, factory)
        how = "declared"
    elif plan.convention.cache:
        found, how = kv_cache.protocol(plan.convention, plan.cls.forward)
        if found is None:
            notes.append(Note(f"{plan.convention.cache}: {how}: the KV cache is not checked",
                              Remedy.to("kv_cache", "object@ARG=module:Class", "check it")))
            return
    else:
        return
    cross = plan.convention.call == "cross"
    if capabilities.caps.causality.kind == "never" and not cross:
        why = ("its causality could not be probed" if "causal" in capabilities.unprobed
               else "the module is not causal")
        notes.append(f"{found.argument}: a KV cache argument, but {why}: the cache is not "
                     "checked")
        return
    case = probe_case(heads, head_dim, kept=None, causal=True)
    problem = kv_cache.confirm(inquiry.build, found, case, plan.convention.call)
    if problem is not None:
        notes.append(Note(f"{found.argument}: a prefill through the cache as {found.describe()} "
                          f"failed ({problem}): the KV cache is not checked",
                          Remedy.to("kv_cache", None, "state how it is handed over")))
        return
    layout = declared.cache_layout_form()
    if layout is not None and found.style is not CacheStyle.RETURNED:
        raise DeclarationError(f"cache-layout {layout.value}: the cache is handed over as "
                               f"{found.describe()}, not returned: the layout holds only a "
                               "returned cache")
    capabilities.set(cache={**found.capabilities()["cache"], "layout": layout})
    held = f"; held to (k, v) each {layout.value} (declared)" if layout else ""
    against = ("the context's keys and values kept between calls; kv_cache checks the queries fed "
               "in steps, with the context's mask, against one uncached call" if cross else
               "kv_cache checks decoding against the full forward")
    notes.append(Note(f"KV cache: {found.describe()} ({how}; probed: a prefill through it works"
                      f"{held}); " + against,
                      Remedy.to("kv_cache", None, "state another style")))


def packed_form(inquiry: Inquiry) -> None:
    """Packed sequences: a cu_seqlens argument (its token layout probed), or declared."""
    plan, declared, capabilities, notes = (inquiry.plan, inquiry.declared, inquiry.capabilities,
                                           inquiry.notes)
    heads, head_dim = inquiry.heads, inquiry.head_dim
    stated = declared.packing()
    case = probe_case(heads, head_dim, kept=None, batch=1,
                      causal=capabilities.caps.causality.kind == "always")
    if stated is not None and stated[0] is PackedForm.MASK:
        mask = capabilities.caps.mask
        if (mask is None or mask.layout not in QUERY_AXIS_LAYOUTS) and not per_query_mask(inquiry):
            return
        capabilities.set(packing={"form": PackedForm.MASK})
        notes.append("packed sequences through a block-diagonal mask (declared)")
        return
    argument = stated[1] if stated is not None else plan.convention.packed
    if not argument:
        return
    max_seqlen = plan.convention.max_seqlen
    if stated is not None:
        form, how = stated[0], "declared"
    else:
        form = packing.probe_form(inquiry.build, case, plan.convention.call, argument, max_seqlen)
        how = "probed"
        if form is None:
            notes.append(Note(f"{argument}: a cu_seqlens argument, but no packed call works "
                              "(tokens (total, D) or (1, total, D)): packing is not checked",
                              Remedy.to("packed", f"cu_seqlens@{argument}", "check it packed")))
            return
    capabilities.set(packing={"form": form, "argument": argument, "max_seqlen_argument": max_seqlen})
    tokens = "(total, D)" if form is PackedForm.CU_SEQLENS_FLAT else "(1, total, D)"
    notes.append(f"{argument}: packed sequences, tokens {tokens} ({how})"
                 + (f", with {max_seqlen}" if max_seqlen else ""))


def per_query_mask(inquiry: Inquiry) -> bool:
    """For packing through the mask: a mask convention with a query axis, searched again among
    those layouts only."""
    plan, capabilities, notes = inquiry.plan, inquiry.capabilities, inquiry.notes
    argument = plan.convention.mask
    if not argument:
        raise InferenceError("packed=mask is declared, but forward takes no mask argument")
    search = infer_mask(inquiry.build(mask=None, doubts=Doubts()),
                        probe_case(inquiry.heads, inquiry.head_dim),
                        plan.convention.call, plan.convention.mask_family, argument,
                        name_settles=plan.convention.mask_name_settles,
                        layouts=QUERY_AXIS_LAYOUTS)
    if search.convention is None:
        notes.append(f"packed=mask is declared, but {argument} takes no mask with a query axis "
                     "((B, Lq, Lk), (B, 1, Lq, Lk), (B, H, Lq, Lk), (Lq, Lk)): packing is not "
                     "checked")
        return False
    capabilities.set(mask=search.convention)
    notes.append(f"{argument}: {search.convention.describe()} (probed among the layouts with a "
                 "query axis, for packing)")
    return True


def mask_form(inquiry: Inquiry) -> None:
    plan, declared, capabilities, notes = (inquiry.plan, inquiry.declared, inquiry.capabilities,
                                           inquiry.notes)
    heads, head_dim = inquiry.heads, inquiry.head_dim
    argument = plan.convention.mask
    with declarations_read():
        declared_mask = declared.mask_convention("mask")
        formats = declared.alternative_masks("mask") if declared.mask_formats else ()
    if declared_mask is not None:
        if not argument:
            raise InferenceError("a mask is declared, but forward takes no mask argument",
                                 Remedy.to("mask", "KIND:LAYOUT@ARGUMENT",
                                           "name the argument it is passed through"))
        capabilities.set(mask=declared_mask)
        notes.append(Note(f"{argument}: {declared_mask.describe()} (declared)", topic=Topic.MASK))
    elif argument:
        causal = capabilities.caps.causality.kind == "always"
        search = infer_mask(inquiry.build(), own_queries(probe_case(heads, head_dim, causal=causal),
                                                         capabilities.caps),
                            plan.convention.call, plan.convention.mask_family, argument,
                            name_settles=plan.convention.mask_name_settles)
        if search.convention is None:
            capabilities.doubt(mask_problem=search.problem)
            notes.append(f"{argument}: no mask convention inferred (see padding)")
        else:
            capabilities.set(mask=search.convention)
            stated = replace(search.convention, argument=argument).spec()
            text = f"{argument}: {search.convention.describe()} (probed"
            remedy = Remedy.to("mask", stated, "state it")
            if search.assumed:
                capabilities.doubt(mask_assumed=search.assumed)
                text += f"; assumed, no convention works: {search.assumed})"
                remedy = Remedy.to("mask", stated, "state how it reads its mask, if otherwise")
            elif search.doubt:
                capabilities.doubt(mask_polarity=Note(search.doubt, Remedy.to(
                    "mask", stated, "hold it to this polarity, if that is intended")))
                text += "; doubtful, see padding)"
            elif plan.convention.mask_family == "either" and search.polarity_probed:
                text += (f"; the name allows either polarity and behaviour chose "
                         f"{BOOLEAN_POLARITY[search.convention.kind]}; if the other was meant, "
                         f"the module reads its mask inverted)")
                remedy = Remedy.to("mask", opposite_polarity(stated),
                                   "hold it to the other polarity, if that was meant")
            else:
                passed_over = search.passed_over()
                text += f"; {passed_over})" if passed_over else ")"
            notes.append(Note(text, remedy, Topic.MASK,
                              plain=f"{argument}: {search.convention.describe()}"))
            if not formats and right_padded(search.convention):
                probed = _other_lengths(inquiry, search.convention)
                if probed:
                    capabilities.set(mask_formats=probed)
    if formats:
        capabilities.set(mask_formats=formats)
        notes.append(f"{argument} also takes " + ", ".join(m.describe() for m in formats)
                     + " (declared)")


def _other_lengths(inquiry: Inquiry, found: MaskConvention) -> tuple[MaskConvention, ...]:
    """Valid lengths in their other shape ((B, Lq) beside (B,)), where the module takes that
    too as a mask (d2l's ``valid_lens`` takes both): ``mask_formats`` then holds the two to
    the same output. Said as probed."""
    other = replace(found, layout=next(layout for layout in LENGTH_LAYOUTS
                                       if layout is not found.layout))
    case = own_queries(probe_case(inquiry.heads, inquiry.head_dim), inquiry.capabilities.caps)
    if mask_behaviour(inquiry.build(), case, inquiry.plan.convention.call, other) is not None:
        return ()
    inquiry.notes.append(f"{inquiry.plan.convention.mask} also takes "
                         f"{other.describe()} (probed; mask_formats holds the two to one output)")
    return (other,)


def opposite_polarity(spec: str) -> str:
    """The declaration with the other boolean polarity."""
    return (spec.replace("ignore_bool", "keep_bool") if spec.startswith("ignore_bool")
            else spec.replace("keep_bool", "ignore_bool"))
