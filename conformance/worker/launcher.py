"""The one way a worker's supervisor is started: forked by the zygote, or started cold.

:func:`start` takes the launch plan (``sandbox.py``) and the worker's three pipes, and returns
the supervisor behind one handle (:class:`SupervisorHandle`) and whether it was forked; the checker
(``process.py``) uses the handle the same way whichever it was, and never branches on it.

Both ways run the same code from the same configuration (built here, once): the supervisor's
(``supervisor.py``: new session, child subreaper, kills the whole tree at the end, reports how
the worker ended on its status pipe) and the worker's first steps (session, rlimits, descriptors,
scratch directory, and the namespaces, entered by ``supervisor.enter_namespaces`` in both). They
differ in one choice, made by :func:`_warm`, and in the worker's last step:

- forked by this process's zygote (``warm_start.py``, ``zygote.py``): a fork of a process that
  has imported torch, milliseconds; the worker runs the server it already has;
- started: ``python -I -S supervisor.py CONFIG``, whose worker exec's the plan's ``argv`` (an
  interpreter and ``import torch``, about a second of CPU).

A worker is forked where every protection of its tier is a system call the supervisor's code
makes (``landlock``, ``unshare``, ``none``; bubblewrap sets up its namespaces and mounts itself,
before Python, so its workers are started), warm start is on (``ATTENTION_CONFORMANCE_WARM_START``
is not ``0``) and the zygote is alive and one thread; otherwise, or where the zygote refuses or
dies on the way, it is started.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, NamedTuple, Protocol

import conformance.worker.warm_start as warm_start
from conformance.worker.sandbox import SUPERVISOR, Launch


class SupervisorHandle(Protocol):
    """A worker's supervisor, as the checker sees it (:class:`subprocess.Popen`'s names):
    closing ``stdin`` (the control pipe) stops the worker and kills its tree, ``stdout`` carries
    the JSON status lines, ``poll`` and ``wait`` tell when it has ended, ``kill`` ends it."""

    pid: int
    stdin: IO[bytes] | None
    stdout: IO[bytes] | None
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class Started(NamedTuple):
    """What :func:`start` started, and how."""

    supervisor: SupervisorHandle
    forked: bool
    """Whether the zygote forked it (a warm start), rather than it being started."""


def start(launch: Launch, *, remove: Path, output: int, request: int, reply: int) -> Started:
    """The supervisor of a worker launched as ``launch`` plans, on the worker's ends of its
    pipes (``output``: stdout and stderr; ``request``, ``reply``: fds 3 and 4; the caller closes
    its copies); ``remove`` is deleted when the worker's tree is gone."""
    config = {"argv": launch.argv, "env": launch.env, "cwd": launch.cwd,
              "rlimits": launch.rlimits, "remove": str(remove),
              "namespaces": launch.namespaces, "fresh_proc": launch.fresh_proc,
              "worker_args": list(launch.worker_args),
              "fds": {"1": output, "2": output, "3": request, "4": reply}}
    forked = _forked(launch, config, [output, request, reply]) if _warm(launch) else None
    return forked or Started(subprocess.Popen(
        [sys.executable, "-I", "-S", str(SUPERVISOR), json.dumps(config)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=output,
        pass_fds=(request, reply, output), start_new_session=True, env={}), forked=False)


def _warm(launch: Launch) -> bool:
    """Whether the zygote may fork this worker: every protection of its tier is made by the
    supervisor's code (bubblewrap's namespaces and mounts are bubblewrap's own), and warm start
    is on."""
    return launch.sandbox != "bwrap" and warm_start.enabled()


def _forked(launch: Launch, config: dict, fds: list[int]) -> Started | None:
    """The supervisor forked by this process's zygote; None where there is none, or it refused."""
    zygote = warm_start.shared(launch.env)
    if zygote is None:
        return None
    control_r, control_w = os.pipe()
    status_r, status_w = os.pipe()
    try:
        pid = zygote.fork(config, [control_r, status_w, *fds])
    finally:
        close_quietly(control_r, status_w)
    if pid is None:
        close_quietly(control_w, status_r)
        return None
    return Started(ForkedSupervisor(pid, control_w, status_r), forked=True)


def close_quietly(*fds: int) -> None:
    """Close ``fds``, those already closed too."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class ForkedSupervisor:
    """A forked supervisor, seen as :class:`subprocess.Popen` sees a started one (the
    :class:`SupervisorHandle` names). It is the zygote's child, not ours: it has ended when its
    process is gone (its pidfd is readable), and nothing here reaps it."""

    def __init__(self, pid: int, control: int, status: int) -> None:
        self.pid = pid
        self.stdin = os.fdopen(control, "wb", buffering=0)
        self.stdout = os.fdopen(status, "rb", buffering=0)
        self.returncode: int | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = -1  # already gone (or no pidfd): kill falls back to nothing

    def poll(self) -> int | None:
        if self.returncode is None and self._pidfd >= 0 \
                and select.select([self._pidfd], [], [], 0)[0]:
            self._ended()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if self._pidfd >= 0 and not select.select([self._pidfd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("supervisor", timeout or 0.0)
            self._ended()
        return self.returncode or 0

    def kill(self) -> None:
        if self.returncode is None and self._pidfd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _ended(self) -> None:
        self.returncode = 0
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
