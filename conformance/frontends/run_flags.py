"""The run's options as the front ends spell them, said once; standard library only.

The command's entry reads ``--jobs`` here before torch is imported
(:mod:`conformance.frontends.entry`), and ``check`` and ``grade`` turn it into processes here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


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

