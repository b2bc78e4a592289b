"""Declarations that override inference, item by item: CLI flags, ``[tool.attention-conformance]``
in the user's ``pyproject.toml``, a rubric's ``interface``, or the Python API.

:class:`Declarations` holds what was declared, as written; its methods parse each item (one
line of DeclarationError where it does not parse). What each declaration means and how its value
is spelled is said once, in :mod:`conformance.model.declaration_specs` (the table the command
line, pytest, the TOML readers and the docs are made from); reading them from where users write
them is :mod:`conformance.model.declaration_sources`.
"""

from __future__ import annotations

from dataclasses import field, fields, make_dataclass

import torch

from conformance.errors import ConformanceError
from conformance.model.declaration_specs import SPECS, Form
from conformance.model.declared_layouts import FusedProjection, PackedInProjection, SeparateProjections
from conformance.model.forms import CacheLayout, CacheStyle, PackedForm, PositionForm
from conformance.model.mask_forms import (
    LENGTH_LAYOUTS,
    QUERY_AXIS_LAYOUTS,
    MaskConvention,
    MaskKind,
    MaskLayout,
)
from conformance.model.weights import WeightLayout


class DeclarationError(ConformanceError):
    """A declaration that can't be read; one line."""


_Declared = make_dataclass(
    "_Declared",
    [(spec.name, spec.value_type | None, field(default=None)) for spec in SPECS],
    frozen=True, kw_only=True)
"""One field per declaration of the table, ``None`` until declared (its value as written)."""
_Declared.__module__ = __name__  # where pickle and the docs find it


class Declarations(_Declared):
    """What the user declared, as written: a field for each declaration of
    :data:`~conformance.model.declaration_specs.SPECS` (``mask``, ``width_arg``, ...), given
    by keyword, ``None`` leaving the item to inference; the methods parse them."""

    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def layer_tables(self) -> dict[str, dict[str, object]]:
        """The declarations for the attention layers of each class inside a model (``layer``,
        CLASS:NAME=VALUE each), by class: ``{class: {name: value}}``, a repeatable
        declaration's values in a list."""
        repeated = {spec.name for spec in SPECS if spec.form is Form.REPEATED}
        known = {spec.name for spec in SPECS} - {"layer"}
        tables: dict[str, dict[str, object]] = {}
        for item in self.layer or ():
            cls, colon, rest = item.partition(":")
            name, equals, value = rest.partition("=")
            name = name.strip().replace("-", "_")
            if not (colon and equals and cls.isidentifier()) or name not in known:
                raise DeclarationError(
                    f"layer {item!r}: use CLASS:NAME=VALUE, e.g. LlamaAttention:kv-grouping="
                    "tiled, NAME one of the other declarations")
            table = tables.setdefault(cls, {})
            if name in repeated:
                table.setdefault(name, []).append(value)
            else:
                table[name] = value
        return tables

    def mask_convention(self, argument: str) -> MaskConvention | None:
        """The declared mask, passed as ``argument`` (the suite's wrapper's keyword)."""
        if self.mask is None:
            return None
        spec, _, _ = self.mask.partition("@")
        kind, _, layout = spec.partition(":")
        layout, plus, causal = layout.partition("+")
        try:
            if plus and causal != "causal":
                raise ValueError(causal)
            convention = MaskConvention(MaskKind(kind), MaskLayout(layout or "broadcast"),
                                        argument, carries_causality=bool(plus))
        except ValueError:
            raise DeclarationError(
                f"mask {self.mask!r}: use KIND:LAYOUT[+causal][@ARGUMENT], KIND one of "
                f"{', '.join(k.value for k in MaskKind)}, LAYOUT one of "
                f"{', '.join(layout.value for layout in MaskLayout)}; +causal when the module "
                "takes the mask as the whole mask, causality included") from None
        if convention.carries_causality and convention.layout not in QUERY_AXIS_LAYOUTS:
            raise DeclarationError(f"mask {self.mask!r}: only a layout with a query axis can "
                                   "carry causality")
        if (convention.kind is MaskKind.LENGTHS) != (convention.layout in LENGTH_LAYOUTS):
            raise DeclarationError(f"mask {self.mask!r}: valid lengths take the layouts "
                                   "per_sequence (B,) or per_row (B, Lq), and only they do")
        if convention.kind is MaskKind.LENGTHS and convention.carries_causality:
            raise DeclarationError(f"mask {self.mask!r}: valid lengths can't carry causality")
        return convention

    @property
    def mask_argument(self) -> str | None:
        """The forward keyword the declared mask is passed as (``@ARGUMENT``), if named."""
        if self.mask is None or "@" not in self.mask:
            return None
        argument = self.mask.partition("@")[2]
        if not argument.isidentifier():
            raise DeclarationError(f"mask {self.mask!r}: @{argument} is not an argument name")
        return argument

    def alternative_masks(self, argument: str) -> tuple[MaskConvention, ...]:
        return tuple(Declarations(mask=spec).mask_convention(argument)
                     for spec in self.mask_formats or ())

    def path_list(self) -> tuple[tuple[str, tuple[tuple[str, object], ...]], ...]:
        """The declared paths, as Capabilities' ``paths`` hold them: ``("need_weights=True",
        (("need_weights", True),))``; a value reads as a bool, an int, or else text."""
        found = []
        for text in self.paths or ():
            name, equals, value = text.partition("=")
            name = name.strip()
            if not equals or not name.isidentifier():
                raise DeclarationError(f"paths {text!r}: give NAME=VALUE, a forward keyword "
                                       "and the value that opens the path")
            found.append((f"{name}={value.strip()}", ((name, _value(value.strip())),)))
        return tuple(found)

    def dtype_list(self) -> tuple[torch.dtype, ...] | None:
        """The declared dtypes, or None."""
        if self.dtypes is None:
            return None
        names = [n.strip() for n in self.dtypes.split(",") if n.strip()]
        known = {"float32": torch.float32, "float64": torch.float64,
                 "float16": torch.float16, "bfloat16": torch.bfloat16}
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise DeclarationError(f"dtypes {self.dtypes!r}: give a comma-separated list of "
                                   f"{', '.join(known)}")
        return tuple(known[n] for n in names)

    def window(self) -> tuple[str, str] | None:
        """(argument, "keys" or "left"), or None."""
        if self.window_arg is None:
            return None
        name, _, convention = self.window_arg.partition(":")
        convention = convention or "keys"
        if not name.isidentifier() or convention not in ("keys", "left"):
            raise DeclarationError(f"window-arg {self.window_arg!r}: use NAME[:keys|left]")
        return name, convention

    def position_argument(self) -> tuple[str, PositionForm] | None:
        """(argument, form), or None."""
        if self.positions is None:
            return None
        name, _, form = self.positions.partition(":")
        try:
            return name, PositionForm(form or "ids")
        except ValueError:
            raise DeclarationError(f"positions {self.positions!r}: use NAME[:ids|vector|start]") \
                from None

    def declared_encoding(self) -> str | None:
        """``rotary``, ``alibi``, ``none``, or None (left to inference)."""
        if self.position_encoding not in (None, "rotary", "alibi", "none"):
            raise DeclarationError(f"position-encoding {self.position_encoding!r}: use rotary, "
                                   "alibi or none")
        if self.alibi not in (None, "standard", "measured"):
            raise DeclarationError(f"alibi {self.alibi!r}: use standard or measured")
        return self.position_encoding

    def cache(self) -> tuple[CacheStyle, str, str | None] | str | None:
        """(style, argument, factory), ``"none"``, or None (left to inference)."""
        if self.kv_cache is None or self.kv_cache == "none":
            return self.kv_cache
        style, _, rest = self.kv_cache.partition("@")
        argument, _, factory = rest.partition("=")
        try:
            parsed = CacheStyle(style)
        except ValueError:
            parsed = None
        if parsed is None or not argument.isidentifier() or (
                (parsed is CacheStyle.OBJECT) != bool(factory)) or (
                factory and ":" not in factory):
            raise DeclarationError(f"kv-cache {self.kv_cache!r}: use returned@ARG, buffers@ARG, "
                                   "object@ARG=module:Class or none")
        return parsed, argument, factory or None

    def cache_layout_form(self) -> CacheLayout | None:
        """The declared form of a returned cache, or None."""
        if self.cache_layout is None:
            return None
        try:
            layout = CacheLayout(self.cache_layout)
        except ValueError:
            raise DeclarationError(f"cache-layout {self.cache_layout!r}: use bhld, blhd or "
                                   "bld") from None
        cache = self.cache()
        if cache is not None and (cache == "none" or cache[0] is not CacheStyle.RETURNED):
            raise DeclarationError(f"cache-layout {self.cache_layout!r} is the form of a "
                                   "returned cache: declare kv-cache returned@ARG with it")
        return layout

    def packing(self) -> tuple[PackedForm, str | None] | None:
        """(form, cu_seqlens argument), or None."""
        if self.packed is None:
            return None
        form, _, argument = self.packed.partition("@")
        try:
            parsed = PackedForm(form)
        except ValueError:
            parsed = None
        if parsed is None or (parsed is PackedForm.MASK) == bool(argument) or (
                argument and not argument.isidentifier()):
            raise DeclarationError(f"packed {self.packed!r}: use cu_seqlens@ARG, "
                                   "cu_seqlens_flat@ARG or mask")
        return parsed, argument or None

    def declares_sequence_first(self) -> bool | None:
        """True for sequence-first, False for batch-first, None when neither is declared."""
        first = None if self.sequence_first is None else _truth(self.sequence_first)
        batch = None if self.batch_first is None else _truth(self.batch_first)
        if first is not None and batch is not None and first == batch:
            raise DeclarationError("sequence-first and batch-first contradict each other")
        return first if first is not None else (None if batch is None else not batch)

    def choice(self, name: str, options: tuple[str, ...]) -> str | None:
        """The declared value of ``name`` (one of ``options``), or None."""
        value = getattr(self, name)
        if value is not None and value not in options:
            raise DeclarationError(f"{name.replace('_', '-')} {value!r}: use "
                                   f"{', '.join(options)}")
        return value

    def rotary(self) -> tuple[str, float | None, float | None] | None:
        """(pairing, theta or None, fraction or None), or None."""
        if self.rope is None:
            return None
        pairing, _, rest = self.rope.partition(":")
        theta_text, _, fraction_text = rest.partition(":")
        try:
            theta = float(theta_text) if theta_text else None
            fraction = float(fraction_text) if fraction_text else None
        except ValueError:
            theta = fraction = -1.0
        if pairing not in ("half", "interleaved") or (theta is not None and theta <= 1) or (
                fraction is not None and not 0 < fraction <= 1):
            raise DeclarationError(f"rope {self.rope!r}: use PAIRING[:THETA[:FRACTION]], "
                                   "PAIRING half or interleaved, e.g. half:10000:0.25")
        return pairing, theta, fraction

    def weight_layout(self, prefix: str) -> WeightLayout | None:
        """The declared layout (paths under ``prefix``), None for ``none``."""
        spec = self.weights or ""
        if spec == "none":
            return None
        if spec.startswith("packed"):
            _, _, path = spec.partition(":")
            return PackedInProjection(f"{prefix}.{path}" if path else prefix)
        if spec.startswith("fused:"):
            names = [f"{prefix}.{n}" for n in spec.removeprefix("fused:").split(",")]
            return FusedProjection(names[0], names[1] if len(names) > 1 else None)
        names = [f"{prefix}.{n}" for n in spec.split(",")]
        if len(names) not in (3, 4):
            raise DeclarationError(f"weights {spec!r}: use q,k,v[,o], fused:qkv[,o], "
                                   "packed[:path] or none")
        return SeparateProjections(*names)


def _truth(value: object) -> bool:
    return str(value).lower() in ("true", "1", "yes")


def merged(base: Declarations, override: Declarations) -> Declarations:
    """``override``'s declared items over ``base``'s."""
    return Declarations(**{f.name: getattr(override, f.name) if getattr(override, f.name)
                           is not None else getattr(base, f.name) for f in fields(Declarations)})


def _value(text: str) -> object:
    """A declared keyword's value: true/false as bools, an integer as an int, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text
