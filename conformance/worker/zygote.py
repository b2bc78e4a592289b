"""The zygote: a warm worker template that forks each worker instead of starting an interpreter.

Run as ``python -I -B -m conformance.worker.zygote FD`` by the checker (``warm_start.py``), with
the workers' clean environment and a UNIX socket on fd ``FD``, it imports torch and the worker's modules
once (one torch thread, no parallel region run), checks that it is still one thread (fork is only
safe then), and says so. Then, for each request (the supervisor's configuration, and the
descriptors it would have had: control, status, output, request, reply) it forks a *supervisor*
(``supervisor.py``'s own code: new session, child subreaper) which forks the *worker*. The worker
takes the steps a started one takes before reading a request, with the same code and in the same
order (``Supervisor._exec``): its own session, the rlimits, stdin from ``/dev/null`` and only the
worker's descriptors, the scratch directory, new PID, network, IPC and UTS namespaces where the
launch has them (``supervisor.enter_namespaces``, with a ``/proc`` of the namespace where the
launch has one). Where a started one exec's an interpreter, it takes what that exec would give it
(:func:`run_worker`: the clean environment, fresh randomness, an interpreter's signal dispositions),
then the worker's ``main``: Landlock and seccomp, the unprivileged uid, serving requests.

Nothing untrusted ever runs in the zygote or a supervisor: the submission is imported only by the
forked worker, after every protection is in place. The zygote exits when the checker closes its
socket; supervisors outlive it (each ends with its worker, as a started one does).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import random
import select
import signal
import socket
import sys
import tempfile
import traceback

import torch

import conformance.worker.server as server
import conformance.worker.supervisor as supervisor
from conformance.subject import first_backward

MAX_FDS = 8


def run_worker(config: dict) -> int:
    """The forked worker, after the supervisor's ``_exec`` set its session, rlimits, descriptors,
    directory and namespaces: what a started one's exec gives it, then the worker's ``main``."""
    os.environ.clear()
    os.environ.update(config["env"])
    tempfile.tempdir = None  # TMPDIR is the scratch directory's now
    random.seed()  # a started worker's seed is fresh too
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as a started interpreter has it
    sys.argv = ["conformance.worker", *config["worker_args"]]
    try:
        code = server.main(list(config["worker_args"]))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def _supervise(config: dict, fds: list[int], channels: list[socket.socket]) -> int:
    """The forked supervisor: what ``python supervisor.py CONFIG`` does, on the received fds."""
    for channel in channels:  # the checkers' sockets are the zygote's, never a worker's
        os.close(channel.detach())
    os.setsid()
    control, status, output, request, reply = fds
    config["fds"] = {"1": output, "2": output, "3": request, "4": reply}
    return supervisor.supervise(config, control, status, run_worker)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _reap() -> None:
    for _ in supervisor.reaped():
        pass


def serve(owner: socket.socket) -> None:
    """Answer the checker's requests on ``owner`` (and on every channel it shares, see
    ``warm_start.share``: a fork of a warm ``serve`` forks its workers here too), one at a time;
    end when ``owner`` closes."""
    channels = [owner]
    while True:
        for channel in select.select(channels, [], [])[0]:
            try:
                message, fds, _, _ = socket.recv_fds(channel, 1 << 20, MAX_FDS)
            except OSError:
                message, fds = b"", []
            _reap()
            if not message:
                if channel is owner:
                    return
                channels.remove(channel)  # a sharer ended: the zygote goes on
                channel.close()
                continue
            if not _answer(channel, message, fds, channels):
                return


def _answer(channel: socket.socket, message: bytes, fds: list[int],
            channels: list[socket.socket]) -> bool:
    """One request: a channel to share (``{"share": true}`` and its socket), or a worker's
    supervisor to fork (its configuration and five descriptors). False where the reply can't be
    sent to the owner (the zygote then ends)."""
    try:
        config = json.loads(message)
        if isinstance(config.get("import"), list):
            return _reply(channel, {"imported": _preload(config["import"]),
                                    "threads": _threads()}, channels)
        if config.get("share") is True:
            if len(fds) != 1:
                raise ValueError(f"expected 1 descriptor, got {len(fds)}")
            channels.append(socket.socket(fileno=fds[0]))
            return _reply(channel, {"shared": True}, channels)
        if len(fds) != 5:
            raise ValueError(f"expected 5 descriptors, got {len(fds)}")
        pid = os.fork()
    except (ValueError, OSError, AttributeError) as error:
        for fd in fds:
            os.close(fd)
        return _reply(channel, {"error": str(error)}, channels)
    if pid == 0:
        code = 1
        try:
            code = _supervise(config, fds, channels)
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    return _reply(channel, {"pid": pid}, channels)


def _preload(names: list) -> list[str]:
    """Import the installed modules a checked file imports (``warm_start.preload``, for a warm
    ``serve``: the user's own code, checked in place), so that every worker forked after has
    them; those that import."""
    imported = []
    for name in names:
        try:
            importlib.import_module(str(name))
        except Exception:  # one that does not import here is the worker's to say
            continue
        imported.append(str(name))
    gc.freeze()  # shared with every fork, as the first imports are
    return imported


def _reply(channel: socket.socket, answer: dict, channels: list[socket.socket]) -> bool:
    try:
        channel.sendall(json.dumps(answer).encode() + b"\n")
    except OSError:
        if channel is channels[0]:
            return False
        channels.remove(channel)
        channel.close()
    return True


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the checker decides when to stop
    torch.set_num_threads(1)
    first_backward.import_ahead()  # once here, not in every worker's first gradient check
    # What is imported now is shared with every fork: out of the collector's sight, so that a
    # worker's first collection does not touch (and copy) every page of it.
    gc.freeze()
    channel = socket.socket(fileno=int(sys.argv[1]))
    ready = {"ready": True, "threads": _threads(), "pid": os.getpid()}
    channel.sendall(json.dumps(ready).encode() + b"\n")
    serve(channel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
