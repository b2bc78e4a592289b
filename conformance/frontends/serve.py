"""``attention-conformance serve``: a warm process that runs this user's ``check`` commands.

A cold ``check`` spends most of its time before checking anything: an interpreter, ``import
torch`` and the suite, a worker zygote importing torch again. ``serve`` pays that once and
listens on a UNIX socket (:mod:`conformance.frontends.served`, the client half); each ``check``
started while it runs hands its command over, and the server forks a copy of itself that becomes
that command: its working directory, environment and standard streams (the client's own
descriptors), its workers forked by the server's own warm zygote through a channel of its own
(:func:`~conformance.worker.warm_start.share`), its exit status sent back. The installed packages
the files a command names import (their source read, never run: transformers, say) are imported
by that zygote first, so its workers have them too. The copy runs exactly the command's
code path (``cli.main``, as ``entry.main`` calls it), so verdicts, output and exit codes are those
of a check run cold.

Nothing runs in the server itself but the imports: it forks only while it runs one Python thread
and CUDA is not started (``run.shared.forkable``, what the checker's own forks require; torch runs
no parallel region here), and each command's state dies with its copy. It refuses (and the
client runs the command itself) a command of another installation, one whose environment
differs in what is read at import (``served.FIXED_AT_IMPORT``), and every command once the
suite's sources changed since it started (an upgrade in place, an edit: it would run the code it
imported then, :func:`suite_sources`). It serves only its own user and
stops on Ctrl-C (the checks running finish on their own).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import select
import signal
import socket
import sys
import tempfile
import time
import traceback
from typing import Any, TextIO

import conformance.frontends.served as served
from conformance.frontends.exit_codes import EXIT_USAGE, finish, status_of
from conformance.frontends.imports_ahead import installed_imports
from conformance.run.shared import forkable

POLL_SECONDS = 1.0
"""How often the server looks for ended commands while none arrives (to say how each ended)."""


class ServeError(Exception):
    """The server can't listen here; one line."""


def _listen() -> tuple[socket.socket, str]:
    path = served.socket_path()
    folder = path.parent
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    if not served._private(folder):
        raise ServeError(f"{folder} is not a folder of this user that no one else may enter: "
                         "remove it, or set XDG_RUNTIME_DIR to a private folder")
    if path.exists():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            raise ServeError(f"a server already listens at {path}")
        except OSError:
            path.unlink()  # a server that ended without removing it
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    return listener, str(path)


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """A client's request (its JSON line) and its three standard streams."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("a request without its three standard streams")
    while not data.endswith(b"\n"):
        chunk = connection.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    return json.loads(data), fds


def suite_sources() -> tuple[int, int]:
    """The suite's Python sources as they are now: how many, and the latest change (ns). A
    server runs the code it imported when it started; an upgrade or an edit since (same
    installation, same path) changes this."""
    from conformance.worker.warm_start import SUITE

    count = latest = 0
    for folder, _, files in os.walk(SUITE):
        for name in files:
            if name.endswith(".py"):
                with contextlib.suppress(OSError):
                    latest = max(latest, os.stat(os.path.join(folder, name)).st_mtime_ns)
                    count += 1
    return count, latest


_SOURCES_AT_START: tuple[int, int] | None = None
"""``suite_sources()`` when this server started (None: not a server)."""


def refusal(request: dict[str, Any]) -> str | None:
    """Why this server must not run ``request`` (its client then runs it itself), or None."""
    if request.get("key") != served.installation_key():
        return "another installation's command"
    if _SOURCES_AT_START is not None and suite_sources() != _SOURCES_AT_START:
        return "the suite's code changed since this server started (restart it)"
    argv = request.get("argv") or [""]
    if argv[0] not in served.SERVED:
        return f"{argv[0]!r} is not served"
    theirs = served.fixed_environment(request.get("env", {}))
    ours = served.fixed_environment(os.environ)
    differ = sorted(name for name in set(theirs) | set(ours) if theirs.get(name) != ours.get(name))
    if differ:
        return f"started under other settings ({', '.join(differ[:3])})"
    return None


def _become(request: dict[str, Any], fds: list[int], connection: socket.socket,
            listener: socket.socket, zygote) -> None:
    """In the fork: become the client's command, run it, send its status, end."""
    from conformance.frontends.cli import main
    from conformance.worker import warm_start

    def command() -> int:
        listener.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout = open(1, "w", buffering=1 if os.isatty(1) else -1, encoding="utf-8",  # noqa: SIM115
                          errors="backslashreplace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8",  # noqa: SIM115
                          errors="backslashreplace", closefd=False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None
        random.seed()
        sys.argv = ["attention-conformance", *request["argv"]]
        if zygote is not None:
            warm_start.adopt(zygote)
        connection.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        gc.freeze()  # as the command's entry does (frontends/entry.py)
        return main(request["argv"])

    def tell(code: int) -> None:
        with contextlib.suppress(OSError):
            connection.sendall(json.dumps({"exit": code}).encode() + b"\n")

    code = 1
    try:
        code = status_of(command)
    except BaseException:  # as an interpreter would say it: this fork must still report and end
        traceback.print_exc()
    finally:
        finish(code, lambda: tell(code))


def _take(connection: socket.socket, listener: socket.socket,
          running: dict[int, tuple[list[str], float]], log: TextIO,
          preloaded: set[str]) -> None:
    """One client: refused, or forked to run its command."""
    from conformance.worker import warm_start

    fds: list[int] = []
    try:
        if served.peer_uid(connection) != os.getuid():
            return
        request, fds = _receive(connection)
        why = refusal(request) or (None if forkable() else
                                   "the server is not one thread (a fork is safe in one)")
        if why is not None:
            connection.sendall(json.dumps({"refused": why}).encode() + b"\n")
            print(f"refused: {why}", file=log, flush=True)
            return
        wanted = [name for name in installed_imports(request["argv"], request["cwd"])
                  if name not in preloaded]
        if wanted:
            done = warm_start.preload(wanted)
            preloaded.update(wanted)  # tried once: a failure (a stopped zygote) is not retried
            print(f"imported ahead, for every worker: {', '.join(done) or 'none'}", file=log,
                  flush=True)
        zygote = warm_start.share()  # the server's own zygote, through a channel for the fork
        pid = os.fork()
        if pid == 0:
            _become(request, fds, connection, listener, zygote)
        running[pid] = (request["argv"], time.monotonic())
        if zygote is not None:
            zygote.channel.close()  # the fork's now
    except (OSError, ValueError) as error:
        print(f"a request could not be read: {error}", file=log, flush=True)
    finally:
        for fd in fds:
            os.close(fd)
        connection.close()


def _reap(running: dict[int, tuple[list[str], float]], log: TextIO) -> None:
    """Collect every ended child (the commands), saying how each ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in running:
            argv, started = running.pop(pid)
            print(f"{' '.join(argv)}: exit {os.waitstatus_to_exitcode(status)} in "
                  f"{time.monotonic() - started:.2f} s", file=log, flush=True)


def run() -> int:
    """The ``serve`` command: :func:`serve`, or one line saying why it can't listen (exit 2)."""
    try:
        return serve()
    except ServeError as error:
        print(f"attention-conformance: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def serve(log: TextIO = sys.stdout) -> int:
    """Listen until Ctrl-C; every ``check`` of this installation and user runs warm meanwhile."""
    import conformance.frontends.cli  # noqa: F401  (torch and the suite: what every command imports)
    from conformance.subject import first_backward
    from conformance.worker import sandbox, warm_start

    # What a check imports on its way (torch's on a first backward pass; hypothesis' numpy
    # seeding): once here, not in every command.
    first_backward.import_ahead()
    import numpy.random  # noqa: F401

    # Which sandboxes work here: three probes, each a process (about 70 ms), cached per process,
    # so every fork would run them again before its first worker.
    sandbox.available()

    global _SOURCES_AT_START
    _SOURCES_AT_START = suite_sources()
    listener, path = _listen()
    running: dict[int, tuple[list[str], float]] = {}
    preloaded: set[str] = set()
    # Ctrl-C stops it whatever its parent did (a background job of a script ignores SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        warm_start.prestart()
        gc.freeze()  # what a fork shares stays shared
        print(f"serving at {path} (pid {os.getpid()}): `attention-conformance check ...` of this "
              "installation now starts warm; Ctrl-C stops", file=log, flush=True)
        while True:
            readable = select.select([listener], [], [], POLL_SECONDS)[0]
            _reap(running, log)
            if readable:
                connection, _ = listener.accept()
                _take(connection, listener, running, log, preloaded)
    except KeyboardInterrupt:
        return 0
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
