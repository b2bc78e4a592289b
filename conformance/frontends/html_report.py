"""The run as one self-contained HTML page (``check --html``, ``pytest --attention-html``).

What was inferred of each implementation, the verdict table, and every finding (failure,
warning, expected failure) with its evidence and its minimal case drawn
(:mod:`conformance.frontends.picture_figure`): the page fetches nothing (its figures are inline
PNGs, its style in the page), so it can be mailed, attached to a CI run or opened offline.
Without matplotlib it has the tables and says what to install.
"""

from __future__ import annotations

import base64
import html
import platform
from collections.abc import Mapping, Sequence

import torch

from conformance.frontends import picture_figure
from conformance.frontends.interface_language import Interface, notes_words, remedy_words
from conformance.frontends.report import LABELS, Reproduction, row_label
from conformance.model.remedies import Note
from conformance.model.results import CheckResult, Status

SHOWN = (Status.FAILED, Status.WARNED, Status.EXPECTED_FAILURE, Status.SUITE_ERROR)
"""The verdicts a finding section is written for, in the page's order."""

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #ccc; padding: 2px 6px; font-size: 12px; }
th { background: #f3f3f3; } th.check { writing-mode: vertical-rl; transform: rotate(180deg); }
td.PASS { background: #d9f2d9; } td.FAIL { background: #f8c9c9; font-weight: bold; }
td.WARN { background: #fde9b8; } td.SKIP { color: #999; } td.XFAIL { background: #e6dcf5; }
td.ERROR { background: #222; color: #fff; }
section.finding { border-left: 4px solid #c33; padding-left: 1em; margin: 1.5em 0; }
section.WARN { border-color: #e0a800; } section.XFAIL { border-color: #8a6fc4; }
code, pre { background: #f6f6f6; padding: 1px 3px; }
pre { padding: 6px; white-space: pre-wrap; word-break: break-all; }
img { max-width: 100%; } .note { color: #555; }
"""


def render_html(results: Sequence[CheckResult], *, checks: Sequence[str], profile: str,
                devices: Sequence[str], seconds: float,
                interfaces: Mapping[str, tuple[str, Sequence[Note]]] | None = None,
                reproduce: Reproduction | None = None, interface: Interface = "cli") -> str:
    """The page; ``interfaces``: ``{implementation: (what it declares, inferred notes)}``."""
    from conformance._version import __version__

    parts = [f"<h1>attention-conformance: {_counts(results)}</h1>",
             f"<p class=note>attention-conformance {__version__} · torch {torch.__version__} · "
             f"python {platform.python_version()} · profile {profile} · devices "
             f"{', '.join(devices)} · {seconds:.1f} s</p>"]
    if not picture_figure.available():
        parts.append("<p><b>No figures:</b> drawing the falsifying cases needs matplotlib: "
                     f"<code>{picture_figure.INSTALL}</code></p>")
    parts += _interfaces(interfaces or {}, interface)
    parts += _table(results, checks, devices)
    findings = sorted((r for r in results if r.status in SHOWN),
                      key=lambda r: SHOWN.index(r.status))
    if findings:
        parts.append(f"<h2>Findings ({len(findings)})</h2>")
    parts += [_finding(result, reproduce, interface) for result in findings]
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            "<title>attention-conformance report</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(parts) + "\n</body></html>\n")


def _counts(results: Sequence[CheckResult]) -> str:
    counts = {status: sum(r.status is status for r in results) for status in Status}
    return (f"{counts[Status.FAILED]} failed, {counts[Status.WARNED]} warning(s), "
            f"{counts[Status.PASSED]} passed, {counts[Status.SKIPPED]} skipped"
            + (f", {counts[Status.EXPECTED_FAILURE]} expected failure(s)"
               if counts[Status.EXPECTED_FAILURE] else ""))


def _interfaces(interfaces: Mapping[str, tuple[str, Sequence[Note]]],
                interface: Interface) -> list[str]:
    if not interfaces:
        return []
    parts = ["<h2>Interface</h2>"]
    for name, (declared, notes) in interfaces.items():
        parts.append(f"<p><b>{_e(name)}</b>: {_e(declared)}</p>")
        if notes:
            parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>"
                                          for line in notes_words(notes, interface)) + "</ul>")
    return parts


def _table(results: Sequence[CheckResult], checks: Sequence[str],
           devices: Sequence[str]) -> list[str]:
    rows: dict[str, dict[str, CheckResult]] = {}
    for result in results:
        rows.setdefault(row_label(result, devices), {})[result.check] = result
    head = "".join(f"<th class=check>{_e(c)}</th>" for c in checks)
    body = []
    for label, by_check in rows.items():
        cells = []
        for check in checks:
            result = by_check.get(check)
            word = LABELS[result.status] if result else ""
            tip = f' title="{_e(result.reason)}"' if result and result.reason else ""
            cells.append(f"<td class={word or 'none'}{tip}>{word}</td>")
        body.append(f"<tr><th>{_e(label)}</th>{''.join(cells)}</tr>")
    return ["<h2>Verdicts</h2>", f"<table><tr><th>implementation</th>{head}</tr>",
            *body, "</table>"]


def _finding(result: CheckResult, reproduce: Reproduction | None, interface: Interface) -> str:
    label = LABELS[result.status]
    parts = [f"<section class='finding {label}'>",
             f"<h3>{label} {_e(result.implementation)} · {_e(result.check)} "
             f"[{_e(result.device)}]</h3>", f"<p>{_e(result.reason)}</p>"]
    if result.hint:
        parts.append(f"<p><b>likely bug:</b> {_e(result.hint)}</p>")
    if result.remedy is not None:
        parts.append(f"<p>{_e(remedy_words(result.remedy, interface))}</p>")
    parts += _drawn(result)
    if result.counterexample:
        parts.append(f"<p>minimal case: <code>{_e(result.counterexample)}</code></p>")
        command = reproduce(result) if reproduce is not None else None
        if command:
            parts.append(f"<p>replay it:</p><pre>{_e(command)}</pre>")
    if result.details:
        parts.append("<ul>" + "".join(f"<li>{_e(d)}</li>" for d in result.details) + "</ul>")
    parts.append("</section>")
    return "\n".join(parts)


def _drawn(result: CheckResult) -> list[str]:
    """The finding's picture, inline, with how it was chosen; or why there is none."""
    picture = result.picture
    if picture is None:
        return []
    words = [f"batch {picture.batch}, head {picture.head}: {picture.where}"] if picture.where \
        else []
    if picture.unavailable:
        words.append(picture.unavailable)
    parts = [f"<p class=note>{_e('; '.join(words))}</p>"] if words else []
    if picture_figure.available():
        image = picture_figure.png(picture, f"{result.implementation} · {result.check}: "
                                            f"batch {picture.batch}, head {picture.head}")
        if image is not None:
            data = base64.b64encode(image).decode("ascii")
            alt = _e(f"attention of {result.implementation} on the case of {result.check}")
            parts.append(f"<img class=picture alt='{alt}' src='data:image/png;base64,{data}'>")
            if picture.measured is not None:
                parts.append("<p class=note>Hatched: keys the case masks (columns), query rows "
                             "with no key to attend to (rows); dashed staircase: the causal "
                             "boundary (a row's keys to its right are its future); red "
                             "squares: weight on a key the row may not see.</p>")
    return parts


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)
