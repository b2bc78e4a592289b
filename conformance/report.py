"""Render verdicts: the implementation x check matrix, failure blocks, a summary; or JSON."""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence

import torch

from conformance.results import CheckResult, Status

LABELS = {
    Status.PASSED: "PASS",
    Status.FAILED: "FAIL",
    Status.WARNED: "WARN",
    Status.SKIPPED: "SKIP",
    Status.EXPECTED_FAILURE: "XFAIL",
}


def _row_label(result: CheckResult, devices: Sequence[str]) -> str:
    return result.implementation if len(devices) == 1 else f"{result.implementation} [{result.device}]"


def header(profile: str, devices: Sequence[str], unavailable: Sequence[str]) -> str:
    from conformance._version import __version__

    missing = "".join(f"; {d}: not available, skipped" for d in unavailable)
    return (f"attention-conformance {__version__} · torch {torch.__version__} · "
            f"python {platform.python_version()} · profile {profile} · devices: "
            f"{', '.join(devices)}{missing}")


def matrix(results: Sequence[CheckResult], checks: Sequence[str], devices: Sequence[str]) -> str:
    rows: dict[str, dict[str, CheckResult]] = {}
    for result in results:
        rows.setdefault(_row_label(result, devices), {})[result.check] = result
    name_width = max([len("implementation"), *map(len, rows)]) + 2
    widths = [max(len(c), 5) + 2 for c in checks]

    def line(label: str, cells: Sequence[str]) -> str:
        return label.ljust(name_width) + "".join(
            cell.ljust(width) for cell, width in zip(cells, widths, strict=True))

    lines = [line("implementation", checks)]
    for label, by_check in rows.items():
        lines.append(line(label, [LABELS[by_check[c].status] if c in by_check else "-"
                                  for c in checks]))
    return "\n".join(line.rstrip() for line in lines)


def _skips(results: Sequence[CheckResult], devices: Sequence[str]) -> list[str]:
    by_row: dict[str, list[str]] = {}
    for result in results:
        if result.status is Status.SKIPPED:
            by_row.setdefault(_row_label(result, devices), []).append(
                f"{result.check} ({result.reason})")
    return [f"  {row}: " + "; ".join(items) for row, items in by_row.items()]


def _observations(results: Sequence[CheckResult], devices: Sequence[str]) -> list[str]:
    return [f"  {_row_label(r, devices)} · {r.check}: {note}"
            for r in results for note in r.observations]


def failure_block(result: CheckResult) -> str:
    """A failure, expected failure or warning with its evidence."""
    label = {Status.FAILED: "FAIL ", Status.WARNED: "WARN "}.get(result.status, "XFAIL")
    lines = [f"{label} {result.implementation} · {result.check} [{result.device}]",
             f"  {result.reason}"]
    if result.hint:
        lines.append(f"  likely bug: {result.hint}")
    if result.counterexample:
        lines.append(f"  falsifying example (hypothesis-shrunk): {result.counterexample}")
    lines.extend(f"  {detail}" for detail in result.details)
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
    if counts[Status.WARNED] and not counts[Status.FAILED]:
        verdict += (f" ({counts[Status.WARNED]} warning(s): findings beyond the contract's "
                    "normal range, in assumed dtypes or about an intent inference can't know; "
                    "--strict fails on them)")
    return f"{text}\n{verdict}"


def inferred(notes: Mapping[str, Sequence[str]]) -> list[str]:
    """What was inferred about each implementation, before any verdict."""
    lines = []
    for name, said in notes.items():
        if said:
            lines.append(f"  {name}: " + "; ".join(said))
    return ["Interface (inferred; items marked declared were given):", *lines] if lines else []


def render_text(results: Sequence[CheckResult], *, checks: Sequence[str], profile: str,
                devices: Sequence[str], unavailable: Sequence[str], seconds: float,
                notes: Mapping[str, Sequence[str]] | None = None) -> str:
    parts = [header(profile, devices, unavailable), ""]
    opening = inferred(notes or {})
    if opening:
        parts += [*opening, ""]
    parts.append(matrix(results, checks, devices))
    skips = _skips(results, devices)
    if skips:
        parts += ["", "Skipped:", *skips]
    observations = _observations(results, devices)
    if observations:
        parts += ["", "Observed:", *observations]
    shown = (Status.EXPECTED_FAILURE, Status.WARNED, Status.FAILED)
    failures = [r for r in results if r.status in shown]
    for result in sorted(failures, key=lambda r: shown.index(r.status)):
        parts += ["", failure_block(result)]
    parts += ["", summary(results, seconds)]
    return "\n".join(parts)


def render_json(results: Sequence[CheckResult], *,
                interfaces: Mapping[str, tuple[str, Sequence[str]]], profile: str,
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
        "implementations": [{"name": name, "declares": declares, "inferred": list(notes)}
                            for name, (declares, notes) in interfaces.items()],
        "results": [r.to_dict() for r in results],
        "summary": {**counts, "seconds": round(seconds, 3),
                    "ok": counts[Status.FAILED.value] == 0},
    }
