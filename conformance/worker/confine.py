"""A sandbox a process applies to itself: Landlock rules and a seccomp filter (standard library only).

:func:`restrict` makes the calling process (and everything it starts later) unable to

- open, list, execute, create, rename or delete anything outside the paths it is given: the
  ``read`` paths may be read and executed, the ``write`` paths also changed (Landlock, every
  filesystem right the running kernel's ABI knows);
- bind or connect TCP sockets (Landlock ABI 4 and later);
- signal or reach abstract UNIX sockets of processes outside its sandbox (ABI 6 and later);
  ptrace of an outer process is denied from ABI 1 on;
- create sockets of any family, use io_uring (which creates sockets past seccomp) and the
  kernel's keyrings (a seccomp filter, on x86-64 and AArch64: no network without a network
  namespace, no reaching the host's UNIX sockets, no keys of the grader's session).

It must be called from a single-threaded process (Landlock and seccomp bind the calling thread
and what it starts later, not its siblings); it sets ``PR_SET_NO_NEW_PRIVS``, never loosens
anything, and raises :class:`ConfinementError` when it can't apply what it should. Files and pipes
already open stay usable.

``python -I -S confine.py --probe DIR`` checks that all of it works here: it restricts itself to
writing ``DIR``, then must be refused a listing of ``/`` and, where the filter applies, an
``AF_INET`` and an ``AF_UNIX`` socket; it prints the Landlock ABI and exits 0, else exits 1.
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
import struct
import sys
from collections.abc import Sequence

# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on every architecture.
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
MAKE_CHAR, MAKE_BLOCK = 1 << 6, 1 << 11
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILESYSTEM_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1,
                     5: (1 << 16) - 1}
"""Every filesystem right each ABI handles (ABIs 6 and 7 added no filesystem right)."""
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
"""The rights that mean something on a file (the others only on a directory)."""
READ_RIGHTS = EXECUTE | READ_FILE | READ_DIR
WRITE_RIGHTS = ~(MAKE_CHAR | MAKE_BLOCK | IOCTL_DEV)
"""Everything in a writable tree but device nodes and device ioctls."""
DEVICE_RIGHTS = READ_FILE | WRITE_FILE | IOCTL_DEV | READ_DIR
"""A device file the process may use: open it to read and write, and ``ioctl`` it (a GPU's
driver is driven by ioctls); a folder of them (MIG's ``/dev/nvidia-caps``) listed."""
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

# seccomp (include/uapi/linux/seccomp.h, filter.h, audit.h)
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
EPERM = 1
IO_URING = (425, 426, 427)  # io_uring_setup, _enter, _register: the same everywhere
SECCOMP_ARCHES = {
    # machine: (AUDIT_ARCH_*, socket, socketpair, add_key, request_key, keyctl)
    "x86_64": (0xC000003E, 41, 53, 248, 249, 250),
    "aarch64": (0xC00000B7, 198, 199, 217, 218, 219),
}
X32_SYSCALL_BIT = 0x40000000


class ConfinementError(Exception):
    """The sandbox could not be applied (one line)."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _syscall(number: int, *args: int | ctypes.Array | None) -> int:
    converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    result = _libc().syscall(ctypes.c_long(number), *converted)
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def abi() -> int:
    """The Landlock ABI this kernel offers (0: none, or disabled)."""
    try:
        return _syscall(CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    except OSError:
        return 0


def seccomp_supported() -> bool:
    """Whether :func:`restrict` installs its seccomp filter on this machine's architecture."""
    return platform.machine() in SECCOMP_ARCHES


def _handled(version: int) -> tuple[int, int, int]:
    """(filesystem rights, network rights, scopes) a ruleset of ABI ``version`` handles."""
    filesystem = FILESYSTEM_RIGHTS[min(version, max(FILESYSTEM_RIGHTS))]
    network = NET_BIND_TCP | NET_CONNECT_TCP if version >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0
    return filesystem, network, scoped


def _allow(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # nothing there to allow
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FILE_RIGHTS
        if rights:
            # struct landlock_path_beneath_attr is packed: u64 allowed_access, s32 parent_fd.
            attr = struct.pack("=Qi", rights, fd)
            _syscall(ADD_RULE, ruleset, RULE_PATH_BENEATH,
                     ctypes.create_string_buffer(attr, len(attr)), 0)
    except OSError as error:
        raise ConfinementError(f"Landlock refused a rule for {path}: {error.strerror}") from None
    finally:
        os.close(fd)


def _filter() -> bytes:
    """The seccomp program: EPERM for socket, socketpair, the keyring calls, io_uring and every
    call of another ABI (32-bit or x32 entry points), everything else allowed."""
    arch, *numbers = SECCOMP_ARCHES[platform.machine()]
    numbers += IO_URING
    # (code, jump if true, jump if false, k); jumps count from the next instruction.
    program: list[tuple[int, int, int, int]] = [(BPF_LD_W_ABS, 0, 0, 4)]  # seccomp_data.arch
    checks: list[tuple[int, int]] = []
    if arch == SECCOMP_ARCHES["x86_64"][0]:
        checks.append((BPF_JGE_K, X32_SYSCALL_BIT))
    checks += [(BPF_JEQ_K, number) for number in numbers]
    # arch check, load nr, the checks, allow, deny: the deny is the last instruction.
    total = 1 + 1 + 1 + len(checks) + 2
    program.append((BPF_JEQ_K, 0, total - 3, arch))  # another ABI: straight to deny
    program.append((BPF_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
    for index, (code, k) in enumerate(checks):
        program.append((code, total - 1 - (3 + index) - 1, 0, k))
    program.append((BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    program.append((BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM))
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_filter() -> None:
    code = _filter()
    buffer = ctypes.create_string_buffer(code, len(code))
    program = _SockFprog(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if _libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        errno = ctypes.get_errno()
        raise ConfinementError(f"seccomp refused the socket filter: {os.strerror(errno)}")


def restrict(read: Sequence[str], write: Sequence[str], devices: Sequence[str] = ()) -> int:
    """Confine this process to reading ``read``, changing ``write`` and using the device files
    ``devices`` (paths that don't exist are left out), with no TCP and no sockets where the kernel
    allows; the Landlock ABI applied."""
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise ConfinementError(f"the sandbox must be applied by a single-threaded process "
                                  f"(this one runs {threads} threads)")
    version = abi()
    if version < 1:
        raise ConfinementError("this kernel has no Landlock (or it is disabled)")
    filesystem, network, scoped = _handled(version)
    attr = struct.pack("=QQQ", filesystem, network, scoped)[:8 if version < 4 else
                                                            16 if version < 6 else 24]
    try:
        ruleset = _syscall(CREATE_RULESET, ctypes.create_string_buffer(attr, len(attr)),
                           len(attr), 0)
    except OSError as error:
        raise ConfinementError(f"Landlock refused the ruleset: {error.strerror}") from None
    try:
        for path in read:
            _allow(ruleset, path, READ_RIGHTS & filesystem)
        for path in write:
            _allow(ruleset, path, WRITE_RIGHTS & filesystem)
        for path in devices:
            _allow(ruleset, path, DEVICE_RIGHTS & filesystem)
        libc = _libc()
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            errno = ctypes.get_errno()
            raise ConfinementError(f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(errno)}")
        if seccomp_supported():
            _install_filter()
        try:
            _syscall(RESTRICT_SELF, ruleset, 0)
        except OSError as error:
            raise ConfinementError("Landlock refused to restrict this process: "
                                   f"{error.strerror}") from None
    finally:
        os.close(ruleset)
    return version


def _probe(directory: str) -> int:
    import socket  # before the sandbox, like everything the worker imports

    version = restrict([], [directory])
    with open(os.path.join(directory, "probe"), "w") as handle:
        handle.write("written")
    try:
        os.listdir("/")
        return 1
    except PermissionError:
        pass
    if seccomp_supported():
        for family in (socket.AF_INET, socket.AF_UNIX):
            try:
                socket.socket(family).close()
                return 1
            except PermissionError:
                pass
    print(version)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--probe":
        sys.exit("usage: python -I -S confine.py --probe DIR")
    try:
        sys.exit(_probe(sys.argv[2]))
    except (OSError, ConfinementError) as failure:
        sys.exit(f"confine: {failure}")
