"""The root of the suite's exceptions: every error it raises for a user is a :class:`ConformanceError`.

Each layer defines its own errors where they arise (a declaration that can't be read, an IMPL that
names nothing, a rubric, a worker that crashed, ...), all subclasses of this one, so a program that
drives the suite can catch them in one clause. Their message is one line for the user. Where an
error also is a standard one (a bad value is a ``ValueError``), it subclasses both.
"""

from __future__ import annotations


class ConformanceError(Exception):
    """An error of the suite's, for a user: what went wrong, in one line."""


class SuiteError(ConformanceError):
    """The suite itself failed while checking (its own defect, not the implementation's): no
    verdict where it happened. Raised where a front end must not report it as a failure of the
    implementation (pytest); please report it."""


def clipped(text: str, limit: int) -> str:
    """``text``'s first line, cut at a word (with an ellipsis) where longer than ``limit``: no
    message is cut mid-word."""
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    if len(line) <= limit:
        return line
    cut = line[:limit].rsplit(" ", 1)[0] if " " in line[:limit] else line[:limit]
    return cut.rstrip(" ,;:") + "…"


def one_line(error: BaseException, limit: int | None = None) -> str:
    """``Type: first line`` of ``error`` (its message clipped to ``limit``, see :func:`clipped`)."""
    text = str(error)
    line = clipped(text, limit) if limit is not None else (text.strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {line}".rstrip(": ")


def raised_by_its_code(error: BaseException) -> str | None:
    """Where ``error`` was raised in code the suite called (``file:line`` of the deepest frame
    outside the suite, torch and the standard library, below the suite's last frame), or None
    where it is the suite's own (raised in the suite, or in torch called by the suite itself)."""
    import os
    import sysconfig
    import traceback

    here = os.path.dirname(os.path.abspath(__file__))
    library = {os.path.abspath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}
    frames = traceback.extract_tb(error.__traceback__)
    last_ours = max((i for i, f in enumerate(frames) if os.path.abspath(f.filename).startswith(
        here + os.sep)), default=-1)

    def its_own(filename: str) -> bool:
        path = os.path.abspath(filename)
        return not (path.startswith(here + os.sep) or f"{os.sep}torch{os.sep}" in path
                    or any(path.startswith(lib + os.sep) for lib in library))

    theirs = [f for f in frames[last_ours + 1:] if its_own(f.filename)]
    return f"{os.path.basename(theirs[-1].filename)}:{theirs[-1].lineno}" if theirs else None
