"""The families of :class:`~conformance.model.spec.Capabilities`, each a small frozen record
that checks itself, and the flat keywords they replace.

``Capabilities(cache=CacheForm(style=CacheStyle.RETURNED, argument="past"))`` is how a KV cache
is declared; the flat keywords an implementation's registration used before the families were
grouped (``Capabilities(kv_cache=..., cache_argument=...)``) still build the same value, mapped
onto the groups by :data:`FLAT`, with a DeprecationWarning naming the new form, and so does
reading them (``caps.cache_argument``). A record's ``check`` raises ValueError with the one line
:class:`~conformance.model.spec.Implementation` always raised (its name first), at the moment it
always did: when the implementation is made, not when the record is.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch

from conformance.model.forms import (
    AlibiSlopes,
    CacheLayout,
    CacheStyle,
    PackedForm,
    PositionEncoding,
    PositionForm,
    RelativeEncoding,
)

DEFAULT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)

Causality = Literal["never", "always", "optional"]
"""Whether the implementation masks the future: never, always, or when asked through an argument."""


@dataclass(frozen=True)
class CausalForm:
    """Whether it masks the future, and how it is asked to.

    Attributes:
        kind: never, always, or when asked (see Causality).
        argument: the keyword that turns causality on, when ``kind == "optional"``.
    """

    kind: Causality = "never"
    argument: str | None = None

    def check(self, name: str) -> None:
        """Raise ValueError where optional causality names no argument."""
        if self.kind == "optional" and not self.argument:
            raise ValueError(f"{name}: causal='optional' needs causal_argument")


@dataclass(frozen=True)
class CacheForm:
    """How a KV cache is handed over between decoding calls.

    Attributes:
        style: how (see CacheStyle), or ``None`` when it keeps none.
        argument: the keyword that takes it (the start position for ``buffers``).
        options: keywords a cached call adds (``use_cache=True``).
        factory: ``"module:Class"`` building a fresh cache object for ``object``.
        layout: the form a returned cache must have (see CacheLayout), where one was declared
            (a cache in another form fails kv_cache).
        max_batch: the largest batch it takes (a preallocated cache's ``max_batch_size``).
    """

    style: CacheStyle | None = None
    argument: str | None = None
    options: tuple[tuple[str, object], ...] = ()
    factory: str | None = None
    layout: CacheLayout | None = None
    max_batch: int | None = None

    def check(self, name: str, causal: str, call: str) -> None:
        """Raise ValueError where the cache cannot be used as declared (``causal`` and ``call``:
        the implementation's causality and call convention)."""
        if (self.style is not None and not self.argument) or (
                self.style is not None and causal == "never" and call != "cross"):
            raise ValueError(f"{name}: a KV cache needs cache_argument, and causal "
                             "attention unless it caches a cross-attention's context")
        if self.layout is not None and self.style is not CacheStyle.RETURNED:
            raise ValueError(f"{name}: cache_layout is the form of a returned cache")
        if self.style is CacheStyle.OBJECT and not self.factory:
            raise ValueError(f"{name}: an object cache needs cache_factory ('module:Class')")


@dataclass(frozen=True)
class Packing:
    """How packed variable-length sequences are passed.

    Attributes:
        form: how (see PackedForm), or ``None`` when it takes none.
        argument: the cu_seqlens keyword.
        max_seqlen_argument: the longest sequence's keyword.
    """

    form: PackedForm | None = None
    argument: str | None = None
    max_seqlen_argument: str | None = None

    def check(self, name: str, masked: bool) -> None:
        """Raise ValueError where packing cannot be used as declared (``masked``: whether a
        mask is declared)."""
        if self.form in (PackedForm.CU_SEQLENS, PackedForm.CU_SEQLENS_FLAT) and not self.argument:
            raise ValueError(f"{name}: cu_seqlens packing needs packed_argument")
        if self.form is PackedForm.MASK and not masked:
            raise ValueError(f"{name}: packing through a mask needs a declared mask")


@dataclass(frozen=True)
class Positions:
    """Where the tokens' positions matter, and how they are passed.

    Attributes:
        positional: a position encoding inside the module ("rotary", "alibi", "positions"),
            with its evidence; checks that assume position-free attention skip.
        argument: the forward keyword that takes token positions, and ``form`` how.
        form: how ``argument`` takes them (see PositionForm).
        relative: a relative position encoding inside ("rotary", "alibi"); ``position_shift``
            checks that shifting every position changes nothing.
        encoding: the relative position encoding the float64 reference applies for it (RoPE,
            ALiBi); where set, the checks that compare with the reference run (``positional``
            then only describes it).
        alibi: the ALiBi slopes it promises (see AlibiSlopes); ``alibi`` measures them.
    """

    positional: str | None = None
    argument: str | None = None
    form: PositionForm | None = None
    relative: RelativeEncoding | None = None
    encoding: PositionEncoding | None = None
    alibi: AlibiSlopes | None = None

    def check(self, name: str) -> None:
        """Raise ValueError where a positions argument says not how it takes them."""
        if self.argument and self.form is None:
            raise ValueError(f"{name}: positions needs position_form")


@dataclass(frozen=True)
class Dtypes:
    """The floating dtypes it runs in, and how each came to be listed: one record, so that the
    dtypes a device takes can join it (its own ``supported``, ``assumed`` and ``probed``) with no
    new flat fields beside it.

    Attributes:
        supported: the floating dtypes it supports.
        assumed: those of ``supported`` that inference assumed rather than anyone declared
            (float16 / bfloat16 for an undeclared module): what breaks there is a warning.
        probed: those of ``supported`` tried because nobody declared any (float32 and float64
            for an undeclared module): one the basic call raises in, where another runs, is a
            dtype it refuses; the gate drops it and says so, never a failure.
    """

    supported: tuple[torch.dtype, ...] = DEFAULT_DTYPES
    assumed: tuple[torch.dtype, ...] = ()
    probed: tuple[torch.dtype, ...] = ()


Group = CausalForm | CacheForm | Packing | Positions | Dtypes
"""A family's record."""

GROUPS: dict[str, type] = {"causality": CausalForm, "cache": CacheForm, "packing": Packing,
                           "position": Positions, "floats": Dtypes}
"""Capabilities' group fields and their records."""

FLAT: dict[str, tuple[str, str]] = {
    "causal": ("causality", "kind"),
    "causal_argument": ("causality", "argument"),
    "kv_cache": ("cache", "style"),
    "cache_argument": ("cache", "argument"),
    "cache_options": ("cache", "options"),
    "cache_factory": ("cache", "factory"),
    "cache_layout": ("cache", "layout"),
    "max_batch": ("cache", "max_batch"),
    "packed": ("packing", "form"),
    "packed_argument": ("packing", "argument"),
    "max_seqlen_argument": ("packing", "max_seqlen_argument"),
    "positional": ("position", "positional"),
    "positions": ("position", "argument"),
    "position_form": ("position", "form"),
    "relative": ("position", "relative"),
    "encoding": ("position", "encoding"),
    "alibi": ("position", "alibi"),
    "dtypes": ("floats", "supported"),
    "assumed_dtypes": ("floats", "assumed"),
    "probed_dtypes": ("floats", "probed"),
}
"""Each flat keyword Capabilities took before its family was grouped: (group, field)."""


def laid_over(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` over ``base`` (both Capabilities' keywords): a group given as a mapping of
    some of its fields changes those alone, over the group (or mapping) ``base`` has, or the
    record's defaults."""
    laid = dict(base)
    for name, value in changes.items():
        under = laid.get(name)
        if not isinstance(value, Mapping):
            laid[name] = value
        elif isinstance(under, Mapping):
            laid[name] = {**under, **value}
        else:
            laid[name] = replace(GROUPS[name]() if under is None else under, **value)
    return laid


def _deprecated(old: str) -> str:
    group, name = FLAT[old]
    return (f"Capabilities({old}=...) is deprecated: use "
            f"Capabilities({group}={GROUPS[group].__name__}({name}=...))")


def grouped(values: dict[str, Any], stacklevel: int) -> dict[str, Any]:
    """``values`` (Capabilities' keywords) with each flat one laid onto its group: over the
    group given beside it, or the record's defaults; each warns."""
    lifted: dict[str, dict[str, Any]] = {}
    for old in [key for key in values if key in FLAT]:
        warnings.warn(_deprecated(old), DeprecationWarning, stacklevel=stacklevel + 1)
        group, name = FLAT[old]
        lifted.setdefault(group, {})[name] = values.pop(old)
    for group, fields in lifted.items():
        values[group] = replace(values.get(group, GROUPS[group]()), **fields)
    return values


def flat_keywords(cls: type) -> type:
    """``cls`` (Capabilities) taking and reading the flat keywords of :data:`FLAT` too."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **values: Any) -> None:
        init(self, *args, **(grouped(values, stacklevel=2) if FLAT.keys() & values else values))

    cls.__init__ = __init__  # type: ignore[misc]
    for old in FLAT:
        setattr(cls, old, property(_reader(old), doc=_deprecated(old)))
    return cls


def _reader(old: str) -> Callable[[Any], Any]:
    group, name = FLAT[old]

    def read(self: Any) -> Any:
        warnings.warn(f"Capabilities.{old} is deprecated: use Capabilities.{group}.{name}",
                      DeprecationWarning, stacklevel=2)
        return getattr(getattr(self, group), name)

    return read


__all__ = ["DEFAULT_DTYPES", "FLAT", "GROUPS", "CacheForm", "CausalForm", "Causality", "Dtypes", "Group",
           "Packing", "Positions", "flat_keywords", "grouped", "laid_over"]
