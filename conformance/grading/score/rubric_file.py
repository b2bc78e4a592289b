"""Reading a rubric's TOML file (the format: :mod:`conformance.grading.score.rubric`) into a
:class:`~conformance.grading.score.rubric.Rubric`: every key checked, every problem one line
(:class:`~conformance.grading.score.rubric.RubricError`).
"""

from __future__ import annotations

import difflib
import math
from datetime import datetime, timezone
from pathlib import Path

from conformance._compat import tomllib
from conformance.generation.profiles import PROFILE_NAMES
from conformance.grading.score.rubric import (
    GATE,
    GRADING_DEVICES,
    VISIBILITIES,
    Item,
    Rubric,
    RubricError,
    RubricLimits,
    Target,
)
from conformance.model.check_names import CHECK_NAMES
from conformance.model.declaration_sources import from_mapping
from conformance.model.declarations import DeclarationError

_TOP = {"assignment", "limits", "targets"}
_ASSIGNMENT = {"name", "title", "due", "reference", "profile", "seed", "strict", "charge_once", "device",
               "github_classroom_prefix"}
_LIMITS = {"check_seconds", "submission_seconds", "memory_mb"}
_TARGET = {"class", "aliases", "interface", "items"}
_ITEM = {"check", "group", "checks", "points", "points_each", "cap", "requires", "visibility",
         "label"}


def load(path: str | Path) -> Rubric:
    """Parse and validate the rubric at ``path``. Raises RubricError (one line)."""
    path = Path(path)
    if not path.is_file():
        raise RubricError(f"no rubric file {path}")
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise RubricError(f"{path}: not valid TOML: {error}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RubricError(f"{path}: cannot read it: {error}") from None
    return parse(data, path)


def parse(data: dict, path: Path) -> Rubric:
    """Validate a rubric already read from TOML (``path`` names it in messages and anchors
    relative paths)."""
    where = str(path)
    _known_keys(data, _TOP, where)
    assignment = _table(data.get("assignment", {}), f"{where}: [assignment]")
    _known_keys(assignment, _ASSIGNMENT, f"{where}: [assignment]")
    profile = assignment.get("profile", "quick")
    if profile not in PROFILE_NAMES:
        raise RubricError(f"{where}: [assignment] profile {profile!r}: choose one of "
                          f"{', '.join(PROFILE_NAMES)}")
    seed = assignment.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise RubricError(f"{where}: [assignment] seed {seed!r}: give an integer")
    strict = assignment.get("strict", False)
    if not isinstance(strict, bool):
        raise RubricError(f"{where}: [assignment] strict {strict!r}: give true or false")
    charge_once = assignment.get("charge_once", True)
    if not isinstance(charge_once, bool):
        raise RubricError(f"{where}: [assignment] charge_once {charge_once!r}: give true or "
                          "false")
    device = assignment.get("device", "cpu")
    if device not in GRADING_DEVICES:
        raise RubricError(f"{where}: [assignment] device {device!r}: choose one of "
                          f"{', '.join(GRADING_DEVICES)}")
    due = assignment.get("due")
    if due is not None:
        due = _datetime(due, f"{where}: [assignment] due")
    reference = assignment.get("reference")
    if reference is not None:
        reference = (path.parent / str(reference)).resolve()
        if not reference.exists():
            raise RubricError(f"{where}: [assignment] reference {assignment['reference']!r}: "
                              f"no such file or folder ({reference})")
    limits = _limits(_table(data.get("limits", {}), f"{where}: [limits]"), where)

    raw_targets = data.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise RubricError(f"{where}: no [[targets]]: name at least one class to grade")
    targets = tuple(_target(raw, index, where) for index, raw in enumerate(raw_targets, 1))
    names = [name for target in targets for name in target.names]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise RubricError(f"{where}: class name(s) {', '.join(duplicated)} given to more than one "
                          "target")
    rubric = Rubric(path=path, name=str(assignment.get("name", path.stem)),
                    title=str(assignment.get("title", assignment.get("name", path.stem))),
                    due=due, reference=reference, profile=profile, seed=seed, limits=limits,
                    targets=targets, strict=strict, charge_once=charge_once, device=device,
                    github_classroom_prefix=assignment.get("github_classroom_prefix"),
                    raw=data)
    if rubric.max_points <= 0:
        raise RubricError(f"{where}: the rubric awards no points")
    late = [item.key for item in rubric.items if item.visibility == "after_due_date"]
    if late and due is None:
        raise RubricError(f"{where}: {late[0]} is visible after the due date, but [assignment] "
                          "gives no due")
    return rubric


def _table(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise RubricError(f"{where}: expected a table")
    return value


def _known_keys(table: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        hint = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        suggestion = f" (did you mean {hint[0]}?)" if hint else ""
        raise RubricError(f"{where}: unknown key {unknown[0]!r}{suggestion}; known: "
                          f"{', '.join(sorted(known))}")


def _datetime(value: object, where: str) -> datetime:
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise RubricError(f"{where} {value!r}: give a date-time, e.g. "
                              "2026-03-01T23:59:00Z") from None
    if not isinstance(value, datetime):
        raise RubricError(f"{where} {value!r}: give a date-time with a time zone, e.g. "
                          "2026-03-01T23:59:00Z")
    if value.tzinfo is None:
        raise RubricError(f"{where} {value.isoformat()}: give a time zone (Z or +hh:mm), so the "
                          "due date means the same on every machine")
    return value.astimezone(timezone.utc)


def _positive(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise RubricError(f"{where} {value!r}: give a positive number")
    return float(value)


def _limits(table: dict, where: str) -> RubricLimits:
    _known_keys(table, _LIMITS, f"{where}: [limits]")
    defaults = RubricLimits()
    return RubricLimits(
        check_seconds=_positive(table.get("check_seconds", defaults.check_seconds),
                                f"{where}: [limits] check_seconds"),
        submission_seconds=_positive(table.get("submission_seconds", defaults.submission_seconds),
                                     f"{where}: [limits] submission_seconds"),
        memory_mb=int(_positive(table.get("memory_mb", defaults.memory_mb),
                                f"{where}: [limits] memory_mb")))


def _points(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RubricError(f"{where}: points {value!r}: give a number")
    if value < 0:
        raise RubricError(f"{where}: points {value!r}: must not be negative")
    return float(value)


def _check_name(name: object, where: str) -> str:
    if name not in CHECK_NAMES:
        hint = difflib.get_close_matches(str(name), CHECK_NAMES, n=1)
        suggestion = f" (did you mean {hint[0]}?)" if hint else ""
        raise RubricError(f"{where}: unknown check {name!r}{suggestion}; known: "
                          f"{', '.join(CHECK_NAMES)}")
    return str(name)


def _class_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise RubricError(f"{where}: class {name!r}: give a Python class name")
    return name


def _target(raw: object, index: int, where: str) -> Target:
    here = f"{where}: targets[{index}]"
    raw = _table(raw, here)
    _known_keys(raw, _TARGET, here)
    if "class" not in raw:
        raise RubricError(f"{here}: give the class to find (class = \"MultiHeadAttention\")")
    name = _class_name(raw["class"], here)
    here = f"{where}: target {name}"
    aliases = raw.get("aliases", [])
    if not isinstance(aliases, list):
        raise RubricError(f"{here}: aliases: give a list of class names")
    aliases = tuple(_class_name(alias, f"{here}: aliases") for alias in aliases)
    interface = _table(raw.get("interface", {}), f"{here}: interface")
    forms = _constructor_forms(interface.get("constructor", "keyword"), here)
    try:
        declared = {**interface, "constructor": forms[0]} if "constructor" in interface \
            else dict(interface)
        # Every value checked against the table of declarations as it is read.
        declarations = from_mapping(declared, f"{here}: interface")
    except DeclarationError as error:
        raise RubricError(str(error)) from None
    raw_items = raw.get("items")
    if not isinstance(raw_items, list) or not raw_items:
        raise RubricError(f"{here}: no [[targets.items]]: give the checks and their points")
    items = [_item(raw_item, name, position, here)
             for position, raw_item in enumerate(raw_items, 1)]
    _check_items(items, here)
    return Target(name=name, aliases=aliases, declarations=declarations,
                  interface={k.replace("_", "-"): v for k, v in interface.items()},
                  items=tuple(items), constructor_forms=forms)


def _constructor_forms(raw: object, here: str) -> tuple[str, ...]:
    """``interface.constructor``: one form or a list of them, each ``keyword`` or
    ``positional``."""
    forms = [raw] if isinstance(raw, str) else raw
    if not isinstance(forms, list) or not forms or any(
            form not in ("keyword", "positional") for form in forms):
        raise RubricError(f"{here}: interface constructor {raw!r}: use \"keyword\", "
                          "\"positional\" or a list of both, e.g. [\"positional\", \"keyword\"]")
    return tuple(dict.fromkeys(forms))


def _item(raw: object, target: str, position: int, where: str) -> Item:
    here = f"{where}: item {position}"
    raw = _table(raw, here)
    _known_keys(raw, _ITEM, here)
    visibility = raw.get("visibility", "visible")
    if visibility not in VISIBILITIES:
        raise RubricError(f"{here}: visibility {visibility!r}: use one of {', '.join(VISIBILITIES)}")
    requires = raw.get("requires", [])
    if isinstance(requires, str):
        requires = [requires]
    if not isinstance(requires, list):
        raise RubricError(f"{here}: requires: give a list of checks")
    requires = tuple(_check_name(name, f"{here}: requires") for name in requires)
    if ("check" in raw) == ("group" in raw):
        raise RubricError(f"{here}: give either check = \"NAME\" or group = \"NAME\" with checks")
    if "check" in raw:
        for key in ("checks", "points_each", "cap"):
            if key in raw:
                raise RubricError(f"{here}: {key} belongs to a group item")
        check = _check_name(raw["check"], here)
        if "points" not in raw:
            raise RubricError(f"{here}: check {check}: give its points")
        return Item(key=f"{target}.{check}", target=target, label=str(raw.get("label", check)),
                    checks=(check,), points=_points(raw["points"], f"{here} ({check})"),
                    requires=requires, visibility=visibility)
    group = raw["group"]
    if not isinstance(group, str) or not group or any(c in group for c in ",\n\"") \
            or group in CHECK_NAMES:
        raise RubricError(f"{here}: group {group!r}: give a short name that is not a check's")
    here = f"{here} (group {group})"
    checks = raw.get("checks")
    if not isinstance(checks, list) or not checks:
        raise RubricError(f"{here}: give its checks = [...]")
    checks = tuple(_check_name(name, here) for name in checks)
    if len(set(checks)) != len(checks):
        raise RubricError(f"{here}: a check is listed twice")
    each = raw.get("points_each")
    if ("points" in raw) == (each is not None):
        raise RubricError(f"{here}: give points (all-or-nothing) or points_each (per check)")
    cap = raw.get("cap")
    if cap is not None and each is None:
        raise RubricError(f"{here}: cap goes with points_each")
    return Item(key=f"{target}.{group}", target=target, label=str(raw.get("label", group)),
                checks=checks, is_group=True,
                points=_points(raw.get("points", 0), here),
                points_each=None if each is None else _points(each, here),
                cap=None if cap is None else _points(cap, f"{here}: cap"),
                requires=requires, visibility=visibility)


def _check_items(items: list[Item], where: str) -> None:
    seen: dict[str, str] = {}
    for item in items:
        for check in item.checks:
            if check in seen:
                raise RubricError(f"{where}: check {check} is scored twice ({seen[check]} and "
                                  f"{item.key})")
            seen[check] = item.key
    keys = [item.key for item in items]
    for key in keys:
        if keys.count(key) > 1:
            raise RubricError(f"{where}: two items are called {key}")
    scored = set(seen)
    for item in items:
        for needed in item.requires:
            if needed != GATE and needed not in scored:
                raise RubricError(f"{where}: {item.key} requires {needed}, which is not an item "
                                  f"of this target: add it (with points = 0 if it should carry "
                                  "none)")
            if needed in item.checks:
                raise RubricError(f"{where}: {item.key} requires itself ({needed})")
    # A cycle (a requires b, b requires a) would mark both "not evaluated" forever.
    needs = {check: set() for check in scored}
    for item in items:
        for check in item.checks:
            needs[check].update(r for r in item.requires if r != GATE)
    for start in needs:
        stack, visited = list(needs[start]), set()
        while stack:
            current = stack.pop()
            if current == start:
                raise RubricError(f"{where}: requires goes round in a circle through {start}")
            if current not in visited:
                visited.add(current)
                stack.extend(needs.get(current, ()))
