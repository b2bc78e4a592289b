"""Expected-failures files: ``[implementation]`` tables of ``check = "reason"`` (TOML).

The bundled implementations keep theirs in ``implementations/expected_results.toml``; a user
passes one with ``--expected-failures FILE`` (CLI) or ``--attention-xfails FILE`` (pytest), like
array-api-tests' xfails file. An expected failure that passes fails the run (strict).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from conformance.spec import Implementation

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ExpectationsError(Exception):
    """An expected-failures file that can't be used; one line."""


def load(path: str | Path) -> dict[str, dict[str, str]]:
    """``{implementation: {check: reason}}`` from a TOML file."""
    from conformance.catalogue import CHECK_NAMES

    try:
        with Path(path).open("rb") as handle:
            tables = tomllib.load(handle)
    except FileNotFoundError as error:
        raise ExpectationsError(f"no expected-failures file {path}") from error
    except tomllib.TOMLDecodeError as error:
        raise ExpectationsError(f"{path} is not valid TOML: {error}") from error
    for name, checks in tables.items():
        if not isinstance(checks, dict):
            raise ExpectationsError(f"{path}: [{name}] must be a table of check = \"reason\"")
        unknown = sorted(set(checks) - set(CHECK_NAMES))
        if unknown:
            raise ExpectationsError(f"{path}: [{name}] names unknown check(s) {unknown}")
    return {name: {check: str(reason) for check, reason in checks.items()}
            for name, checks in tables.items()}


def apply(implementations: Iterable[Implementation],
          expected: Mapping[str, Mapping[str, str]]) -> list[Implementation]:
    """The implementations with their expected failures from ``expected`` added."""
    return [replace(impl, expected_failures={**impl.expected_failures,
                                             **expected.get(impl.name, {})})
            for impl in implementations]
