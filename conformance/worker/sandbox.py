"""What containment this machine allows, and the command line that starts a worker in it.

Four tiers, the strongest that works here is used (``sandbox="auto"``); ``"filesystem"`` asks
for the strongest of the first two (the grader's default) and refuses without one. Where
``landlock`` has everything ``bwrap`` has (new PID and network namespaces, the socket filter),
both choose it: its workers are forked by a warm zygote (``warm_start.py``) in milliseconds,
bubblewrap's are started (an interpreter and torch: a second of CPU each).

- ``bwrap`` (bubblewrap installed and usable): new PID, network, IPC and UTS namespaces; a
  filesystem of read-only system directories, the Python installation and the suite's own
  package, a private ``/tmp``, and the scratch directory as the only writable place; everything
  else (the submission's original directory, its siblings, a rubric, home directories) does not
  exist.
- ``landlock`` (the kernel's Landlock, no package needed): the worker confines itself
  (``confine.py``) after importing torch and the suite, before it reads any request: it may
  read the system directories, the Python installation and the suite, change only its scratch
  directory, and open nothing else (not ``/proc`` beyond its own entry, not ``/tmp``, not the
  siblings or the rubric); no sockets, no TCP, no keyrings; plus the namespaces of ``unshare``
  where they work, but not its ``/proc`` (Landlock leaves the worker only its own entry of the
  host's, and mounting one fails in some containers where the namespaces work).
- ``unshare`` (the kernel's namespaces, as root or in a user namespace; no package needed): new
  PID, network, IPC and UTS namespaces and a ``/proc`` that shows only the worker's processes;
  the filesystem is the host's.
- ``none``: neither; the plain protections only.

The namespaces are entered by the supervisor's own code (``supervisor.enter_namespaces``, what
``unshare --pid --net --ipc --uts --fork --kill-child --mount-proc`` does), the same for a worker
started cold and one forked by the zygote (``launcher.py`` starts it either way); bubblewrap makes
its own.

The last two are no filesystem sandbox: the protections say ``filesystem: none``.

Always: the supervisor (a child subreaper, see ``supervisor.py``) kills the whole process tree;
the worker gets its own session, rlimits (CPU, address space, file size, core dumps, open files,
processes where enforceable), a scrubbed environment, stdin from ``/dev/null`` and a scratch copy
of the submission as its working directory; a checker running as root makes it drop to a uid of
its own (every tier) before it reads any request, so process limits apply and nothing of root's
is writable (a user's own code checked in place keeps the user's uid).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import conformance.worker.confine as confine
import conformance.worker.gpu as gpu
import conformance.worker.warm_start as warm_start
from conformance.errors import ConformanceError
from conformance.worker.limits import TORCH_ADDRESS_SPACE, WorkerLimits

SandboxKind = Literal["auto", "filesystem", "bwrap", "landlock", "unshare", "none"]
Tier = Literal["bwrap", "landlock", "unshare", "none"]
FILESYSTEM_TIERS: tuple[Tier, ...] = ("bwrap", "landlock")
"""The tiers that are a filesystem sandbox (what grading requires unless told otherwise)."""
NO_FILESYSTEM_SANDBOX = ("no filesystem sandbox works here (bubblewrap is not installed or not "
                         "usable, and this kernel offers no Landlock): install bubblewrap "
                         "(apt-get install bubblewrap)")

NAMESPACES = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
              "--unshare-cgroup-try")
FIRST_WORKER_UID = 1_000_000
"""Dropped uids are FIRST_WORKER_UID + 16 * checker pid + n: distinct between the workers of
one checker and between checkers, and far above the uids of real accounts."""

_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf", "hosts",
        "localtime", "host.conf", "resolv.conf")
_SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_DEVICES_READ = ("/dev/zero", "/dev/random", "/dev/urandom")
_CPU = ("/proc/cpuinfo", "/sys/devices/system/cpu")
"""What torch's cpuinfo reads the first time it needs it (float16 ops: after the worker confined
itself)."""
CONFINE = Path(__file__).with_name("confine.py")
SUPERVISOR = Path(__file__).with_name("supervisor.py")
SUITE = Path(__file__).resolve().parents[1]
"""The suite's own package folder (``conformance/``), found from here: importing the package for
its ``__file__`` would tie this module to everything the package names."""
_counter = itertools.count()


class SandboxUnavailable(ConformanceError):
    """The requested sandbox does not work on this machine; one line."""


@dataclass(frozen=True)
class Launch:
    """Everything the supervisor needs to start one worker, and what protects it."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    rlimits: list[tuple[str, int, int]]
    sandbox: Tier
    uid: int | None
    """The uid the worker drops to before reading requests (None: it keeps the checker's)."""
    protections: tuple[str, ...]
    worker_args: tuple[str, ...] = ()
    """The worker's own arguments (what follows ``-m conformance.worker`` in ``argv``)."""
    namespaces: bool = False
    """Whether the worker gets new PID, network, IPC and UTS namespaces (entered by the
    supervisor, ``supervisor.enter_namespaces``, however the worker is started)."""
    fresh_proc: bool = False
    """Whether it also gets a ``/proc`` of its PID namespace (``unshare --mount-proc``)."""


def _probe(argv: Sequence[str]) -> bool:
    try:
        return subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@cache
def _bwrap() -> str | None:
    path = shutil.which("bwrap")
    if path and _probe([path, *NAMESPACES, "--die-with-parent", "--ro-bind", "/", "/",
                        "--proc", "/proc", "--dev", "/dev", "true"]):
        return path
    return None


@cache
def _namespaces() -> frozenset[str]:
    """What the supervisor can give a worker here (``supervisor.py --probe``): ``"namespaces"``
    (new PID, network, IPC and UTS namespaces), ``"fresh_proc"`` (and a ``/proc`` of them)."""
    try:
        probe = subprocess.run([sys.executable, "-I", "-S", str(SUPERVISOR), "--probe"],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=10, env={})
        found = json.loads(probe.stdout) if probe.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError):
        return frozenset()
    return frozenset(name for name in ("namespaces", "fresh_proc") if found.get(name) is True)


@cache
def _landlock() -> int:
    """The Landlock ABI a process can confine itself with here (``confine.py --probe``: rules
    enforced, sockets refused), or 0. Without the socket filter (another architecture) the
    tier needs unshare's network namespace to keep the network away."""
    with tempfile.TemporaryDirectory(prefix="attention-landlock-probe-") as scratch:
        try:
            probe = subprocess.run([sys.executable, "-I", "-S", str(CONFINE), "--probe", scratch],
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   timeout=10, env={})
        except (OSError, subprocess.SubprocessError):
            return 0
    if probe.returncode != 0 or not probe.stdout.strip().isdigit():
        return 0
    if not confine.seccomp_supported() and "namespaces" not in _namespaces():
        return 0
    return int(probe.stdout)


def available() -> tuple[Tier, ...]:
    """The sandboxes that work here, strongest first ("none" always works)."""
    found: list[Tier] = []
    if _bwrap():
        found.append("bwrap")
    if _landlock():
        found.append("landlock")
    if "fresh_proc" in _namespaces():
        found.append("unshare")
    return (*found, "none")


def resolve_kind(kind: SandboxKind) -> Tier:
    """The tier ``kind`` means here; SandboxUnavailable if it was asked for and does not work
    (for ``"filesystem"``: when neither bubblewrap nor Landlock does, :data:`NO_FILESYSTEM_SANDBOX`)."""
    usable = available()
    if kind in ("auto", "filesystem") and "landlock" in usable and _landlock_matches_bwrap():
        return "landlock"
    if kind == "auto":
        return usable[0]
    if kind == "filesystem":
        for tier in usable:
            if tier in FILESYSTEM_TIERS:
                return tier
        raise SandboxUnavailable(NO_FILESYSTEM_SANDBOX)
    if kind not in usable:
        raise SandboxUnavailable(
            f"sandbox {kind!r} does not work on this machine (usable: {', '.join(usable)})"
            + ("; install bubblewrap (apt-get install bubblewrap)" if kind == "bwrap" else ""))
    return kind


def _landlock_matches_bwrap() -> bool:
    """Whether the ``landlock`` tier gives what ``bwrap`` gives here (a filesystem sandbox, new
    PID and network namespaces, no sockets), so that its faster start decides: its workers are
    forked by a warm zygote (``warm_start.py``), bubblewrap's are started. Where it lacks any of
    those, bubblewrap stays first."""
    return warm_start.enabled() and "namespaces" in _namespaces() and confine.seccomp_supported()


def unsandboxed() -> Tier:
    """The strongest tier that is no filesystem sandbox (what ``grade --no-sandbox`` runs in)."""
    return "unshare" if "unshare" in available() else "none"


def _python_roots() -> list[Path]:
    """What the worker's interpreter needs to see: the installation, the environment, the
    suite's own package (``conformance``, the bundled implementations the self-test grades
    included; an editable install lives outside site-packages)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)),
             os.path.dirname(os.path.abspath(sys.executable)),
             str(SUITE)}
    for scheme_paths in (sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix,
                                                                          "platbase": sys.base_prefix})):
        paths.update(scheme_paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")
                     if name in scheme_paths)
    roots = sorted(Path(p) for p in paths if p and os.path.isdir(p))
    # Keep only the outermost of nested paths; /usr is bound as a whole anyway.
    kept: list[Path] = []
    for root in roots:
        if root == Path("/usr") or Path("/usr") in root.parents:
            continue
        if not any(k == root or k in root.parents for k in kept):
            kept.append(root)
    return kept


def _ancestors(path: Path) -> list[str]:
    """``--perms 0755 --dir`` for every parent of ``path`` (bwrap would create them 0700,
    and an unprivileged worker could not pass through)."""
    args: list[str] = []
    for parent in reversed(path.parents):
        if parent != Path("/"):
            args += ["--perms", "0755", "--dir", str(parent)]
    return args


def _bwrap_argv(scratch: Path, uid: int | None, devices: Sequence[str]) -> list[str]:
    argv = [_bwrap() or "bwrap", *NAMESPACES, "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM[1:]:
        host = Path("/") / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), str(host)]
    for name in _ETC:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev", *gpu.bwrap_args(devices),
             # Private /tmp first: the scratch directory may live under the host's /tmp.
             "--perms", "1777", "--size", str(64 << 20), "--tmpfs", "/tmp"]
    for root in _python_roots():
        argv += [*_ancestors(root), "--ro-bind", str(root), str(root)]
    argv += [*_ancestors(scratch), "--bind", str(scratch), str(scratch), "--chdir", str(scratch)]
    return argv


def _landlock_args(writable: Sequence[Path], readable: Sequence[Path]) -> list[str]:
    """The worker's arguments for confining itself: what it may read (the system, the Python
    installation, the suite, a few files of /etc and /dev, its own /proc entry, what the CPU is,
    ``readable``) and write (``writable``)."""
    read = [f"/{name}" for name in _SYSTEM] + [f"/etc/{name}" for name in _ETC]
    read += [*_DEVICES_READ, *_CPU, "/proc/self", *(str(root) for root in _python_roots())]
    read += [str(path) for path in readable]
    write = [*dict.fromkeys(str(path) for path in writable), "/dev/null"]
    return [arg for path in read for arg in ("--landlock-read", path)] + [
        arg for path in write for arg in ("--landlock-write", path)]


def _user_tasks(uid: int) -> int:
    """Processes and threads the real uid ``uid`` runs now (what RLIMIT_NPROC counts)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except (OSError, ValueError):
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


def worker_uid() -> int:
    """A fresh uid for a worker of this checker."""
    return FIRST_WORKER_UID + 16 * os.getpid() + next(_counter) % 16


def plan(scratch: Path, limits: WorkerLimits, kind: SandboxKind, worker_args: Sequence[str], *,
         home: Path | None = None) -> Launch:
    """How to start a worker on ``scratch`` under ``limits`` in the ``kind`` sandbox.

    ``home``: where HOME and temporary files go, when ``scratch`` is not a copy but the
    caller's own folder (:class:`~conformance.worker.process.WorkerProcess`'s ``in_place``).
    """
    tier = resolve_kind(kind)
    root = os.geteuid() == 0
    # In place, the folder is the user's own: it keeps the user's uid (nothing is chowned).
    uid = worker_uid() if root and home is None else None
    protections = ["own session", "stdin closed",
                   "clean environment", "in place (no copy)" if home else "scratch copy",
                   "rlimit cpu", "rlimit address space" if not limits.accelerators else
                   "rlimit data",
                   "rlimit file size", "no core dumps", "no new privileges"]
    # A GPU worker: the driver's reservations exceed any address-space limit (gpu.py).
    devices = gpu.device_files() if limits.accelerators else []
    memory = (("RLIMIT_DATA", gpu.data_limit(limits, TORCH_ADDRESS_SPACE)) if limits.accelerators
              else ("RLIMIT_AS", TORCH_ADDRESS_SPACE + limits.memory_bytes))
    rlimits = [("RLIMIT_CPU", limits.cpu_seconds, limits.cpu_seconds + 1),
               (memory[0], memory[1], memory[1]),
               ("RLIMIT_FSIZE", limits.file_bytes, limits.file_bytes),
               ("RLIMIT_CORE", 0, 0),
               ("RLIMIT_NOFILE", limits.open_files, limits.open_files)]
    # RLIMIT_NPROC counts every task of the real uid, and root is exempt from it.
    if uid is not None:
        rlimits.append(("RLIMIT_NPROC", limits.processes, limits.processes))
        protections.append("rlimit processes")
    elif not root:
        allowed = _user_tasks(os.getuid()) + limits.processes
        rlimits.append(("RLIMIT_NPROC", allowed, allowed))
        protections.append("rlimit processes")

    # Writable: the scratch copy (and HOME beside the folder checked in place); listable: the
    # copy's own folder (it holds only the copy), as under bubblewrap, so that a submission
    # listing ".." gets the same answer in both tiers.
    writable, listable = ([scratch, home], []) if home else ([scratch], [scratch.parent])
    home = home or scratch
    env = {**warm_start.base_environment(), "HOME": str(home),
           "TMPDIR": "/tmp" if tier == "bwrap" else str(home)}
    args = list(worker_args)
    if limits.accelerators:
        env.update(gpu.environment(os.environ))
        args += ["--gpu-memory-bytes", str(limits.gpu_memory_bytes)]
        protections += gpu.protections(limits, devices)
    if uid is not None:
        args += ["--uid", str(uid), "--gid", str(uid)]
    namespaces = fresh_proc = False

    if tier == "landlock":
        args += _landlock_args(writable, listable) + gpu.landlock_args(devices)
    argv = warm_start.suite_command("conformance.worker", *args)
    if tier == "bwrap":
        argv = [*_bwrap_argv(scratch, uid, devices), "--", *argv]
        protections += ["filesystem: bwrap", "pid namespace", "network namespace",
                        "ipc namespace", "read-only system", "host filesystem hidden",
                        "private /tmp"]
    elif tier == "landlock":
        namespaces = "namespaces" in _namespaces()
        abi = _landlock()
        protections += ["filesystem: landlock", f"landlock abi {abi}", "read-only system",
                        "host filesystem unreadable", "writable: scratch only"]
        protections += ["pid namespace", "network namespace", "ipc namespace"] \
            if namespaces else []
        protections += ["no tcp (landlock)"] if abi >= 4 else []
        protections += ["no signals or abstract sockets outside (landlock)"] if abi >= 6 else []
        if confine.seccomp_supported():
            protections += ["no sockets (seccomp)", "no keyrings (seccomp)"]
    elif tier == "unshare":
        namespaces = fresh_proc = True
        protections += ["filesystem: none", "pid namespace", "network namespace",
                        "ipc namespace"]
    else:
        protections.append("filesystem: none")
    if uid is not None:
        protections.append("unprivileged uid")
    return Launch(argv=argv, env=env, cwd=str(scratch), rlimits=rlimits, sandbox=tier, uid=uid,
                  protections=tuple(protections), worker_args=tuple(args), namespaces=namespaces,
                  fresh_proc=fresh_proc)
