"""Capabilities' families as records: each checks itself with the one line Implementation always
raised, the flat keywords of before build the same value with a DeprecationWarning naming the
new form, and the groups cross the worker boundary with their defaults and tuples."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

from conformance import (
    CacheForm,
    CacheStyle,
    Capabilities,
    CausalForm,
    Dtypes,
    Implementation,
    PackedForm,
    Packing,
    PositionEncoding,
    PositionForm,
    Positions,
    Rotary,
)
from conformance.inference.found import CapabilitiesFound
from conformance.model.capability_groups import FLAT, GROUPS, laid_over
from conformance.model.forms import CacheLayout
from conformance.model.mask_forms import MaskConvention, MaskKind, MaskLayout
from conformance.worker import decode, encode

KEEP_INT_PADDING = MaskConvention(MaskKind.KEEP_INT, MaskLayout.KEY_PADDING)


def _implementation(**capabilities: object) -> Implementation:
    return Implementation("layer", lambda config: None, Capabilities(**capabilities))


@pytest.mark.parametrize(("record", "context", "message"), [
    (CacheForm(style=CacheStyle.RETURNED), ("always", "self"),
     "layer: a KV cache needs cache_argument, and causal attention unless it caches a "
     "cross-attention's context"),
    (CacheForm(style=CacheStyle.RETURNED, argument="past"), ("never", "self"),
     "layer: a KV cache needs cache_argument"),
    (CacheForm(layout=CacheLayout.BHLD), ("always", "self"),
     "layer: cache_layout is the form of a returned cache"),
    (CacheForm(style=CacheStyle.OBJECT, argument="cache"), ("always", "self"),
     r"layer: an object cache needs cache_factory \('module:Class'\)"),
])
def test_a_cache_form_checks_itself(record, context, message):
    with pytest.raises(ValueError, match=message) as raised:
        record.check("layer", *context)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match=message):
        _implementation(causality=CausalForm(context[0]), cache=record)
    CacheForm(style=CacheStyle.RETURNED, argument="past").check("layer", "never", "cross")


@pytest.mark.parametrize(("record", "masked", "message"), [
    (Packing(form=PackedForm.CU_SEQLENS), False, "layer: cu_seqlens packing needs packed_argument"),
    (Packing(form=PackedForm.CU_SEQLENS_FLAT), True, "layer: cu_seqlens packing needs packed_argument"),
    (Packing(form=PackedForm.MASK), False, "layer: packing through a mask needs a declared mask"),
])
def test_a_packing_checks_itself(record, masked, message):
    with pytest.raises(ValueError, match=message) as raised:
        record.check("layer", masked)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match=message):
        _implementation(packing=record, mask=KEEP_INT_PADDING if masked else None)
    Packing(form=PackedForm.MASK).check("layer", True)


def test_a_causal_form_checks_itself():
    message = "layer: causal='optional' needs causal_argument"
    with pytest.raises(ValueError, match=message):
        CausalForm("optional").check("layer")
    with pytest.raises(ValueError, match=message):
        _implementation(causality=CausalForm("optional"))
    CausalForm("optional", "is_causal").check("layer")


def test_positions_check_themselves():
    message = "layer: positions needs position_form"
    with pytest.raises(ValueError, match=message):
        Positions(argument="position_ids").check("layer")
    with pytest.raises(ValueError, match=message):
        _implementation(position=Positions(argument="position_ids"))
    Positions(argument="position_ids", form=PositionForm.IDS).check("layer")


OLD_AND_NEW = [
    (dict(causality=CausalForm("always"), kv_cache=CacheStyle.OBJECT, cache_argument="cache",
          cache_options=(("use_cache", True),), cache_factory="pkg.cache:KV", max_batch=4),
     dict(causality=CausalForm("always"), cache=CacheForm(style=CacheStyle.OBJECT, argument="cache",
                                           options=(("use_cache", True),),
                                           factory="pkg.cache:KV", max_batch=4))),
    (dict(causality=CausalForm("always"), kv_cache=CacheStyle.RETURNED, cache_argument="past",
          cache_layout=CacheLayout.BLHD),
     dict(causality=CausalForm("always"), cache=CacheForm(style=CacheStyle.RETURNED, argument="past",
                                           layout=CacheLayout.BLHD))),
    (dict(packed=PackedForm.CU_SEQLENS, packed_argument="cu", max_seqlen_argument="longest"),
     dict(packing=Packing(form=PackedForm.CU_SEQLENS, argument="cu",
                          max_seqlen_argument="longest"))),
    (dict(causal="optional", causal_argument="is_causal"),
     dict(causality=CausalForm(kind="optional", argument="is_causal"))),
    (dict(causal="always"), dict(causality=CausalForm("always"))),
    (dict(positional="RoPE (declared)", positions="position_ids", position_form=PositionForm.IDS,
          relative="rotary", encoding=PositionEncoding(rotary=Rotary("half", 10000.0)),
          alibi="measured"),
     dict(position=Positions(positional="RoPE (declared)", argument="position_ids",
                             form=PositionForm.IDS, relative="rotary",
                             encoding=PositionEncoding(rotary=Rotary("half", 10000.0)),
                             alibi="measured"))),
    (dict(dtypes=(torch.float16, torch.float32), assumed_dtypes=(torch.float16,),
          probed_dtypes=(torch.float32,)),
     dict(floats=Dtypes(supported=(torch.float16, torch.float32), assumed=(torch.float16,),
                        probed=(torch.float32,)))),
]


@pytest.mark.parametrize(("old", "new"), OLD_AND_NEW)
def test_the_flat_keywords_build_the_groups_and_warn_naming_the_new_form(old, new):
    with pytest.warns(DeprecationWarning) as caught:
        built = Capabilities(**old)
    assert built == Capabilities(**new)
    flat = [name for name in old if name in FLAT]
    said = [str(w.message) for w in caught]
    for name in flat:
        group, field = FLAT[name]
        assert (f"Capabilities({name}=...) is deprecated: use "
                f"Capabilities({group}={GROUPS[group].__name__}({field}=...))") in said
    assert len(said) == len(flat)
    assert caught[0].filename == __file__  # said where the keyword was written


@pytest.mark.parametrize(("old", "new"), OLD_AND_NEW)
def test_the_flat_names_read_the_groups_with_the_warning(old, new):
    caps = Capabilities(**new)
    for name in (n for n in old if n in FLAT):
        group, field = FLAT[name]
        with pytest.warns(DeprecationWarning,
                          match=rf"Capabilities\.{name} is deprecated: use "
                                rf"Capabilities\.{group}\.{field}"):
            assert getattr(caps, name) == getattr(getattr(caps, group), field)


def test_a_flat_keyword_replaces_one_field_of_the_group():
    caps = Capabilities(causality=CausalForm("always"),
                        cache=CacheForm(style=CacheStyle.RETURNED, argument="past"))
    with pytest.warns(DeprecationWarning, match=r"use Capabilities\(cache=CacheForm\(max_batch"):
        changed = replace(caps, max_batch=8)
    assert changed.cache == CacheForm(style=CacheStyle.RETURNED, argument="past", max_batch=8)
    assert replace(caps, cache=replace(caps.cache, max_batch=8)) == changed


def test_the_new_form_warns_nothing_and_describes_as_before():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        caps = Capabilities(causality=CausalForm("always"), cache=CacheForm(
            style=CacheStyle.RETURNED, argument="past", layout=CacheLayout.BHLD),
            packing=Packing(form=PackedForm.CU_SEQLENS, argument="cu"),
            position=Positions(relative="alibi"))
        described = caps.describe()
    assert described == ("self-attention f(x[, mask]); no mask; always causal; ALiBi; KV cache "
                         "(returned through past, (k, v) each bhld); packed sequences (cu_seqlens); "
                         "no weight access")


def test_the_groups_cross_the_worker_boundary_with_defaults_and_tuples():
    caps = Capabilities(causality=CausalForm("always"), floats=Dtypes((torch.float16,)), cache=CacheForm(
        style=CacheStyle.OBJECT, argument="cache", options=(("use_cache", True), ("n", 2)),
        factory="pkg:KV", max_batch=3), packing=Packing(form=PackedForm.MASK))
    for value in (caps, Capabilities()):
        tensors: list[torch.Tensor] = []
        back = decode(encode(value, tensors), Capabilities, tensors)
        assert back == value
        assert isinstance(back.cache.options, tuple) and isinstance(back.packing, Packing)
    data = encode(Capabilities(), [])
    del data["cache"]  # a sender that leaves a group out: the record's defaults
    assert decode(data, Capabilities, []).cache == CacheForm()


def test_inference_sets_a_groups_fields_over_the_plans_defaults_field_by_field():
    found = CapabilitiesFound()
    found.set(cache={"style": CacheStyle.RETURNED, "argument": "past"}, window="config")
    found.set(cache={"layout": CacheLayout.BHLD})
    assert found.caps.cache == CacheForm(style=CacheStyle.RETURNED, argument="past",
                                         layout=CacheLayout.BHLD)
    given = found.given(packing={"form": PackedForm.MASK})
    assert given == {"cache": {"style": CacheStyle.RETURNED, "argument": "past",
                               "layout": CacheLayout.BHLD},
                     "window": "config", "packing": {"form": PackedForm.MASK}}
    laid = laid_over({"cache": CacheForm(max_batch=8)}, given)
    assert laid["cache"] == CacheForm(style=CacheStyle.RETURNED, argument="past",
                                      layout=CacheLayout.BHLD, max_batch=8)
    assert laid["packing"] == Packing(form=PackedForm.MASK)
