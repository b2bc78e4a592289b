"""Expected-failures files: ``[implementation]`` tables of ``check = "reason"`` (TOML).

The bundled implementations keep theirs in ``conformance/implementations/expected_results.toml``; a user
passes one with ``--expected-failures FILE`` (CLI) or ``--attention-xfails FILE`` (pytest), like
array-api-tests' xfails file. An expected failure that passes fails the run (strict).

Known warnings go in a ``[implementation.warnings]`` table of the same form: a warning never
fails a run, but under ``--strict`` the listed ones are expected failures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from conformance._compat import tomllib
from conformance.errors import ConformanceError
from conformance.model.check_names import CHECK_NAMES, unknown_checks
from conformance.model.spec import Implementation


class ExpectationsError(ConformanceError):
    """An expected-failures file that can't be used; one line."""


WARNINGS = "warnings"
"""The sub-table of an implementation's table that lists its expected warnings."""


def _checks(table: dict, where: str, path: str | Path) -> dict[str, str]:
    unknown = sorted(set(table) - set(CHECK_NAMES))
    if unknown:
        raise ExpectationsError(f"{path}: [{where}] names unknown check(s) {unknown}: "
                                f"{unknown_checks(unknown)}")
    return {check: str(reason) for check, reason in table.items()}


def load_all(path: str | Path) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """``({implementation: {check: reason}}`` expected failures, the same for expected warnings)
    from a TOML file."""
    try:
        with Path(path).open("rb") as handle:
            tables = tomllib.load(handle)
    except FileNotFoundError as error:
        raise ExpectationsError(f"no expected-failures file {path}") from error
    except tomllib.TOMLDecodeError as error:
        raise ExpectationsError(f"{path} is not valid TOML: {error}") from error
    failures: dict[str, dict[str, str]] = {}
    warnings: dict[str, dict[str, str]] = {}
    for name, checks in tables.items():
        if not isinstance(checks, dict):
            raise ExpectationsError(f"{path}: [{name}] must be a table of check = \"reason\"")
        checks = dict(checks)
        warned = checks.pop(WARNINGS, None)
        if warned is not None:
            if not isinstance(warned, dict):
                raise ExpectationsError(f"{path}: [{name}.{WARNINGS}] must be a table of "
                                        "check = \"reason\"")
            warnings[name] = _checks(warned, f"{name}.{WARNINGS}", path)
        if checks or warned is None:
            failures[name] = _checks(checks, name, path)
    return failures, warnings


def load(path: str | Path) -> dict[str, dict[str, str]]:
    """``{implementation: {check: reason}}`` expected failures from a TOML file."""
    return load_all(path)[0]


def apply(implementations: Iterable[Implementation],
          expected: Mapping[str, Mapping[str, str]],
          warnings: Mapping[str, Mapping[str, str]] | None = None) -> list[Implementation]:
    """The implementations with their expected failures (and warnings) added."""
    warnings = warnings or {}
    return [replace(impl,
                    expected_failures={**impl.expected_failures, **expected.get(impl.name, {})},
                    expected_warnings={**impl.expected_warnings, **warnings.get(impl.name, {})})
            for impl in implementations]
