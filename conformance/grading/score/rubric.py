"""The rubric: what to find in a submission, how to call it, which checks earn how many points.

A rubric is a TOML file (reference and worked example: ``docs/grading.md``)::

    [assignment]
    name = "attention"                 # outputs' assignment name
    due = 2026-03-01T23:59:00Z         # needed by after_due_date items
    reference = "reference/attention.py"   # the instructor's solution, relative to this file
    profile = "quick"
    seed = 20260301
    strict = false                     # true: a warning (beyond the normal range) earns nothing
    charge_once = true                 # a bug is charged in the first item it fails (see below)

    [limits]
    check_seconds = 20                 # one check
    submission_seconds = 180           # one submission, every check of every target
    memory_mb = 2048

    [[targets]]
    class = "MultiHeadAttention"
    aliases = ["MultiHeadedAttention"] # accepted as the same class
    interface = { call = "self", mask = "keep_bool:key_padding", causal = "never" }

    [[targets.items]]
    check = "padding"
    points = 2
    requires = ["contract"]            # not evaluated when contract fails
    visibility = "after_due_date"

    [[targets.items]]
    group = "numerics"                 # all-or-nothing: 3 points when both pass
    checks = ["reference", "scale"]
    points = 3

    [[targets.items]]
    group = "robustness"               # 1 point each, at most 1 in all
    checks = ["batch_independence", "autograd"]
    points_each = 1
    cap = 1

Every problem is reported as one line by :class:`RubricError`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from conformance.errors import ConformanceError
from conformance.model.check_names import CHECK_NAMES
from conformance.model.declarations import Declarations

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
"""Gradescope's visibility values; feedback files show an item as its visibility allows."""

GATE = "gate"


class RubricError(ConformanceError):
    """A rubric that can't be used; the message is one line naming the file and the place."""


@dataclass(frozen=True)
class RubricLimits:
    """Resource limits for running one submission."""

    check_seconds: float = 60.0
    submission_seconds: float = 600.0
    memory_mb: int = 4096

    def to_dict(self) -> dict:
        return {"check_seconds": self.check_seconds,
                "submission_seconds": self.submission_seconds, "memory_mb": self.memory_mb}


@dataclass(frozen=True)
class Item:
    """One graded line of the rubric: a check, or a group of checks.

    Attributes:
        key: the column name, ``Target.check`` or ``Target.group``.
        checks: the checks it scores (one for a check item).
        points: all-or-nothing points (a check item, or a group without ``points_each``).
        points_each: per passing check (a group); the sum is capped at ``cap`` when given.
        requires: checks of the same target that must pass for this item's checks to count as
            evaluated (the gate always is one).
    """

    key: str
    target: str
    label: str
    checks: tuple[str, ...]
    is_group: bool = False
    points: float = 0.0
    points_each: float | None = None
    cap: float | None = None
    requires: tuple[str, ...] = ()
    visibility: str = "visible"

    @property
    def max_points(self) -> float:
        if self.points_each is None:
            return self.points
        total = self.points_each * len(self.checks)
        return total if self.cap is None else min(total, self.cap)

    @property
    def rule(self) -> str:
        """How the item scores, in words."""
        if not self.is_group:
            return f"{_number(self.points)} point(s) when {self.checks[0]} passes"
        if self.points_each is None:
            return f"{_number(self.points)} point(s) when every one of {', '.join(self.checks)} passes"
        capped = f", at most {_number(self.cap)}" if self.cap is not None else ""
        return (f"{_number(self.points_each)} point(s) for each of {', '.join(self.checks)} "
                f"that passes{capped}")


@dataclass(frozen=True)
class Target:
    """A class the assignment asks for, the interface it prescribes, and its items."""

    name: str
    aliases: tuple[str, ...]
    declarations: Declarations
    interface: dict
    items: tuple[Item, ...]
    constructor_forms: tuple[str, ...] = ("keyword",)
    """The ways the constructor must work (``keyword``, ``positional``): the checks run on the
    first, the others are each tried once (``interface.constructor``)."""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def checks(self) -> tuple[str, ...]:
        """Every check to run for this target, in catalogue order (the gate first)."""
        wanted = {GATE} | {c for item in self.items for c in (*item.checks, *item.requires)}
        return tuple(c for c in CHECK_NAMES if c in wanted)

    @property
    def max_points(self) -> float:
        return sum(item.max_points for item in self.items)

    @property
    def causal(self) -> bool:
        return self.declarations.causal in ("always", "optional")


RUBRIC_VALUES = {
    "constructor": '"keyword", or a list of the forms it must work in, e.g. ["positional", '
                   '"keyword"]: the checks run on the first, each other is built and called once',
}
"""Interface keys a rubric takes otherwise than a declaration does (the docs' table says so)."""


GRADING_DEVICES = ("cpu", "cuda")
"""Devices a rubric may grade on (``[assignment] device``)."""


@dataclass(frozen=True)
class Rubric:
    """A parsed, validated rubric."""

    path: Path
    name: str
    title: str
    due: datetime | None
    reference: Path | None
    profile: str
    seed: int
    limits: RubricLimits
    targets: tuple[Target, ...]
    strict: bool = False
    """A warning earns nothing (by default it earns the check's points)."""
    charge_once: bool = True
    """One mistake is charged once: an item whose every failed check names a likely bug an
    earlier failed item was charged for (the same kind of bug, see
    :func:`conformance.grading.score.scoring.bug_of`) is excused, and its feedback says which item
    it is charged to (:func:`conformance.grading.score.scoring.score`)."""
    device: str = "cpu"
    """Where every check runs: ``cuda`` grades on the grader's GPU, in the sandbox
    (``conformance/worker/gpu.py``); a grader without one refuses the rubric."""
    github_classroom_prefix: str | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def items(self) -> tuple[Item, ...]:
        return tuple(item for target in self.targets for item in target.items)

    @property
    def max_points(self) -> float:
        return sum(target.max_points for target in self.targets)

    def target(self, name: str) -> Target:
        for target in self.targets:
            if target.name == name:
                return target
        raise KeyError(name)

    def execution_key(self) -> str:
        """Hash of everything that changes what running a submission gives: the targets, their
        interfaces and checks, profile, seed and limits. Points, groups, visibility and the due
        date are left out: changing them rescores stored results without running anything."""
        payload = {
            "profile": self.profile, "seed": self.seed, "limits": self.limits.to_dict(),
            **({"device": self.device} if self.device != "cpu" else {}),
            "targets": [{"class": t.name, "aliases": list(t.aliases), "interface": t.interface,
                         "checks": list(t.checks)} for t in self.targets],
        }
        return _digest(payload)

    def rubric_hash(self) -> str:
        """Hash of the whole rubric as parsed (any change, points included)."""
        return _digest(self.raw)


def _digest(payload: object) -> str:
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def prerequisites(target: Target, check: str) -> tuple[str, ...]:
    """Every check that ``check`` depends on in ``target``, transitively (the gate first)."""
    direct: dict[str, set[str]] = {}
    for item in target.items:
        for member in item.checks:
            direct.setdefault(member, set()).update(item.requires)
    found: list[str] = []
    stack = sorted(direct.get(check, ()))
    while stack:
        current = stack.pop(0)
        if current not in found and current != check:
            found.append(current)
            stack.extend(sorted(direct.get(current, ())))
    ordered = [c for c in CHECK_NAMES if c in found]
    if check != GATE and GATE not in ordered:
        ordered.insert(0, GATE)
    return tuple(ordered)
