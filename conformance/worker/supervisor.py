"""The supervisor: the trusted root of a worker's process tree (standard library only).

Run as ``python -I -S supervisor.py CONFIG_JSON`` by the checker, it

1. becomes a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so every process the worker
   starts, even one that double-forks and calls ``setsid`` to detach, is re-parented to it rather
   than to init and stays findable;
2. forks the worker: a new session (own session and process group), the resource limits, stdin
   from ``/dev/null``, stdout and stderr to the output pipe, the request and reply pipes on
   fds 3 and 4, every other descriptor closed, the scratch directory, then, where the launch has
   them, new PID, network, IPC and UTS namespaces (:func:`enter_namespaces`), and the worker's
   own code in the scrubbed environment;
3. waits until the worker exits or the checker closes the control pipe (its stdin; also what
   happens when the checker dies), then kills every descendant (repeatedly, until none is
   left: killing a parent re-parents its children here), deletes the scratch directory and
   reports on stdout, as one JSON line, how the worker ended.

It imports nothing from the project, so it starts in milliseconds and the untrusted code never
shares a process with it. The zygote (``zygote.py``) runs the same code for a forked worker: only
the last step differs (its worker runs the already imported server instead of exec'ing
``argv``), so both ways in get the same namespaces, limits and end. ``supervisor.py --probe``
says which namespaces a process can enter here (what the launch plan offers).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import select
import shutil
import signal
import sys
import time
from collections.abc import Iterator

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
DUP_BASE = 64
WORKER_FDS = 5
"""The worker's descriptors: stdin, output twice, requests, replies (0-4)."""
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18


def reaped() -> Iterator[tuple[int, int, resource.struct_rusage]]:
    """Every exited child, collected without waiting: (pid, wait status, resource usage). The
    one reaper of the worker's processes (the supervisor's and the zygote's)."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status, usage


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _set_subreaper() -> bool:
    try:
        return _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _checked(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def enter_namespaces(fresh_proc: bool) -> None:
    """Put what runs next in new PID, network, IPC and UTS namespaces, and, ``fresh_proc``, a
    mount namespace with a ``/proc`` of the PID namespace: what ``unshare --pid --net --ipc
    --uts --fork --kill-child [--mount-proc]`` does (``--map-root-user`` too where this is not
    root: a user namespace mapping this uid to its root), said once for a started worker and a
    forked one. Returns in the PID namespace's first process; the calling process becomes its
    parent outside, waits for it and ends as it ended (never returns)."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    flags = NAMESPACES | (CLONE_NEWNS if fresh_proc else 0) | (CLONE_NEWUSER if uid else 0)
    _checked(libc.unshare(flags), "unshare")
    if uid != 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                           ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as handle:
                handle.write(text)
    child = os.fork()  # a new PID namespace holds the caller's next child, not the caller
    if child:
        os._exit(_mirror(child))
    # Its parent outside gone (killed with the tree), it goes too, and the namespace with it.
    _checked(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    if fresh_proc:
        # Mounts made private first: the new /proc stays out of the host's mount table.
        _checked(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount /")
        _checked(libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
                 "mount /proc")


def _mirror(child: int) -> int:
    """Wait for ``child`` and end as it ended (``unshare --fork`` does the same): the supervisor
    reads how the worker ended from this process."""
    os.closerange(0, WORKER_FDS)  # only the child holds the pipes: its death closes them
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if code < 0:  # killed by signal -code: be killed by it too
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def can_enter_namespaces(fresh_proc: bool) -> bool:
    """Whether :func:`enter_namespaces` works here: tried in a throwaway child."""
    child = os.fork()
    if child == 0:
        code = 1
        try:
            enter_namespaces(fresh_proc)
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


def _parents() -> dict[int, int]:
    """pid -> parent pid, for every process visible in /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                text = stat.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow the last ')'.
        fields = text[text.rfind(b")") + 2:].split()
        if len(fields) > 1:
            parents[int(entry)] = int(fields[1])
    return parents


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (breadth first)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


class Supervisor:
    """``config``: the worker's start (see the module's docstring: ``argv``, ``env``, ``cwd``,
    ``rlimits``, ``fds``, ``remove``, ``namespaces``, ``fresh_proc``); ``control``: the fd whose
    end-of-file means "stop"; ``status``: where the JSON lines go; ``run_worker``: what the
    forked worker runs instead of exec'ing ``config["argv"]`` (the zygote's warm start)."""

    def __init__(self, config: dict, control: int = 0, status: int = 1,
                 run_worker=None) -> None:
        self.config = config
        self.control = control
        self.status_fd = status
        self.run_worker = run_worker
        self.child = -1
        self.status: int | None = None
        self.usage: resource.struct_rusage | None = None
        self.killed = 0

    def start(self) -> None:
        fds = {int(target): source for target, source in self.config["fds"].items()}
        pid = os.fork()
        if pid == 0:  # the worker: never returns
            try:
                self._exec(fds)
            finally:
                os._exit(127)
        self.child = pid
        for source in set(fds.values()):
            os.close(source)

    def _exec(self, fds: dict[int, int]) -> None:
        try:
            # The supervisor's handler is not the worker's (exec resets it; a fork would keep it).
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.setsid()
            for name, soft, hard in self.config["rlimits"]:
                resource.setrlimit(getattr(resource, name), (soft, hard))
            devnull = os.open(os.devnull, os.O_RDONLY)
            # Move every source above the targets first, so no dup2 overwrites a later source.
            high = {target: fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, DUP_BASE)
                    for target, source in {0: devnull, **fds}.items()}
            for target, source in high.items():
                os.dup2(source, target, inheritable=True)
            # Nothing else the checker had open reaches the worker.
            os.closerange(max(high) + 1, os.sysconf("SC_OPEN_MAX"))
            os.chdir(self.config["cwd"])
            if self.config.get("namespaces"):
                enter_namespaces(self.config.get("fresh_proc", False))
            if self.run_worker is not None:
                os._exit(self.run_worker(self.config))
            os.execve(self.config["argv"][0], self.config["argv"], self.config["env"])
        except BaseException as error:
            os.write(2, f"worker supervisor: could not start the worker: {error}\n".encode())

    def _reap(self) -> None:
        """Collect every exited child (orphans re-parented here included)."""
        for pid, status, usage in reaped():
            if pid == self.child:
                self.status, self.usage = status, usage

    def kill_tree(self) -> None:
        """SIGKILL every descendant until none is left (bounded: about 10 s)."""
        for _ in range(1000):
            self._reap()
            pids = descendants(os.getpid())
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed += 1
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def wait(self) -> bool:
        """Until the worker exits (True) or the checker closes the control pipe (False)."""
        poller = select.poll()
        control = self.control
        poller.register(control, select.POLLIN | select.POLLHUP)
        pidfd = -1
        try:
            pidfd = os.pidfd_open(self.child)
            poller.register(pidfd, select.POLLIN)
        except (AttributeError, OSError):
            pass  # no pidfd: the poll timeout below notices the exit instead
        while True:
            events = poller.poll(200)
            self._reap()
            if self.status is not None:
                return True
            for fd, _ in events:
                if fd == control and not os.read(control, 4096):
                    return False

    def report(self, stopped: bool) -> None:
        status = self.status
        line = {"event": "exit", "pid": self.child, "stopped": stopped,
                "code": os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status)
                else None,
                "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status)
                else None,
                "killed": self.killed,
                "maxrss_kb": self.usage.ru_maxrss if self.usage else None,
                "cpu_seconds": self.usage.ru_utime + self.usage.ru_stime if self.usage else None}
        self.say(line)

    def say(self, line: dict) -> None:
        os.write(self.status_fd, (json.dumps(line) + "\n").encode())


def main() -> int:
    if sys.argv[1] == "--probe":  # for the launch plan: one JSON line
        print(json.dumps({"namespaces": can_enter_namespaces(False),
                          "fresh_proc": can_enter_namespaces(True)}))
        return 0
    return supervise(json.loads(sys.argv[1]))


def supervise(config: dict, control: int = 0, status: int = 1, run_worker=None) -> int:
    """Start the worker ``config`` describes, wait, kill its tree, clean up, report."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the checker decides when to stop
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    supervisor = Supervisor(config, control, status, run_worker)

    def terminate(signum, frame):
        supervisor.kill_tree()
        shutil.rmtree(config["remove"], ignore_errors=True)
        supervisor.report(stopped=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, terminate)
    subreaper = _set_subreaper()
    supervisor.start()
    supervisor.say({"event": "started", "pid": supervisor.child, "subreaper": subreaper})
    exited = supervisor.wait()
    supervisor.kill_tree()
    supervisor._reap()
    # The scratch copy goes with the tree, even when the checker died without cleaning up.
    shutil.rmtree(config["remove"], ignore_errors=True)
    supervisor.report(stopped=not exited)
    return 0


if __name__ == "__main__":
    sys.exit(main())
