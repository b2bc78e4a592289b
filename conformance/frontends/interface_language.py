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

from conformance.model.declaration_specs import BY_NAME, SPECS, Form
from conformance.model.remedies import Remedy
from conformance.model.results import CheckResult

Interface = Literal["cli", "pytest", "python"]

DECLARATIONS = tuple(spec.flag.removeprefix("--") for spec in SPECS)
"""The command line's declaration flags (the table of declarations)."""

_SWITCHES = {spec.flag.removeprefix("--") for spec in SPECS if spec.form is Form.SWITCH}
"""Declarations given without a value (true when present)."""

_TOML_NAMES = {spec.flag.removeprefix("--"): spec.key for spec in SPECS
               if spec.flag != f"--{spec.key}"}
"""Where the TOML and API spelling of a declaration differs from its flag."""

_CHOICES = {choice for spec in SPECS for choice in spec.choices} | {"true", "none", "half"}
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


def remedy_words(remedy: Remedy, interface: Interface) -> str:
    """``remedy`` as ``interface`` says a declaration: ``--kv-grouping tiled`` (the command
    line), ``--attention-declare kv-grouping=tiled`` (pytest), ``declare={"kv-grouping":
    "tiled"}`` (a test file), each with what it means."""
    said = []
    for option in remedy.options:
        spec = BY_NAME[option.declaration]
        if interface == "cli":
            written = spec.flag if spec.form is Form.SWITCH else f"{spec.flag} {option.value}"
        elif interface == "pytest":
            written = f"--attention-declare {spec.key}={option.value}"
        else:
            written = f'declare={{"{spec.key}": "{option.value}"}}'
        said.append(f"{written} to {option.means}")
    return "declare " + ", or ".join(said)
