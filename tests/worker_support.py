"""Shared by the worker tests: small limits, the sandboxes to try, submissions laid out the way a
grader keeps them, and /proc scans for processes that outlive their worker."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import shutil
import time
from pathlib import Path

import pytest

from conformance.worker import WorkerLimits, available_sandboxes

HOSTILE = Path(__file__).parent / "fixtures" / "hostile"

FAST = WorkerLimits(start_seconds=60, load_seconds=30, request_seconds=2.0, lifetime_seconds=300,
                    cpu_seconds=300, memory_bytes=512 << 20, max_restarts=2)
"""Small limits, so hostile submissions cost the tests little time."""

SANDBOXES = available_sandboxes()
needs_bwrap = pytest.mark.skipif(
    "bwrap" not in SANDBOXES,
    reason="bubblewrap is not installed or not usable here (apt-get install bubblewrap)")
PLAIN_AND_BWRAP = ["none", pytest.param("bwrap", marks=needs_bwrap)]
"""The default path (rlimits, own session, subreaper), and bubblewrap where it works."""

needs_landlock = pytest.mark.skipif(
    "landlock" not in SANDBOXES,
    reason="no usable Landlock here (kernel without it, or it is disabled)")
FILESYSTEM_SANDBOXES = [pytest.param("bwrap", marks=needs_bwrap),
                        pytest.param("landlock", marks=needs_landlock)]
"""The filesystem sandboxes (what grading requires)."""

needs_unshare = pytest.mark.skipif(
    "unshare" not in SANDBOXES,
    reason="no PID and network namespaces (with a /proc of their own) can be made here")
EVERY_SANDBOX = ["none", pytest.param("bwrap", marks=needs_bwrap),
                 pytest.param("landlock", marks=needs_landlock),
                 pytest.param("unshare", marks=needs_unshare)]
NETWORK_SANDBOXES = [pytest.param("bwrap", marks=needs_bwrap),
                     pytest.param("landlock", marks=needs_landlock),
                     pytest.param("unshare", marks=needs_unshare)]
"""The sandboxes that keep the network away (a network namespace; Landlock's own rules)."""


def lay_out(tmp_path: Path, name: str, *siblings: str) -> Path:
    """``tmp_path/submissions/name`` (a copy of the hostile fixture), sibling submissions beside
    it, and a rubric beside them: the layout a grader keeps."""
    root = tmp_path / "submissions"
    target = root / name
    shutil.copytree(HOSTILE / name, target, ignore=shutil.ignore_patterns("__pycache__"))
    for sibling in siblings:
        shutil.copytree(HOSTILE / sibling, root / sibling,
                        ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "rubric.toml").write_text('secret = "RUBRIC-SECRET-4711"\n')
    return target


def snapshot(*directories: Path) -> dict[str, tuple[int, float]]:
    """Every file under the directories, with its size and modification time."""
    found = {}
    for directory in directories:
        for path in directory.rglob("*"):
            try:
                info = path.lstat()
            except OSError:
                continue
            found[str(path)] = (info.st_size, info.st_mtime)
    return found


def processes_with(marker: str) -> list[int]:
    """Processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def descendants(root: int | None = None) -> list[int]:
    """Every live (not zombie) process below ``root`` (default: this process), but this
    process's zygotes (they fork the workers and live as long as it, by design; what they
    fork is counted)."""
    from conformance.worker.warm_start import zygote_pids

    root = os.getpid() if root is None else root
    zygotes = zygote_pids()
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, queue = [], list(children.get(root, []))
    while queue:
        pid = queue.pop()
        if pid not in zygotes:
            found.append(pid)
        queue.extend(children.get(pid, []))
    return found


PR_SET_CHILD_SUBREAPER = 36


def _subreaper(on: bool) -> None:
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0,
                                                    0) == 0


@contextlib.contextmanager
def left_behind(seconds: float = 10.0):
    """Count what a run inside leaves behind: meanwhile this process inherits its descendants'
    orphans (a child subreaper), so what the run leaves stays below it and nothing else on the
    machine (other test runs' workers) is counted. Yields a list that, on leaving, holds the
    processes still alive ``seconds`` after (supervisors kill their trees as they end);
    what this process ran before (a multiprocessing resource tracker, say) is not counted."""
    earlier = set(descendants())
    left: list[int] = []
    _subreaper(True)
    try:
        yield left
        wait_until(lambda: not set(descendants()) - earlier, seconds=seconds)
        left += sorted(set(descendants()) - earlier)
    finally:
        _subreaper(False)


def wait_until(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def verdicts(results) -> list[dict]:
    """Everything a result says except how long it took."""
    rows = []
    for result in results:
        row = dataclasses.asdict(result)
        row.pop("seconds")
        rows.append(row)
    return rows
