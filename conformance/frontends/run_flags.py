"""The run's options as the front ends spell them, said once; standard library only.

:data:`RUN_FLAGS` is the table of the options ``check`` and pytest both take (profile, devices,
isolation, time limits, strictness, expected failures, a replayed case, the HTML page): each
front end renders it in its own idiom (:func:`argparse_form`, :func:`addoption_form`) and reads the
values into one :class:`~conformance.run.options.RunOptions`. The command's entry reads
``--jobs`` here before torch is imported (:mod:`conformance.frontends.entry`), and ``check`` and
``grade`` turn it into processes here.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any


def jobs_said(argv: Sequence[str]) -> str:
    """What ``--jobs``/``-j`` says on a command line not yet parsed (``1``, the default, when
    absent)."""
    jobs = "1"
    for index, arg in enumerate(argv):
        if arg in ("--jobs", "-j") and index + 1 < len(argv):
            jobs = argv[index + 1]
        elif arg.startswith("--jobs="):
            jobs = arg.partition("=")[2]
        elif arg.startswith("-j") and arg[2:].isdigit():
            jobs = arg[2:]
    return jobs


def processes(jobs: int, *, one_in_xdist: bool) -> int:
    """The processes ``--jobs N`` asks for: N, or where N is 0 one per CPU core (one inside a
    pytest-xdist worker, whose run already has a process per core, where ``one_in_xdist``)."""
    if jobs:
        return jobs
    return 1 if one_in_xdist and os.environ.get("PYTEST_XDIST_WORKER") else os.cpu_count() or 1


class Kind(Enum):
    """How an option is written; each front end renders it in its own idiom."""

    SWITCH = "switch"
    """Given or not."""
    ON_OFF = "on-off"
    """The command line's ``--NAME``/``--no-NAME`` (unsaid: the run decides); a switch under
    pytest."""
    TEXT = "text"
    NUMBER = "number"
    """Seconds, a float."""
    PATH = "path"
    """A file: a ``Path`` on the command line, its text under pytest."""
    REPEATED = "repeated"
    """Given once per value."""


@dataclass(frozen=True)
class RunFlag:
    """One option of the run that ``attention-conformance check`` and pytest both take: how each
    spells it and what each says of it (their words differ where the two runs differ: a check
    of the command line is a test under pytest)."""

    flag: str
    """The command line's (``--profile``; a positional's name, ``impls``)."""
    pytest_flag: str
    """pytest's (``--attention-profile``)."""
    kind: Kind
    cli_help: str
    pytest_help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    dest: str | None = None
    """The command line's name for the value, where not the flag's own (``--device``:
    ``devices``)."""


PROFILE_NAMES = ("quick", "thorough")
"""The suite's profiles (:data:`conformance.generation.profiles.PROFILE_NAMES`, without importing
hypothesis)."""

_IMPL = "registered name, package.module:Attr or path/to/file.py::Attr"
_ISOLATE = ("run each implementation named by a file or module in a worker process of its own: a "
            "call that hangs fails its {unit} after {call_timeout}, a crash{exit} fails with its "
            "status")
_CALL = "time limit of one call{calls} in an isolated implementation"
_BUDGET = "time each check may search for"
_STRICT = "warnings (robustness findings beyond the normal range"
_TABLES = "TOML: [implementation] tables of check = \"reason\""
_REPLAY = "on this falsifying example alone, as a {what} prints it: {flag} \"Case(batch=1, {more}...)\""
_HTML = ("also write one self-contained HTML page{of}: {shown}the verdicts, and each finding with its "
         "minimal case drawn (figures: the [plot] extra)")

RUN_FLAGS: dict[str, RunFlag] = {flag.pytest_flag.removeprefix("--attention-"): flag for flag in (
    RunFlag("impls", "--attention-impl", Kind.REPEATED, metavar="IMPL",
            cli_help=f"{_IMPL} (default: every registered implementation)",
            pytest_help=f"implementation to check: {_IMPL} (repeatable; default: every registered "
                        "one)"),
    RunFlag("--profile", "--attention-profile", Kind.TEXT, choices=PROFILE_NAMES,
            cli_help="hypothesis settings: quick (default, reproducible) or thorough",
            pytest_help="the suite's hypothesis profile (default quick; --hypothesis-profile "
                        "attention-conformance-NAME also selects it)"),
    RunFlag("--device", "--attention-device", Kind.REPEATED, metavar="DEVICE", dest="devices",
            cli_help="cpu, cuda, cuda:N or mps (repeatable; default: every available one)",
            pytest_help="devices to test on (repeatable; default cpu and cuda, absent ones skip)"),
    RunFlag("--isolate", "--attention-isolate", Kind.ON_OFF,
            cli_help=_ISOLATE.format(unit="check", call_timeout="--call-timeout",
                                     exit=" or os._exit")
            + ", and the run goes on (default: on for files and modules; registered names always "
              "run here)",
            pytest_help=_ISOLATE.format(unit="test", call_timeout="--attention-call-timeout",
                                        exit="")),
    RunFlag("--call-timeout", "--attention-call-timeout", Kind.NUMBER, metavar="SECONDS",
            cli_help=_CALL.format(calls=" (build, forward, backward)")
            + ", at the largest generated sizes; larger cases get proportionally more (default "
              "%(default)g)",
            pytest_help=_CALL.format(calls="") + " (default 10)"),
    RunFlag("--time-budget", "--attention-time-budget", Kind.NUMBER, metavar="SECONDS",
            cli_help=f"{_BUDGET}: when it runs out the check says how many examples ran, a "
                     "warning (default: 1.2 s per example of the profile, 30 s for quick; 0: no "
                     "limit)",
            pytest_help=f"{_BUDGET}; a check cut short warns, saying how many examples ran "
                        "(default: the profile's, 30 s for quick; 0: none)"),
    RunFlag("--strict", "--attention-strict", Kind.SWITCH,
            cli_help=f"{_STRICT} of the dtype, e.g. float16 overflow at extreme activations) fail "
                     "the run too",
            pytest_help=f"{_STRICT}) fail the test"),
    RunFlag("--expected-failures", "--attention-xfails", Kind.PATH, metavar="FILE",
            cli_help=f"{_TABLES}; those failures don't fail the run, and one that passes does",
            pytest_help=f"expected failures, {_TABLES}"),
    RunFlag("--replay", "--attention-replay", Kind.TEXT, metavar="CASE",
            cli_help="run one --check " + _REPLAY.format(what="report", flag="--replay",
                                                         more="q_len=2, "),
            pytest_help="run the selected checks " + _REPLAY.format(
                what="failure", flag="--attention-replay", more="")),
    RunFlag("--html", "--attention-html", Kind.PATH, metavar="PATH",
            cli_help=_HTML.format(of="", shown="the interface, "),
            pytest_help=_HTML.format(of=" of the run's checks", shown="")),
)}
"""The run options both front ends take, by pytest's name (``--attention-NAME``): the command
line adds each where its ``check`` lists it (:func:`conformance.frontends.cli._parser`), pytest
under its ``attention-conformance`` group (:mod:`conformance.frontends.pytest_plugin`)."""


def argparse_form(name: str) -> tuple[str, dict[str, Any]]:
    """``RUN_FLAGS[name]`` as ``check`` takes it: the flag and argparse's keywords (the command
    line's own defaults and value types are its to add)."""
    flag = RUN_FLAGS[name]
    form: dict[str, Any] = {"help": flag.cli_help}
    if flag.kind is Kind.SWITCH:
        form["action"] = "store_true"
    elif flag.kind is Kind.ON_OFF:
        form.update(action=argparse.BooleanOptionalAction, default=None)
    elif flag.kind is Kind.NUMBER:
        form.update(type=float, default=None)
    elif flag.kind is Kind.PATH:
        form["type"] = Path
    elif flag.kind is Kind.REPEATED and flag.flag.startswith("-"):
        form["action"] = "append"
    if flag.dest:
        form["dest"] = flag.dest
    if flag.metavar:
        form["metavar"] = flag.metavar
    if flag.choices:
        form["choices"] = flag.choices
    return flag.flag, form


def addoption_form(name: str) -> tuple[str, dict[str, Any]]:
    """``RUN_FLAGS[name]`` as pytest takes it: ``--attention-NAME`` and ``addoption``'s
    keywords."""
    flag = RUN_FLAGS[name]
    form: dict[str, Any]
    if flag.kind in (Kind.SWITCH, Kind.ON_OFF):
        form = {"action": "store_true"}
    elif flag.kind is Kind.REPEATED:
        form = {"action": "append", "default": []}
    else:
        form = {"type": float, "default": None} if flag.kind is Kind.NUMBER else {"default": None}
    if flag.choices:
        form["choices"] = flag.choices
    if flag.metavar:
        form["metavar"] = flag.metavar
    form["help"] = flag.pytest_help
    return flag.pytest_flag, form
