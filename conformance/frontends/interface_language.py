"""The suite's advice in the language of the interface in use.

Checks and inference write their advice as the command line spells it (``declare --causal
always``, ``--mask keep_bool:key_padding@mask``, ``--strict``). Under pytest the same
declaration is an option, ``--attention-declare causal=always``; in a test file it is an
argument, ``declare={"causal": "always"}``. :func:`spoken` rewrites each flag of the command
line's declarations (and ``--strict``) into one of those, leaving everything else as written.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Literal

from conformance.model.results import CheckResult

Interface = Literal["cli", "pytest", "python"]

DECLARATIONS = (
    "call", "mask", "causal", "width-arg", "heads-arg", "head-dim-arg", "sequence-first",
    "batch-first", "returns", "layout", "causal-alignment", "kv-grouping", "padded-queries",
    "output-projection", "rope", "dtypes", "weights", "init", "mask-format", "kv-heads-arg", "window-arg",
    "positions", "position-encoding", "alibi", "kv-cache", "packed", "constructor",
)
"""The command line's declaration flags (``attention-conformance check --help``)."""

_SWITCHES = {"sequence-first", "batch-first"}
"""Declarations given without a value (true when present)."""

_TOML_NAMES = {"mask-format": "mask-formats"}
"""Where the TOML and API spelling of a declaration differs from its flag."""

_CHOICES = {"self", "qkv", "never", "always", "optional", "tensor", "tuple", "bhld", "blhd",
            "interleaved", "tiled", "zero", "any", "bottom-right", "top-left", "applied",
            "rotary", "alibi", "none", "standard", "measured", "keyword", "positional", "true", "half"}
"""Declaration values that are plain words (the others hold a ``:``, ``,``, ``=``, ``@``, a dot
or a digit): what tells ``--causal always`` from ``--dtypes to make them part``."""

_VALUE = (r"(?:[ =](?P<value>" + "|".join(sorted(_CHOICES, key=len, reverse=True))
          + r"(?![\w:,=@./])|[\w.-]*[:,=@./0-9](?:[^\s;,)]|,(?!\s))*))?")
_FLAG = re.compile(r"(?:\bdeclare(?: it)?(?: with)?:? )?(?<![\w-])--(?P<name>"
                   + "|".join(sorted(DECLARATIONS, key=len, reverse=True))
                   + r")(?![\w-])" + _VALUE)
_STRICT = re.compile(r"(?<![\w-])--strict(?![\w-])")


def _declaration(match: re.Match, interface: Interface) -> str:
    name, value = match["name"], match["value"]
    if name in _SWITCHES:
        value = "true"
    if value is None:  # a flag named without its value: name the declaration
        return (f"--attention-declare {_TOML_NAMES.get(name, name)}=..." if interface == "pytest"
                else f'declare={{"{_TOML_NAMES.get(name, name)}": ...}}')
    key = _TOML_NAMES.get(name, name)
    tail = "." if value.endswith(".") else ""  # a sentence's full stop, not the value's
    value = value.removesuffix(".")
    if interface == "pytest":
        return f"--attention-declare {key}={value}{tail}"
    return f'declare={{"{key}": "{value}"}}{tail}'


def spoken(text: str | None, interface: Interface) -> str | None:
    """``text`` with the command line's declaration flags written for ``interface``."""
    if not text or interface == "cli":
        return text
    text = _FLAG.sub(lambda match: _declaration(match, interface), text)
    return _STRICT.sub("--attention-strict" if interface == "pytest" else "strict=True", text)


def spoken_result(result: CheckResult, interface: Interface) -> CheckResult:
    """``result`` with its reason, hint, details and observations written for ``interface``."""
    if interface == "cli":
        return result
    return replace(result, reason=spoken(result.reason, interface),
                   hint=spoken(result.hint, interface),
                   details=[spoken(detail, interface) or "" for detail in result.details],
                   observations=[spoken(note, interface) or "" for note in result.observations])
