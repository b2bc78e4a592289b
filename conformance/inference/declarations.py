"""Declarations that override inference, item by item: CLI flags, ``[tool.attention-conformance]``
in the user's ``pyproject.toml``, or the Python API.

Spellings (the same in flags and TOML):

- ``call``: ``self`` or ``qkv``
- ``mask``: ``KIND:LAYOUT`` with KIND ``keep_int | keep_bool | ignore_bool | additive`` and
  LAYOUT ``key_padding | broadcast | per_query | per_head``, e.g. ``keep_int:broadcast``
- ``causal``: ``never``, ``always``, or ``optional`` (through ``forward``'s causal argument)
- ``mask`` may name the keyword it is passed as: ``KIND:LAYOUT@ARGUMENT``, e.g.
  ``additive:per_head@attn_bias`` (KIND also ``keep_float``, ``additive_min``; LAYOUT also
  ``per_query_broadcast``, ``shared``)
- ``width-arg``, ``heads-arg``, ``head-dim-arg``: the constructor arguments for the model width,
  the head count and each head's width
- ``weights``: ``q,k,v[,o]`` submodule names, ``fused:qkv[,o]``, ``packed[:path]``, or ``none``
- ``init``: constructor keywords, ``NAME=VALUE`` (flags, repeatable) or a table (TOML), e.g.
  ``causal=True``; values are Python literals
- ``mask-formats``: other mask formats it accepts, ``KIND:LAYOUT`` (repeatable / a list)
- ``sequence-first``: ``true`` when forward takes (length, batch, width) inputs
- ``dtypes``: the dtypes it supports, e.g. ``float32,float64`` (without it, float16 and
  bfloat16 are assumed too, and what breaks there is a warning)
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from conformance.spec import MaskConvention, MaskKind, MaskLayout
from conformance.weights import (
    FusedProjection,
    PackedInProjection,
    SeparateProjections,
    WeightLayout,
)


class DeclarationError(Exception):
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

    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    def mask_convention(self, argument: str) -> MaskConvention | None:
        """The declared mask, passed as ``argument`` (the suite's wrapper's keyword)."""
        if self.mask is None:
            return None
        spec, _, _ = self.mask.partition("@")
        kind, _, layout = spec.partition(":")
        try:
            return MaskConvention(MaskKind(kind), MaskLayout(layout or "broadcast"), argument)
        except ValueError:
            raise DeclarationError(
                f"mask {self.mask!r}: use KIND:LAYOUT[@ARGUMENT], KIND one of "
                f"{', '.join(k.value for k in MaskKind)}, LAYOUT one of "
                f"{', '.join(layout.value for layout in MaskLayout)}") from None

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

    def declares_sequence_first(self) -> bool | None:
        if self.sequence_first is None:
            return None
        return str(self.sequence_first).lower() in ("true", "1", "yes")

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


def from_pyproject(spec: str, directory: Path | None = None) -> Declarations:
    """``[tool.attention-conformance.declare."IMPL"]`` from ``pyproject.toml`` in ``directory``."""
    from conformance.expectations import tomllib

    path = (directory or Path.cwd()) / "pyproject.toml"
    if not path.is_file():
        return Declarations()
    with path.open("rb") as handle:
        table = tomllib.load(handle).get("tool", {}).get("attention-conformance", {})
    declared = table.get("declare", {}).get(spec)
    return from_mapping(declared, f"{path}: [tool.attention-conformance.declare.\"{spec}\"]") \
        if declared else Declarations()
