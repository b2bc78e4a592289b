"""What every message of a report must be (issue 55): said once, whole and true. A test helper:
``problems(report)`` over a ``--json`` report lists each message that breaks a rule, with the
rule and the implementation; the tests that run whole collections assert it finds none.

The rules, each one a defect a newcomer met:

- a clause repeated within one message ("on this platform, in bfloat16 only: on this platform,
  in bfloat16 only: ...");
- ``inf`` or ``nan`` where a number is meant ("closest relative error inf");
- a sentence cut mid-way: a parenthesis or bracket left open, or a message ending on ":", "(" or
  "," ("read as the canonical grouping read 2 key/value heads" left one open);
- a value declared (``NAME=VALUE (declared)``) said otherwise in the same report ("constructed
  with window_size=2 (declared)" beside "built with window_size=1024");
- a message that points to a check skipped for that implementation ("see causal" where causal
  was skipped).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from conformance.model.check_names import CHECK_NAMES

MIN_WORDS = 4
"""A repeated clause counts from this many words: shorter ones ("in float16", "row 0") recur
in sound sentences."""

CLAUSES = re.compile(r"[;:]\s+|,\s+|\s+\(|\)\s*")
NOT_A_NUMBER = re.compile(r"\b(error|errors|scale|gap|difference|noise)\s+-?(inf|nan)\b")
"""A measure said as inf or nan: the words a number follows, never a value that is one ("the
product overflows to inf", "the gradient is nan" say what was seen)."""
DECLARED = re.compile(r"\b(\w+)=([^\s,;)]+) \(declared\)")
POINTS_TO = re.compile(r"\bsee (\w+)\b")
PAIRS = {"(": ")", "[": "]"}


def _messages(report: dict) -> Iterator[tuple[str, str]]:
    """(implementation, message) for every message of ``report``: each result's reason, hint,
    likely bug, details and observations, and each implementation's notes."""
    for result in report["results"]:
        name = result["implementation"]
        for key in ("reason", "hint", "bug"):
            if result.get(key):
                yield name, result[key]
        for key in ("details", "observations"):
            for text in result.get(key) or ():
                yield name, text
    for implementation in report["implementations"]:
        for text in implementation.get("inferred") or ():
            yield implementation["name"], text


def _repeated(text: str) -> str | None:
    seen: set[str] = set()
    for clause in CLAUSES.split(text):
        words = " ".join(clause.split()).lower()
        if len(words.split()) < MIN_WORDS:
            continue
        if words in seen:
            return f"clause said twice: {words!r}"
        seen.add(words)
    return None


def _cut(text: str) -> str | None:
    depth = {opening: 0 for opening in PAIRS}
    for char in text:
        for opening, closing in PAIRS.items():
            depth[opening] += (char == opening) - (char == closing)
    left = [opening for opening, count in depth.items() if count != 0]
    if left:
        return f"{left[0]!r} not closed (or closed twice)"
    if text.rstrip().endswith((":", "(", ",")):
        return "ends mid-sentence"
    return None


def problems_in(text: str) -> list[str]:
    """The rules ``text`` alone breaks (repeated clause, inf/nan for a number, a cut)."""
    found = [_repeated(text), _cut(text)]
    number = NOT_A_NUMBER.search(text)
    if number:
        found.append(f"{number.group(2)} where a number is meant: {number.group(0)!r}")
    return [problem for problem in found if problem]


def problems(report: dict) -> list[str]:
    """Every message of a ``--json`` ``report`` that breaks a rule:
    ``IMPLEMENTATION: rule: message``."""
    skipped: dict[str, set[str]] = {}
    for result in report["results"]:
        if result["status"] == "skipped":
            skipped.setdefault(result["implementation"], set()).add(result["check"])
    return problems_of(list(_messages(report)), skipped)


def result_messages(name: str, result) -> Iterator[tuple[str, str]]:
    """(implementation, message) for each message of one ``CheckResult``."""
    for text in (result.reason, result.hint, *result.details, *result.observations):
        if text:
            yield name, text


def problems_of(messages: Iterable[tuple[str, str]],
                skipped: dict[str, set[str]]) -> list[str]:
    """Every (implementation, message) that breaks a rule; ``skipped``: each implementation's
    skipped checks."""
    found = []
    declared: dict[str, dict[str, str]] = {}
    messages = list(messages)
    for name, text in messages:
        for argument, value in DECLARED.findall(text):
            declared.setdefault(name, {})[argument] = value
    for name, text in messages:
        said = [*problems_in(text)]
        for check in POINTS_TO.findall(text):
            if check in CHECK_NAMES and check in skipped.get(name, ()):
                said.append(f"points to {check}, skipped for it")
        for argument, value in declared.get(name, {}).items():
            for other in re.findall(rf"\b{re.escape(argument)}=([^\s,;)]+)", text):
                if other != value:
                    said.append(f"{argument}={other} said beside {argument}={value} (declared)")
        found += [f"{name}: {problem}: {' '.join(text.split())[:300]}" for problem in said]
    return found
