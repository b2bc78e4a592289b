"""How a command ends: the command line's exit statuses, said once for every command
(``check``, ``bench``, ``grade``, ``serve``), and the one error for its bad input (standard
library and the suite's base error only: the command's entry reads them before it imports
anything heavy)."""

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
