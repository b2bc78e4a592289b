"""The checker's side of the zygote (``zygote.py``): start it once, have it fork each worker.

A started worker costs an interpreter and ``import torch`` (about a second of CPU); a forked one
costs a fork. The zygote is started the first time a worker is wanted, with the workers' clean
environment, and lives as long as this process (it exits when its socket closes). Whether a
worker is forked or started is the launcher's one choice (``launcher.py``): forked where its
tier's protections are all made by the supervisor's code (not bubblewrap's), this zygote is
alive and one thread, and ``ATTENTION_CONFORMANCE_WARM_START`` is not ``0`` (measuring the
difference); the fork runs the same supervisor code a started worker's does.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

START_SECONDS = 60.0
"""The zygote's own start: an interpreter and ``import torch`` (a second idle; the limit is for a
loaded machine). A worker's start limit still applies to the worker."""

FORK_SECONDS = 10.0
"""One fork request: milliseconds when the zygote is alive."""

SWITCH = "ATTENTION_CONFORMANCE_WARM_START"


SUITE = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The ``conformance`` package this process runs."""

_BOOTSTRAP = """import importlib.util, os, runpy, sys
found = importlib.util.find_spec("conformance")
if found is None or {suite!r} not in map(os.path.realpath, found.submodule_search_locations):
    sys.path.insert(0, os.path.dirname({suite!r}))
runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
"""


def suite_command(module: str, *args: str) -> list[str]:
    """``python -I -B -m module args``, running this process's ``conformance`` package: an
    isolated interpreter ignores ``PYTHONPATH`` and the working directory, so where the package
    is found only through them (a source checkout), its folder goes first on the path (as
    ``-m`` would put it, nothing else of the environment)."""
    return [sys.executable, "-I", "-B", "-c", _BOOTSTRAP.format(suite=SUITE, module=module),
            *args]


def base_environment() -> dict[str, str]:
    """Every worker's clean environment, but its own HOME and TMPDIR (the zygote's)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    if "LD_LIBRARY_PATH" in os.environ:  # some installations need it to find torch's libraries
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env



def json_line(buffer: bytes, receive: Callable[[float], bytes | None],
              deadline: float) -> tuple[dict[str, Any] | None, bytes]:
    """The next JSON line of a stream and what is left of ``buffer``: ``receive(seconds_left)``
    brings more bytes (``b""``: nothing yet, None: the stream ended). None for the line at the
    end of the stream, at the ``deadline``, or where the line is not JSON. The one reader of the
    workers' JSON lines (the supervisor's status, the zygote's answers)."""
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, buffer
        chunk = receive(left)
        if chunk is None:
            return None, buffer
        buffer += chunk
    line, _, buffer = buffer.partition(b"\n")
    try:
        return json.loads(line), buffer
    except ValueError:
        return None, buffer


class Zygote:
    """One zygote process, and the requests to fork from it (one at a time)."""

    def __init__(self, env: dict[str, str]) -> None:
        self._lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = subprocess.Popen(
                suite_command("conformance.worker.zygote", str(theirs.fileno())),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), start_new_session=True, env=env)
        finally:
            theirs.close()
        self.channel = ours
        self._buffer = b""
        self.ready: dict[str, Any] = {}
        self.alive = True
        self.key = ""
        """Its key among this process's zygotes (the environment it was started with; set by
        ``_zygote``, carried by a shared handle)."""

    def wait_ready(self) -> bool:
        """Whether the zygote started, is one thread, and answered within START_SECONDS (asked
        once: later calls return what the first found)."""
        with self._lock:
            if self.ready or not self.alive:
                return self.alive
            self.ready = self._line(time.monotonic() + START_SECONDS) or {}
            if not self.ready.get("ready") or self.ready.get("threads") != 1:
                self.close()
            return self.alive

    def fork(self, config: dict[str, Any], fds: list[int]) -> int | None:
        """The pid of a supervisor forked with ``config`` and ``fds`` (control, status, output,
        request, reply); None when the zygote is gone or refused (the launcher starts the worker
        instead)."""
        answer = self.ask(config, fds)
        return None if answer is None else answer.get("pid")

    def ask(self, request: dict[str, Any], fds: Sequence[int] = (),
            seconds: float = FORK_SECONDS) -> dict[str, Any] | None:
        """The zygote's answer to one request (with ``fds`` passed along), one at a time; None,
        and this handle closed, where it is gone or gave none within ``seconds``."""
        with self._lock:
            if not self.alive:
                return None
            try:
                socket.send_fds(self.channel, [json.dumps(request).encode()], list(fds))
                answer = self._line(time.monotonic() + seconds)
            except OSError:
                answer = None
            if answer is None:
                self.close()
            return answer

    def _line(self, deadline: float) -> dict[str, Any] | None:
        def receive(left: float) -> bytes | None:
            if not select.select([self.channel], [], [], left)[0]:
                return None
            try:
                return self.channel.recv(1 << 16) or None
            except OSError:
                return None

        found, self._buffer = json_line(self._buffer, receive, deadline)
        return found

    @classmethod
    def sharing(cls, channel: socket.socket, owner: Zygote) -> Zygote:
        """A handle on ``owner``'s zygote through a channel of its own (:func:`share`): it
        forks workers as the owner's does; closing it leaves the zygote to its owner."""
        shared = cls.__new__(cls)
        shared._lock = threading.Lock()
        shared.process, shared.channel, shared._buffer = None, channel, b""
        shared.ready, shared.alive, shared.key = dict(owner.ready), True, owner.key
        return shared

    def close(self) -> None:
        """Stop the zygote: nothing of it needs an orderly end (what it forked lives on its
        own), so it is killed rather than waited for while it tears torch down."""
        self.alive = False
        with contextlib.suppress(OSError):
            self.channel.close()
        if self.process is None:  # a shared handle: the zygote is its owner's
            return
        with contextlib.suppress(OSError):
            self.process.kill()
        self.process.wait()


_zygotes: dict[str, Zygote] = {}
_zygotes_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get(SWITCH, "1") != "0"


def _zygote(env: dict[str, str]) -> Zygote:
    base = {k: v for k, v in env.items() if k not in ("HOME", "TMPDIR")}
    key = json.dumps(base, sort_keys=True)
    with _zygotes_lock:
        if key not in _zygotes:
            _zygotes[key] = Zygote(base)
            _zygotes[key].key = key
        return _zygotes[key]


def share() -> Zygote | None:
    """A channel of its own to this process's zygote (started if need be, waited for), for a
    fork of this process to fork its workers through (:func:`adopt` it there): the zygote stays
    this process's, and serves every channel it was given. None where it can't be had (a new one
    is started next time)."""
    zygote = _zygote(base_environment())
    if not zygote.wait_ready():
        _drop(zygote)
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        answer = zygote.ask({"share": True}, [theirs.fileno()])
    finally:
        theirs.close()
    if not answer or not answer.get("shared"):
        ours.close()
        return None
    return Zygote.sharing(ours, zygote)


def preload(modules: list[str]) -> list[str]:
    """Have this process's zygote import ``modules`` (installed packages only: the caller's to
    choose), so that every worker it forks after has them; those it imported. A zygote that runs
    more than one thread after them can't fork safely: it is stopped (a new one starts when
    next wanted)."""
    zygote = _zygote(base_environment())
    if not modules or not zygote.wait_ready():
        return []
    answer = zygote.ask({"import": list(modules)}, seconds=START_SECONDS)
    if not answer or answer.get("threads") != 1:
        _drop(zygote)
        return []
    return list(answer.get("imported", []))


def _drop(zygote: Zygote) -> None:
    """Stop ``zygote`` and forget it: the next worker wanted starts a new one."""
    with _zygotes_lock:
        _zygotes.pop(zygote.key, None)
    zygote.close()


def adopt(zygote: Zygote) -> None:
    """In a fork: take ``zygote`` (a :func:`share` made before the fork) as this process's."""
    with _zygotes_lock:
        _zygotes[zygote.key] = zygote


def prestart() -> None:
    """Start this process's zygote now, without waiting for it: it imports torch while this
    process does (two cores' worth), and the first worker is forked when both are done."""
    if enabled():
        _zygote(base_environment())


def shared(env: dict[str, str]) -> Zygote | None:
    """This process's zygote for workers of environment ``env`` (HOME and TMPDIR aside: each
    worker sets its own); started on first use; None when it can't fork workers here."""
    zygote = _zygote(env)
    return zygote if zygote.wait_ready() else None


def zygote_pids() -> set[int]:
    """The pids of this process's live zygotes (long-lived by design: no worker's leftover)."""
    with _zygotes_lock:
        return {z.process.pid for z in _zygotes.values() if z.alive and z.process is not None}


def _forget_in_child() -> None:
    """A fork of this process (a multiprocessing worker) starts its own zygote if it needs one:
    requests of two processes on one socket would interleave, and the zygote is not its to stop."""
    global _zygotes_lock
    _zygotes.clear()
    _zygotes_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def close_all() -> None:
    """Stop every zygote of this process (their workers are not affected)."""
    with _zygotes_lock:
        for zygote in _zygotes.values():
            zygote.close()
        _zygotes.clear()
