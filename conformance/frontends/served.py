"""Handing a ``check`` to a warm ``attention-conformance serve``: the client half (standard library
only: it runs before the command imports torch).

``serve`` (:mod:`conformance.frontends.serve`) keeps torch, the suite and a worker zygote
imported. A ``check`` started where one listens sends it its command line, working directory,
environment and its three standard streams (the descriptors themselves, ``SCM_RIGHTS``); the
server forks a copy of itself that runs the command as this process would have, writing to this
terminal, and this process waits for its exit status, passing Ctrl-C on. Where none listens (no
socket, a refused connection, a server of another installation or of other settings) nothing is
sent and the command runs here, as before: serving changes how soon a check starts, never what it
says.

The socket lives in a folder only this user may enter (``$XDG_RUNTIME_DIR`` or
``/tmp/attention-conformance-UID``, mode 0700, refused when another user owns it), is named for the
installation (its interpreter and package: two virtual environments have two servers), and the
server answers only its own user (``SO_PEERCRED``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import stat
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

SWITCH = "ATTENTION_CONFORMANCE_SERVE"
"""``0``: never hand a command to a server (run it in this process)."""

FIXED_AT_IMPORT = ("ATTENTION_CONFORMANCE_", "HYPOTHESIS", "TORCH", "PYTORCH", "OMP_", "MKL_",
                   "CUDA_", "PYTHON", "LD_", "TRITON")
"""Prefixes of environment variables read when the suite or torch is imported: a server started
under other values of these would not run a command as this process would, so it refuses it."""

SERVED = ("check",)
"""The commands a server runs (``--watch`` keeps its own warm process)."""


def installation_key() -> str:
    """What tells two installations apart: this interpreter and this ``conformance`` package
    (``warm_start.SUITE``: imported here, where a server is about to be asked, not before)."""
    from conformance.worker.warm_start import SUITE

    return hashlib.sha256(f"{sys.executable}\0{SUITE}".encode()).hexdigest()[:12]


def runtime_dir() -> Path:
    """This user's folder for the socket (not created here)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _private(Path(runtime)):
        return Path(runtime) / "attention-conformance"
    return Path(f"/tmp/attention-conformance-{os.getuid()}")


def socket_path() -> Path:
    """Where this installation's server listens."""
    return runtime_dir() / f"serve-{installation_key()}.sock"


def _private(path: Path) -> bool:
    """Whether ``path`` is a real folder of this user that no one else may enter."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & 0o077)


def fixed_environment(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The variables of ``environ`` a server must share with its clients (FIXED_AT_IMPORT)."""
    return {k: v for k, v in environ.items() if k.startswith(FIXED_AT_IMPORT)}


class _Lines:
    """The JSON lines the server sends, one at a time (a Ctrl-C while waiting for one loses
    nothing of what was read)."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.buffer = b""

    def next(self) -> dict | None:
        """The next line, or None once the server closed the connection."""
        while b"\n" not in self.buffer:
            chunk = self.connection.recv(1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return None


def hand_over(argv: Sequence[str]) -> int | None:
    """The exit status of ``argv`` as a server ran it, or None where no server took it (then
    nothing of it ran anywhere)."""
    if os.environ.get(SWITCH) == "0" or not argv or argv[0] not in SERVED or "--watch" in argv:
        return None
    path = socket_path()
    if not _private(path.parent):
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(path))
        request = json.dumps({"key": installation_key(), "argv": list(argv), "cwd": os.getcwd(),
                              "env": dict(os.environ)}).encode() + b"\n"
        sent = socket.send_fds(connection, [request], [0, 1, 2])
        connection.sendall(request[sent:])
        return _wait(connection)
    except OSError:
        return None
    finally:
        connection.close()


def _wait(connection: socket.socket) -> int | None:
    """Follow a handed-over command to its end: its pid first (None: refused), then its status;
    Ctrl-C here interrupts it there."""
    lines = _Lines(connection)
    interrupted = False
    while True:
        try:
            first = lines.next()
            break
        except KeyboardInterrupt:
            # Before the server said whose it is: the copy it is about to start must not go on
            # alone, printing to this terminal; it is interrupted as soon as it is known. A
            # second Ctrl-C stops waiting (a server that never answers can't hold the terminal).
            if interrupted:
                raise
            interrupted = True
    if not first or "pid" not in first:
        if interrupted:
            raise KeyboardInterrupt  # refused: nothing ran, and nothing should run here now
        return None
    pid = int(first["pid"])
    if interrupted:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)
    while True:
        try:
            last = lines.next()
            break
        except KeyboardInterrupt:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGINT)
    if last is None or "exit" not in last:
        print("attention-conformance: the server's copy running this check ended without a "
              "status (killed?)", file=sys.stderr)
        return 1
    return int(last["exit"])


def peer_uid(connection: socket.socket) -> int:
    """The uid of the process at the other end of a UNIX socket (``SO_PEERCRED``)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                        struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]
