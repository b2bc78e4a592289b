"""Declarations that override inference, item by item: CLI flags, ``[tool.attention-conformance]``
in the user's ``pyproject.toml``, or the Python API.

Spellings (the same in flags and TOML):

- ``call``: ``self`` or ``qkv``
- ``mask``: ``KIND:LAYOUT`` with KIND ``keep_int | keep_bool | ignore_bool | additive`` and
  LAYOUT ``key_padding | broadcast | per_query | per_head``, e.g. ``keep_int:broadcast``
- ``causal``: ``never``, ``always``, or ``optional`` (through ``forward``'s causal argument)
- ``mask`` may name the keyword it is passed as: ``KIND:LAYOUT@ARGUMENT``, e.g.
  ``additive:per_head@attn_bias`` (KIND also ``keep_int32``, ``keep_float``, ``additive_min``;
  LAYOUT also ``per_query_broadcast``, ``shared``)
- ``width-arg``, ``heads-arg``, ``head-dim-arg``: the constructor arguments for the model width,
  the head count and each head's width
- ``weights``: ``q,k,v[,o]`` submodule names, ``fused:qkv[,o]``, ``packed[:path]``, or ``none``
- ``init``: constructor keywords, ``NAME=VALUE`` (flags, repeatable) or a table (TOML), e.g.
  ``causal=True``; values are Python literals
- ``mask-formats``: other mask formats it accepts, ``KIND:LAYOUT`` (repeatable / a list)
- ``sequence-first``: ``true`` when forward takes (length, batch, width) inputs
- ``dtypes``: the dtypes it supports, e.g. ``float32,float64`` (without it, float16 and
  bfloat16 are assumed too, and what breaks there is a warning)
- ``kv-heads-arg``: the constructor argument for the key/value heads (grouped-query attention)
- ``window-arg``: the constructor argument for a causal sliding window, ``NAME[:keys|left]``:
  ``keys`` when it counts the keys a row sees, itself included (HuggingFace's
  ``sliding_window``), ``left`` when it counts the keys before the row (FlashAttention's
  ``window_size=(left, 0)``)
- ``positions``: the forward argument for token positions, ``NAME[:ids|vector|start]``
  ((B, L) int64, (L,) int64, or the first position as an int)
- ``position-encoding``: ``rotary``, ``alibi`` or ``none`` (what names suggested, overridden)
- ``alibi``: ``standard`` (the paper's slopes are promised) or ``measured`` (any positive slopes)
- ``constructor``: ``keyword`` (the default: ``Class(d_model=..., num_heads=...)``) or
  ``positional`` (``Class(d_model, num_heads)``: the width, then the head count, by position)
- ``kv-cache``: ``STYLE@ARG[=module:Class]`` with STYLE ``returned`` (past in, present in the
  output tuple), ``buffers`` (ARG is the start position into buffers the module keeps) or
  ``object`` (a cache object built by ``module:Class()`` and updated in place); ``none``
- ``packed``: ``cu_seqlens@ARG`` (tokens (1, T, D)), ``cu_seqlens_flat@ARG`` (tokens (T, D)),
  or ``mask`` (a block-diagonal mask through the mask argument)
- ``batch-first``: ``true`` when forward takes (batch, length, width) inputs (the opposite of
  ``sequence-first``; a module that mixes batch elements then fails instead of being read
  sequence-first)
- ``returns``: ``tensor`` (forward returns one tensor; a tuple is a contract failure) or
  ``tuple`` (its first element is the output)
- ``layout``: ``bhld`` or ``blhd``, the axes of a core function's q, k, v and output
- ``causal-alignment``: ``bottom-right`` or ``top-left``, where a kernel's ``causal=True`` puts
  the diagonal with fewer queries than keys (measured where not declared; a declared one is
  the kernel's contract, which ``kernel`` holds it to)
- ``kv-grouping``: ``interleaved`` (query head h reads key/value head h // G: HuggingFace's
  ``repeat_kv``, SDPA's ``enable_gqa``) or ``tiled`` (h mod Hkv: ``repeat``)
- ``padded-queries``: what a self-attention module outputs at a padded query position:
  ``zero``, ``self`` (it attends to itself alone), or ``any`` (as every other row);
  unspecified (not judged) unless declared
- ``rope``: ``PAIRING[:THETA[:FRACTION]]``, RoPE as the module is meant to apply it, e.g.
  ``half:10000`` or ``interleaved:500000:0.5``
"""

from __future__ import annotations

import ast
import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from conformance._compat import tomllib
from conformance.errors import ConformanceError
from conformance.model.declared_layouts import FusedProjection, PackedInProjection, SeparateProjections
from conformance.model.forms import (
    QUERY_AXIS_LAYOUTS,
    CacheStyle,
    MaskConvention,
    MaskKind,
    MaskLayout,
    PackedForm,
    PositionForm,
)
from conformance.model.weights import WeightLayout


class DeclarationError(ConformanceError):
    """A declaration that can't be read; one line."""


@dataclass(frozen=True)
class Declarations:
    """What the user declared; ``None`` leaves the item to inference."""

    call: str | None = None
    mask: str | None = None
    causal: str | None = None
    width_arg: str | None = None
    heads_arg: str | None = None
    head_dim_arg: str | None = None
    weights: str | None = None
    init: tuple[tuple[str, object], ...] | None = None
    mask_formats: tuple[str, ...] | None = None
    sequence_first: str | None = None
    dtypes: str | None = None
    kv_heads_arg: str | None = None
    window_arg: str | None = None
    positions: str | None = None
    position_encoding: str | None = None
    alibi: str | None = None
    kv_cache: str | None = None
    packed: str | None = None
    batch_first: str | None = None
    returns: str | None = None
    layout: str | None = None
    causal_alignment: str | None = None
    kv_grouping: str | None = None
    padded_queries: str | None = None
    rope: str | None = None
    output_projection: str | None = None
    constructor: str | None = None

    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

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


def from_mapping(values: dict, origin: str) -> Declarations:
    """Declarations from a TOML table or parsed flags (dashes or underscores)."""
    known = {f.name for f in fields(Declarations)}
    items = {key.replace("-", "_"): value for key, value in values.items()}
    unknown = sorted(set(items) - known)
    if unknown:
        raise DeclarationError(f"{origin}: unknown declaration(s) {unknown}; known: "
                               f"{', '.join(sorted(k.replace('_', '-') for k in known))}")
    values = {}
    for key, value in items.items():
        if key == "init":
            pairs = value.items() if isinstance(value, dict) else (
                parse_init(item) for item in value)
            values[key] = tuple(pairs)
        elif key == "mask_formats":
            values[key] = tuple([value] if isinstance(value, str) else value)
        elif key == "dtypes" and not isinstance(value, str):
            values[key] = ",".join(value)
        else:
            values[key] = str(value)
    return Declarations(**values)


def parse_init(item: str) -> tuple[str, object]:
    """``NAME=VALUE`` with VALUE a Python literal (a bare word stays a string)."""
    name, equals, text = item.partition("=")
    if not equals or not name.isidentifier():
        raise DeclarationError(f"init {item!r}: use NAME=VALUE, e.g. causal=True")
    try:
        return name, ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return name, text


def pyproject(directory: Path | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` in ``directory`` (default: the current one) or above it."""
    start = (directory or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    return None


def from_pyproject(spec: str | Sequence[str], directory: Path | None = None) -> Declarations:
    """``[tool.attention-conformance.declare."IMPL"]`` from the nearest ``pyproject.toml`` (see
    :func:`pyproject`); ``spec`` may be several spellings of one implementation, the first
    declared one is used."""
    path = pyproject(directory)
    if path is None:
        return Declarations()
    with path.open("rb") as handle:
        try:
            table = tomllib.load(handle).get("tool", {}).get("attention-conformance", {})
        except tomllib.TOMLDecodeError as error:
            raise DeclarationError(f"{path} is not valid TOML: {error}") from None
    tables = table.get("declare", {})
    for name in [spec] if isinstance(spec, str) else spec:
        declared = tables.get(name)
        if declared:
            return from_mapping(declared,
                                f"{path}: [tool.attention-conformance.declare.\"{name}\"]")
    return Declarations()


def spellings(obj: object, directory: Path | None = None) -> list[str]:
    """How ``pyproject.toml`` may name a class or function: ``package.module:Name``, the file
    relative to the ``pyproject.toml`` (``src/attention.py::Name``), or ``Name`` alone."""
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    module = getattr(obj, "__module__", None) or type(obj).__module__
    found = [f"{module}:{name}"]
    source = getattr(sys.modules.get(module), "__file__", None)
    path = pyproject(directory)
    if source and path is not None:
        with contextlib.suppress(ValueError):
            found.append(f"{Path(source).resolve().relative_to(path.parent).as_posix()}::{name}")
    return [*found, name]
