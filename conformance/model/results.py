"""Verdicts: one :class:`CheckResult` per (implementation, check, device)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

from conformance.model.remedies import Remedy

if TYPE_CHECKING:  # only reports that draw one import it
    from conformance.model.picture import Picture


class Status(str, Enum):
    """A verdict. FAILED: attention's contract is violated on inputs in the normal range of the
    dtype in use (or the implementation crashes there). WARNED: a robustness finding beyond that
    range (float16 overflow at activations far outside normal ones, a platform kernel defect),
    with the same evidence; it fails a run only under ``strict``. SUITE_ERROR: the suite's own
    exception, never the implementation's verdict."""

    PASSED = "passed"
    FAILED = "failed"
    WARNED = "warning"
    SKIPPED = "skipped"
    EXPECTED_FAILURE = "expected-failure"
    SUITE_ERROR = "suite-error"
    """The suite itself raised while checking (its own defect): no verdict on the
    implementation. ``check`` exits 2, pytest reports an error, grading asks for a human look;
    every front end asks for it to be reported."""


class Hint(str):
    """A likely bug in words, with the kind of bug it names: ``kind`` is a stable key (the same
    from every check that names that mistake, whatever its words and numbers), None where the
    words name no single bug. A plain ``str`` hint is one of no known kind."""

    kind: str | None

    def __new__(cls, words: str, kind: str | None = None) -> Hint:
        hint = super().__new__(cls, words)
        hint.kind = kind
        return hint


def plain(hint: str | None) -> tuple[str | None, str | None]:
    """``hint`` as a plain ``str`` and the kind of bug it names: a result carries plain text
    (it crosses processes through serializers that know ``str`` only: pytest-xdist's), its kind
    beside it (``CheckResult.bug``)."""
    if hint is None:
        return None, None
    return str(hint), getattr(hint, "kind", None)


class Route(str, Enum):
    """What a check judged an implementation through, where it has more than one way."""

    WEIGHTS = "weights"
    """Its projection weights, found (or declared) in the canonical per-head form: the
    attention matrix measured by loading probe weights, the float64 reference built from them."""
    CORE = "core"
    """Its attention core, observed inside its forward: what each softmax (or SDPA call) was
    given and computed (:mod:`conformance.model.core`), whatever the layer around it."""


@dataclass
class CheckResult:
    """The verdict of one check on one implementation and device.

    Attributes:
        reason: one line: why it failed or was skipped, what was expected.
        counterexample: the minimal failing case (hypothesis-shrunk), pasteable.
        details: further lines of evidence: numbers seen and where.
        hint: the likely bug in words, where the failure matches a known signature.
        observations: behaviour worth reporting even on a pass (e.g. fully masked rows).
        remedy: what the user can declare to settle it, where behaviour can't (each front end
            says it in its own words).
        picture: the minimal case drawn, where a report asked for it (``Runner(pictures=)``).
        route: what the check judged it through (its weights or its observed core), for the
            checks that have both ways; None for the others, and where neither applied.
    """

    implementation: str
    check: str
    device: str
    status: Status
    reason: str = ""
    counterexample: str | None = None
    details: list[str] = field(default_factory=list)
    hint: str | None = None
    observations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    remedy: Remedy | None = None
    picture: Picture | None = None
    route: Route | None = None
    bug: str | None = None
    """The kind of bug ``hint`` names (:class:`Hint`), where it names one: two results with
    the same ``bug`` are one mistake seen by two checks (grading charges it once)."""
    absent: bool = False
    """Skipped because the implementation has nothing of what the check judges (no KV cache, no
    mask): its contract, so none of what went unjudged (see :func:`partly_judged`)."""
    unmasked: Status | None = None
    """Where this check failed and the check that judges the mask failed too: its status run
    again without the mask (grading's diagnosis: a failure that is gone without the mask is the
    mask's); None where it was not run again."""

    def __post_init__(self) -> None:
        if self.hint is not None and type(self.hint) is not str:  # a Hint: text, kind beside
            self.hint, kind = plain(self.hint)
            self.bug = self.bug or kind

    @property
    def is_failure(self) -> bool:
        """A failure that was not expected: this is what makes a run fail."""
        return self.status is Status.FAILED

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        data["route"] = None if self.route is None else self.route.value
        if self.picture is None:
            del data["picture"]  # a report's JSON is as it was unless pictures were asked for
        if not self.absent:
            del data["absent"]  # said where it is so
        if self.unmasked is None:
            del data["unmasked"]
        else:
            data["unmasked"] = self.unmasked.value
        return data


class Unchecked(NamedTuple):
    """An implementation on a device where every check skipped: nothing was judged there."""

    implementation: str
    device: str
    why: str
    """The gate's skip reason (it says why the whole device is out), else the commonest one."""


def _by_pair(results: Iterable[CheckResult]) -> dict[tuple[str, str], list[CheckResult]]:
    """``results`` grouped by (implementation, device), in the order each pair first appears."""
    groups: dict[tuple[str, str], list[CheckResult]] = {}
    for result in results:
        groups.setdefault((result.implementation, result.device), []).append(result)
    return groups


def unchecked(results: Iterable[CheckResult]) -> list[Unchecked]:
    """Each (implementation, device) of ``results`` whose every check skipped, in the order they
    first appear. A run with such a pair checked nothing there: never reported as OK for it."""
    found = []
    for (name, device), group in _by_pair(results).items():
        if any(r.status is not Status.SKIPPED for r in group):
            continue
        gate = next((r.reason for r in group if r.check == "gate"), None)
        reasons = [r.reason for r in group]
        found.append(Unchecked(name, device, gate or max(reasons, key=reasons.count)))
    return found


class PartlyJudged(NamedTuple):
    """An implementation on a device where fewer than half the checks were judged."""

    implementation: str
    device: str
    judged: int
    total: int
    absent: int
    """Skipped for what it does not have (its contract)."""
    unjudged: tuple[str, ...]
    """The checks skipped for another reason (an instrument that did not fit it)."""
    why: str
    """The commonest reason of those."""

    def words(self) -> str:
        text = (f"{self.implementation} on {self.device}: {self.judged} of {self.total} checks "
                f"judged; {self.absent} skipped for what it does not have")
        if self.unjudged:
            text += (f", and {', '.join(self.unjudged)} for another reason, most often: "
                     f"{self.why}")
        return text


def partly_judged(results: Iterable[CheckResult]) -> list[PartlyJudged]:
    """Each (implementation, device) of ``results`` without a failure where some check was
    judged, yet fewer than half of them, and some skipped for a reason other than what it is
    or has (an instrument that did not fit it): an OK there says less than it seems to, and
    why is said (a failure says enough). A layer whose skips are all its own contract (no KV
    cache; a normaliser whose weights softmax's properties do not describe) was judged in
    full."""
    found = []
    for (name, device), group in _by_pair(results).items():
        judged = [r for r in group if r.status is not Status.SKIPPED]
        failed = any(r.status in (Status.FAILED, Status.SUITE_ERROR) for r in group)
        other = [r for r in group if r.status is Status.SKIPPED and not r.absent]
        if failed or not judged or not other or 2 * len(judged) >= len(group):
            continue
        reasons = [r.reason for r in other]
        found.append(PartlyJudged(name, device, len(judged), len(group),
                                  len(group) - len(judged) - len(other),
                                  tuple(r.check for r in other),
                                  max(reasons, key=reasons.count) if reasons else ""))
    return found


def checked_nowhere(results: Sequence[CheckResult]) -> list[str]:
    """The implementations of ``results`` no device checked anything of."""
    judged = {r.implementation for r in results if r.status is not Status.SKIPPED}
    return list(dict.fromkeys(r.implementation for r in results if r.implementation not in judged))
