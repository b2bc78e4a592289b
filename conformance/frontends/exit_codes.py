"""How a command ends: the command line's exit statuses, said once for every command
(``check``, ``bench``, ``grade``, ``serve``), and the one error for its bad input (standard
library and the suite's base error only: the command's entry reads them before it imports
anything heavy)."""

import atexit
import contextlib
import os
import sys
import weakref
from collections.abc import Callable
from typing import NoReturn

from conformance.errors import ConformanceError

EXIT_OK = 0
"""Nothing unexpected: every failure was expected (a mutant's, a declared one), or none."""
EXIT_FAILED = 1
"""An unexpected failure (a check's, a student's submission's grade aside)."""
EXIT_USAGE = 2
"""Bad input, said in one line (an unknown flag, a file that isn't there, nothing checked), or
the suite's own internal error: never a verdict on the code."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as a shell reports it)."""


class UsageError(ConformanceError):
    """Bad input from the user, to any command: printed as one line, exit status
    :data:`EXIT_USAGE`."""


def status_of(command: Callable[[], int]) -> int:
    """``command``'s exit status, its ``SystemExit`` (argparse's usage errors and ``--help``, the
    message said) and Ctrl-C (:data:`EXIT_INTERRUPTED`) included."""
    try:
        return command()
    except SystemExit as done:
        if not isinstance(done.code, int) and done.code is not None:
            print(done.code, file=sys.stderr)
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def finish(code: int, last: Callable[[], None] | None = None) -> NoReturn:
    """End the process with ``code`` without the interpreter's teardown (a third of a second to
    unload torch): output flushed and every exit handler run first (workers stopped, scratch
    folders deleted, zygotes stopped), then ``last``."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    _skip_torch_library_teardown()
    atexit._run_exitfuncs()
    if last is not None:
        last()
    os._exit(code)


def _skip_torch_library_teardown() -> None:
    """torch unregisters each of its operator libraries (about 130) at exit, one finalizer each:
    20 ms of a served check. The process ends with ``os._exit`` next, so nothing would ever see
    them unregistered; the suite's own finalizers (workers, scratch folders) still run."""
    library = sys.modules.get("torch.library")
    teardown = getattr(library, "_del_library", None)
    if teardown is None:
        return
    for finalizer in list(getattr(weakref.finalize, "_registry", ())):
        found = finalizer.peek()
        if found is not None and found[1] is teardown:
            finalizer.atexit = False
