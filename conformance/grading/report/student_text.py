"""The suite's messages as a student may read them: none of the grader's paths.

What a user could declare to settle a finding is not in a message but beside it (a Remedy, see
:mod:`conformance.model.remedies`), and a student is never shown it: their interface is the
assignment's. What is left to do here is paths. Paths name the grader's files (its own package,
site-packages, the grading output and staging folders, the Python installation): a student
needs their own file names and lines, so a path to one of their files becomes that file's name
as they submitted it, a path inside an installed package its path within the package
(``torch/nn/functional.py``), a path inside the grader "the grader", and any other path its
last component. Traceback frames in the grader or
the Python installation are dropped; the student's own frames and the libraries' stay.
"""

from __future__ import annotations

import re
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from conformance.errors import clipped

SUITE = str(Path(__file__).resolve().parents[2])
"""The grader's package folder (``conformance/``)."""

STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
"""The Python installation's standard library."""

_PACKAGES = re.compile(r"/(?:site|dist)-packages/")

_FRAME = re.compile(r'^(?P<indent>[ \t]*)File "(?P<path>[^"]+)", line (?P<line>\d+)(?P<rest>.*)$')

_PATH = re.compile(r"(?<![\w.~/-])/(?:[^\s\"'():;,<>/]+/)+[^\s\"'():;,<>/]+(?::\d+)?")
"""An absolute path of two components or more, without spaces or the punctuation that ends a
path in prose, and its ``:line``."""


EXCEPTION_CHARS = 120
"""What a student is shown of an exception's message: its first line, cut at a word past this.
A submission's exception text is a channel into its own feedback (a hostile one raises with a
readable file's contents in its message): the type, the start of the message, and their own
file and line are what they need to fix it; the rest is in the teacher's copy (the class report
and the stored results)."""

LINE_CHARS = 300
"""The longest line of any message a student is shown: the same channel, through a message the
suite makes around the submission's words."""

_EXCEPTION = re.compile(r"(?P<head>(?:raised )?\b[A-Z][A-Za-z0-9_]*(?:Error|Exception|Exit|"
                        r"Warning|Interrupt)): (?P<message>[^\n]+)")
_CUT = " (cut; the whole message is in your teacher's copy)"


def for_student(text: str, files: Sequence[str] = ()) -> str:
    """``text`` in words a student can act on: the grader's paths and traceback frames
    removed, paths to the student's own ``files`` (as submitted, relative) given as those
    names, and what a submission's exception says bounded (see :data:`EXCEPTION_CHARS`)."""
    if not text:
        return text
    return _bounded(_paths(_frames(text, files), files))


def _bounded(text: str) -> str:
    """``text`` with each exception's message cut to EXCEPTION_CHARS and each line to
    LINE_CHARS (at a word, saying so)."""
    def cut(message: str, limit: int) -> str:
        return message if len(message) <= limit else clipped(message, limit) + _CUT

    text = _EXCEPTION.sub(lambda m: f"{m.group('head')}: {cut(m.group('message'), EXCEPTION_CHARS)}",
                          text)
    return "\n".join(cut(line, LINE_CHARS + len(_CUT)) for line in text.split("\n"))


# --------------------------------------------------------------------------------------------
# Paths.


def _own(path: str, files: Sequence[str]) -> str | None:
    """The student's file ``path`` names (the longest that ends it), or None."""
    for name in sorted(files, key=len, reverse=True):
        clean = name.strip("/")
        if clean and (path == clean or path.endswith("/" + clean)):
            return clean
    return None


def _where(path: str, files: Sequence[str]) -> str:
    """What a student is shown for absolute ``path`` (with its ``:line``, if any)."""
    found = re.fullmatch(r"(.*?)(:\d+)?", path)
    path, line = found.group(1), found.group(2) or ""
    if path == SUITE or path.startswith(SUITE + "/"):
        return "the grader"
    return _shown(path, files) + line


def _shown(path: str, files: Sequence[str]) -> str:
    """What a student is shown for absolute ``path`` outside the grader."""
    own = _own(path, files)
    if own is not None:
        return own
    found = _PACKAGES.search(path)
    if found:
        return path[found.end():]
    return path.rstrip("/").rsplit("/", 1)[-1]


def _paths(text: str, files: Sequence[str]) -> str:
    # A student's file name may hold spaces: those paths first, the name matched literally.
    for name in sorted((f.strip("/") for f in files if f.strip("/")), key=len, reverse=True):
        text = re.sub(r"(?<![\w.~/-])/(?:[^\s\"'():;,<>/]+/)+" + re.escape(name)
                      + r"(?![\w.-])", lambda _, name=name: name, text)
    return _PATH.sub(lambda match: _where(match.group(0), files), text)


def _grader_frame(path: str, files: Sequence[str]) -> bool:
    """Whether a traceback frame in ``path`` is the grader's or the Python installation's."""
    if _own(path, files) is not None:
        return False
    if path.startswith("<"):  # <frozen runpy>, <string>: the interpreter's
        return True
    if _PACKAGES.search(path):
        return False  # a library the student's code calls
    return (path == SUITE or path.startswith(SUITE + "/") or path.startswith(STDLIB + "/"))


def _frames(text: str, files: Sequence[str]) -> str:
    """``text`` without the traceback frames in the grader or the Python installation (a
    frame: its ``File "...", line N`` line and the more indented lines under it)."""
    kept: list[str] = []
    dropping: int | None = None
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip(" \t"))
        if dropping is not None:
            if line.strip() and indent > dropping:
                continue
            dropping = None
        frame = _FRAME.match(line)
        if frame and _grader_frame(frame.group("path"), files):
            dropping = len(frame.group("indent"))
            continue
        kept.append(line)
    return "\n".join(kept)
