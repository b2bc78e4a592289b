"""The zygote: a warm worker template that forks each worker instead of starting an interpreter.

Run as ``python -I -B -m conformance.worker.zygote FD`` by the checker (``warm_start.py``), with
the workers' clean environment and a UNIX socket on fd ``FD``, it imports torch and the worker's modules
once (one torch thread, no parallel region run), checks that it is still one thread (fork is only
safe then) and whether it may create namespaces, and says so. Then, for each request (the
supervisor's configuration, and the descriptors it would have had: control, status, output,
request, reply) it forks a *supervisor* (``supervisor.py``'s own code: new session, child
subreaper) which forks the *worker*. The worker does what a started one does before reading a
request, in the same order: its own session, the rlimits, stdin from ``/dev/null`` and only the
worker's descriptors, the clean environment and scratch directory, new PID, network, IPC and UTS
namespaces where the launch has them (it becomes their init's parent, and mirrors how it ended;
the init mounts a ``/proc`` of the namespace where the launch has one), then the worker's
``main``: Landlock and seccomp, the unprivileged uid, serving requests.

Nothing untrusted ever runs in the zygote or a supervisor: the submission is imported only by the
forked worker, after every protection is in place. The zygote exits when the checker closes its
socket; supervisors outlive it (each ends with its worker, as a started one does).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import random
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
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER = 0x04000000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
PR_SET_PDEATHSIG = 1
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
WORKER_FDS = 5
"""A forked worker keeps fds 0-4 (stdin, output twice, requests, replies), as a started one."""

_libc = ctypes.CDLL(None, use_errno=True)


def _unshare_namespaces(fresh_proc: bool) -> None:
    """New PID, network, IPC and UTS namespaces for the next child (as root; otherwise inside a
    new user namespace mapping this uid to its root, as ``unshare --map-root-user`` does), and a
    mount namespace of its own where it gets a fresh ``/proc`` (:func:`_mount_proc`)."""
    uid, gid = os.getuid(), os.getgid()
    flags = NAMESPACES | (CLONE_NEWNS if fresh_proc else 0) | (CLONE_NEWUSER if uid else 0)
    if _libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare: " + os.strerror(ctypes.get_errno()))
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                           ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)


def _mount_proc() -> None:
    """In the new PID namespace's first process: ``/proc`` shows that namespace only (as
    ``unshare --mount-proc``), the change kept from the host (mounts made private first)."""
    for source, target, kind, flags in ((None, b"/", None, MS_REC | MS_PRIVATE),
                                        (b"proc", b"/proc", b"proc",
                                         MS_NOSUID | MS_NODEV | MS_NOEXEC)):
        if _libc.mount(source, target, kind, flags, None) != 0:
            raise OSError(ctypes.get_errno(), "mount: " + os.strerror(ctypes.get_errno()))


def _mirror(child: int) -> int:
    """Wait for ``child`` and end as it ended (``unshare --fork --kill-child`` does the same)."""
    for fd in range(WORKER_FDS):  # only the child holds the pipes: its death closes them
        os.close(fd)
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if code < 0:  # killed by signal -code: be killed by it too
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def run_worker(config: dict) -> int:
    """The forked worker, after the supervisor's ``_exec`` set its session, rlimits, descriptors
    and directory: the environment, namespaces, then the worker's own ``main``."""
    os.closerange(WORKER_FDS, os.sysconf("SC_OPEN_MAX"))
    os.environ.clear()
    os.environ.update(config["env"])
    tempfile.tempdir = None  # TMPDIR is the scratch directory's now
    random.seed()  # a started worker's seed is fresh too
    if config.get("namespaces"):
        _unshare_namespaces(config.get("fresh_proc", False))
        child = os.fork()
        if child:
            return _mirror(child)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if config.get("fresh_proc"):
            _mount_proc()
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


def _supervise(config: dict, fds: list[int], channel: socket.socket) -> int:
    """The forked supervisor: what ``python supervisor.py CONFIG`` does, on the received fds."""
    os.close(channel.detach())  # the checker's socket is the zygote's, never a worker's
    os.setsid()
    control, status, output, request, reply = fds
    config["fds"] = {"1": output, "2": output, "3": request, "4": reply}
    return supervisor.supervise(config, control, status, run_worker)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _can_unshare(fresh_proc: bool) -> bool:
    """Whether a forked worker can create its namespaces (and mount a fresh ``/proc`` in them)
    here: tried in a throwaway child and grandchild."""
    child = os.fork()
    if child == 0:
        try:
            _unshare_namespaces(fresh_proc)
            grandchild = os.fork()
            if grandchild == 0:
                try:
                    if fresh_proc:
                        _mount_proc()
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            os._exit(0 if os.waitstatus_to_exitcode(os.waitpid(grandchild, 0)[1]) == 0 else 1)
        except BaseException:
            os._exit(1)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


def _reap() -> None:
    for _ in supervisor.reaped():
        pass


def serve(channel: socket.socket) -> None:
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(channel, 1 << 20, MAX_FDS)
        except OSError:
            return
        _reap()
        if not message:
            return
        try:
            config = json.loads(message)
            if len(fds) != 5:
                raise ValueError(f"expected 5 descriptors, got {len(fds)}")
            pid = os.fork()
        except (ValueError, OSError) as error:
            for fd in fds:
                os.close(fd)
            channel.sendall(json.dumps({"error": str(error)}).encode() + b"\n")
            continue
        if pid == 0:
            code = 1
            try:
                code = _supervise(config, fds, channel)
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        channel.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the checker decides when to stop
    torch.set_num_threads(1)
    first_backward.import_ahead()  # once here, not in every worker's first gradient check
    # What is imported now is shared with every fork: out of the collector's sight, so that a
    # worker's first collection does not touch (and copy) every page of it.
    gc.freeze()
    channel = socket.socket(fileno=int(sys.argv[1]))
    ready = {"ready": True, "threads": _threads(), "namespaces": _can_unshare(False),
             "fresh_proc": _can_unshare(True), "pid": os.getpid()}
    channel.sendall(json.dumps(ready).encode() + b"\n")
    serve(channel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
