"""The ``attention-conformance`` command's entry: start what can start early, run the CLI, exit.

A ``check`` is first offered to a warm ``attention-conformance serve`` of this installation
(``served.py``, standard library only: nothing heavy is imported for the offer); where one takes
it, its exit status is this command's. ``serve`` itself starts here (``serve.py``).

Checking a user's file or grading runs student code in workers forked by a zygote
(``conformance.worker.warm_start``); the zygote imports torch as the CLI does, so it is started
before the CLI's own imports, and the two imports share the cores instead of taking turns. Only
the command line is read here (a guess that costs nothing when wrong: an unused zygote exits
with the command); the CLI decides everything else.

The command then ends without the interpreter's teardown, which takes a third of a second to
unload torch: output flushed and every exit handler run (workers stopped, scratch folders
deleted, zygotes stopped) first.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence

from conformance.frontends.exit_codes import finish, status_of


def _will_fork_workers(argv: Sequence[str]) -> bool:
    """``grade`` in a sandbox (its jobs are threads sharing one zygote), or ``check`` of a file or
    module (isolated unless told not) in this process: several checked side by side run in
    processes of their own, each with its own zygote."""
    if not argv:
        return False
    if argv[0] == "grade":
        return "--no-sandbox" not in argv and "--merge" not in argv
    if argv[0] != "check" or "--no-isolate" in argv:
        return False
    # Here, not at the top: a check a server takes never needs it (nor its 10 ms of imports).
    from conformance.frontends.run_flags import jobs_said
    from conformance.model.target_spec import TargetSpec

    # A file (``path.py``, ``path.py::Attr``) or a dotted module (``pkg.mod:Attr``); an option's
    # value such as ``--mask keep_bool:broadcast`` is not one (a top-level ``mod:Attr`` is
    # missed: it is then checked as fast as before the warm start, no slower).
    located = [arg for arg in argv[1:] if not arg.startswith("-") and TargetSpec.looks_located(arg)]
    return len(located) == 1 or (len(located) > 1 and jobs_said(argv) == "1")


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments == ["--version"]:  # a string: not worth a second of importing torch and the suite
        from conformance._version import VERSION_LINE

        print(VERSION_LINE)
        return 0
    if arguments[:1] == ["serve"]:
        from conformance.frontends.serve import run as serve

        return serve()
    # A warm ``serve`` runs it where one listens (served.py); else it runs here.
    from conformance.frontends import served

    status = served.hand_over(arguments)
    if status is not None:
        return status
    if _will_fork_workers(arguments):
        from conformance.worker import warm_start

        warm_start.prestart()
    from conformance.frontends.cli import main as cli_main

    # What is imported now (torch, the suite) lives as long as the command: out of the
    # collector's sight, so that no collection during the checks walks it again (a full one
    # takes a tenth of a second with torch loaded; hypothesis asks for one per process).
    gc.freeze()
    return cli_main(arguments)


def run() -> None:
    """``attention-conformance``: :func:`main` on the command line, then exit with its status."""
    finish(status_of(main))
