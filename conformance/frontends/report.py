"""Render verdicts: the implementation x check matrix, failure blocks, a summary; or JSON.

The text fits :data:`WIDTH` columns: long lines wrap (indented under their first line, words
kept whole, so a ``Case(...)`` still pastes as Python) and the matrix is cut into as many blocks
of checks as it takes; only a "replay it" command stays on one line, to be pasted whole.
"""

from __future__ import annotations

import platform
import textwrap
from collections.abc import Callable, Mapping, Sequence

import torch

from conformance.frontends.interface_language import Interface, notes_words, remedy_words
from conformance.model.remedies import Note
from conformance.model.results import (
    CheckResult,
    Route,
    Status,
    checked_nowhere,
    partly_judged,
    unchecked,
)

LABELS = {
    Status.PASSED: "PASS",
    Status.FAILED: "FAIL",
    Status.WARNED: "WARN",
    Status.SKIPPED: "SKIP",
    Status.EXPECTED_FAILURE: "XFAIL",
    Status.SUITE_ERROR: "ERROR",
}


WIDTH = 100
CORE_HEADING = ("Judged through the attention core (no weight layout maps it to per-head projections: "
                "what its softmax was given and computed, observed inside its forward):")
"""Columns the text report fits in (a terminal, a CI log, an issue comment)."""


def wrap(text: str, indent: int = 0, hanging: int = 2) -> str:
    """``text`` in lines of at most WIDTH columns (a word longer than that stays whole),
    ``indent`` spaces before the first and ``indent + hanging`` before the rest."""
    return textwrap.fill(text, WIDTH, initial_indent=" " * indent,
                         subsequent_indent=" " * (indent + hanging), break_long_words=False,
                         break_on_hyphens=False)


def row_label(result: CheckResult, devices: Sequence[str]) -> str:
    """A result's row in a table of verdicts: its implementation, and its device where there
    are several."""
    return result.implementation if len(devices) == 1 else f"{result.implementation} [{result.device}]"


def header(profile: str, devices: Sequence[str], unavailable: Sequence[str]) -> str:
    from conformance._version import __version__

    missing = "".join(f"; {d}: not available, skipped" for d in unavailable)
    return (f"attention-conformance {__version__} · torch {torch.__version__} · "
            f"python {platform.python_version()}\n"
            + wrap(f"profile {profile} · devices: {', '.join(devices)}{missing}"))


def matrix(results: Sequence[CheckResult], checks: Sequence[str], devices: Sequence[str]) -> str:
    rows: dict[str, dict[str, CheckResult]] = {}
    for result in results:
        rows.setdefault(row_label(result, devices), {})[result.check] = result
    name_width = max([len("implementation"), *map(len, rows)]) + 2
    widths = {c: max(len(c), 5) + 2 for c in checks}
    # As many checks to a block as fit beside the names (at least one).
    blocks: list[list[str]] = [[]]
    for check in checks:
        used = name_width + sum(widths[c] for c in blocks[-1])
        if blocks[-1] and used + widths[check] > WIDTH + 2:  # the last cell's padding is cut
            blocks.append([])
        blocks[-1].append(check)

    def line(label: str, cells: Sequence[str], block: Sequence[str]) -> str:
        return (label.ljust(name_width) + "".join(
            cell.ljust(widths[check]) for cell, check in zip(cells, block, strict=True))).rstrip()

    lines: list[str] = []
    for block in blocks:
        lines += [""] if lines else []
        lines.append(line("implementation", block, block))
        for label, by_check in rows.items():
            lines.append(line(label, [LABELS[by_check[c].status] if c in by_check else "-"
                                      for c in block], block))
    return "\n".join(lines)


def _skips(results: Sequence[CheckResult], devices: Sequence[str]) -> list[str]:
    """Per row, the skipped checks grouped by their reason: each reason said once."""
    by_row: dict[str, dict[str, list[str]]] = {}
    for result in results:
        if result.status is Status.SKIPPED:
            reasons = by_row.setdefault(row_label(result, devices), {})
            reasons.setdefault(result.reason or "", []).append(result.check)
    return [wrap(f"{row}: " + "; ".join(f"{', '.join(checks)} ({reason})"
                                        for reason, checks in reasons.items()), 2, 4)
            for row, reasons in by_row.items()]


def _routes(results: Sequence[CheckResult], devices: Sequence[str]) -> list[str]:
    """Per row, the checks judged through the attention core (each row once)."""
    by_row: dict[str, list[str]] = {}
    for result in results:
        if result.route is Route.CORE:
            by_row.setdefault(row_label(result, devices), []).append(result.check)
    return [wrap(f"{row}: {', '.join(checks)}", 2, 4) for row, checks in by_row.items()]


def _observations(results: Sequence[CheckResult], devices: Sequence[str]) -> list[str]:
    return [wrap(f"{row_label(r, devices)} · {r.check}: {note}", 2, 4)
            for r in results for note in r.observations]


def falsifying_example(result: CheckResult, indent: int = 2) -> list[str]:
    """The shrunk case as hypothesis prints a falsifying example: the property called on it."""
    pad = " " * indent
    case = textwrap.fill(f"case={result.counterexample},", WIDTH, initial_indent=pad + "    ",
                         subsequent_indent=pad + "         ", break_long_words=False,
                         break_on_hyphens=False)
    return [f"{pad}Falsifying example: {result.check}(", case, f"{pad})"]


Reproduction = Callable[[CheckResult], "str | None"]
"""How a front-end says to run a falsifying example again, in its own language (a command line,
a pytest invocation): a line, or None where it can't."""


def failure_block(result: CheckResult, reproduce: Reproduction | None = None,
                  interface: Interface = "cli") -> str:
    """A failure, expected failure or warning with its evidence: what went wrong, the likely bug,
    what to declare where behaviour can't settle it (said for ``interface``), the falsifying
    example (hypothesis-shrunk) and how to replay it, the numbers seen."""
    label = {Status.FAILED: "FAIL ", Status.WARNED: "WARN ",
             Status.SUITE_ERROR: "ERROR"}.get(result.status, "XFAIL")
    through = " · through its attention core" if result.route is Route.CORE else ""
    lines = [f"{label} {result.implementation} · {result.check} [{result.device}]{through}",
             wrap(result.reason, 2)]
    if result.hint:
        lines.append(wrap(f"likely bug: {result.hint}", 2))
    if result.remedy is not None:
        lines.append(wrap(remedy_words(result.remedy, interface), 2))
    if result.counterexample:
        lines += falsifying_example(result)
        command = reproduce(result) if reproduce is not None else None
        if command:  # one line, never wrapped: it is pasted as it is
            lines.append(f"  replay it: {command}")
    lines.extend(wrap(detail, 2) for detail in result.details)
    return "\n".join(lines)


def summary(results: Sequence[CheckResult], seconds: float) -> str:
    counts = {status: sum(r.status is status for r in results) for status in Status}
    implementations = len({r.implementation for r in results})
    text = (f"{implementations} implementation(s): {counts[Status.PASSED]} passed, "
            f"{counts[Status.FAILED]} failed, {counts[Status.WARNED]} warning(s), "
            f"{counts[Status.SKIPPED]} skipped, "
            f"{counts[Status.EXPECTED_FAILURE]} expected failure(s) in {seconds:.1f} s")
    verdict = ("OK: no unexpected failure" if not counts[Status.FAILED]
               else f"FAILED: {counts[Status.FAILED]} unexpected failure(s)")
    if counts[Status.SUITE_ERROR]:
        text += f", {counts[Status.SUITE_ERROR]} suite error(s)"
        verdict = (f"SUITE ERROR: the suite itself failed in {counts[Status.SUITE_ERROR]} "
                   "check(s), no verdict there; please report it (the lines above say where)"
                   + ("" if not counts[Status.FAILED] else
                      f"; and {counts[Status.FAILED]} unexpected failure(s)"))
    if counts[Status.WARNED] and not counts[Status.FAILED]:
        verdict += (f" ({counts[Status.WARNED]} warning(s): findings beyond the contract's "
                    "normal range, in assumed dtypes or about an intent inference can't know; "
                    "--strict fails on them)")
    nowhere = checked_nowhere(results)
    if nowhere and not counts[Status.FAILED] and not counts[Status.SUITE_ERROR]:
        verdict = (f"NOTHING CHECKED: every check of {', '.join(nowhere)} skipped on every "
                   "device: no verdict, not OK (the lines above say why)")
    partly = partly_judged(results)
    if partly and not counts[Status.FAILED] and not counts[Status.SUITE_ERROR] and not nowhere:
        verdict += (f"; but {len(partly)} implementation(s) had fewer than half the checks "
                    "judged (the lines above say which and why)")
    lines = [wrap(f"Nothing checked: {u.implementation} on {u.device} ({u.why})", 0, 6)
             for u in unchecked(results)]
    lines += [wrap(f"Partly judged: {p.words()}", 0, 6) for p in partly]
    return "\n".join([*lines, wrap(text), wrap(verdict)])


def inferred(notes: Mapping[str, Sequence[Note]], interface: Interface = "cli") -> list[str]:
    """What was inferred about each implementation, before any verdict, each with what would
    state it otherwise (said for ``interface``)."""
    lines = []
    for name, said in notes.items():
        if said:
            lines.append(f"  {name}:")
            lines += [wrap(f"- {line}", 4, 2) for line in notes_words(said, interface)]
    return ["Interface (inferred; items marked declared were given):", *lines] if lines else []


def render_text(results: Sequence[CheckResult], *, checks: Sequence[str], profile: str,
                devices: Sequence[str], unavailable: Sequence[str], seconds: float,
                notes: Mapping[str, Sequence[Note]] | None = None,
                reproduce: Reproduction | None = None) -> str:
    parts = [header(profile, devices, unavailable), ""]
    opening = inferred(notes or {})
    if opening:
        parts += [*opening, ""]
    parts.append(matrix(results, checks, devices))
    skips = _skips(results, devices)
    if skips:
        parts += ["", "Skipped:", *skips]
    routes = _routes(results, devices)
    if routes:
        parts += ["", wrap(CORE_HEADING), *routes]
    observations = _observations(results, devices)
    if observations:
        parts += ["", "Observed:", *observations]
    shown = (Status.EXPECTED_FAILURE, Status.WARNED, Status.FAILED, Status.SUITE_ERROR)
    failures = [r for r in results if r.status in shown]
    for result in sorted(failures, key=lambda r: shown.index(r.status)):
        parts += ["", failure_block(result, reproduce)]
    parts += ["", summary(results, seconds)]
    return "\n".join(parts)


def render_json(results: Sequence[CheckResult], *,
                interfaces: Mapping[str, tuple[str, Sequence[Note]]], profile: str,
                devices: Sequence[str], unavailable: Sequence[str], seconds: float) -> dict:
    """The run as JSON; ``interfaces``: ``{implementation: (what it declares, inferred)}``."""
    from conformance._version import __version__

    counts = {status.value: sum(r.status is status for r in results) for status in Status}
    return {
        "tool": "attention-conformance",
        "version": __version__,
        "torch": torch.__version__,
        "profile": profile,
        "devices": list(devices),
        "unavailable_devices": list(unavailable),
        "implementations": [{"name": name, "declares": declares,
                             "inferred": notes_words(notes, "cli"),
                             "notes": [note.to_dict() for note in notes]}
                            for name, (declares, notes) in interfaces.items()],
        "results": [r.to_dict() for r in results],
        "summary": {**counts, "seconds": round(seconds, 3),
                    "unchecked": [u._asdict() for u in unchecked(results)],
                    "ok": counts[Status.FAILED.value] == 0
                    and counts[Status.SUITE_ERROR.value] == 0 and not checked_nowhere(results)},
    }
