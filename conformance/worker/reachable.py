"""Keeping the Python installation importable after the worker gives up root.

A root grader's interpreter may live where no other user may pass (pyenv under ``/root``, a
virtual environment in a ``0750`` home). Once the worker has dropped to a uid of its own it
could not import one more module from there, so before dropping, :func:`keep_imports_reachable`
opens each such place once (``O_PATH``, no read right of its own) and points ``sys.path`` and
every imported package's ``__path__`` through ``/proc/self/fd/N``: the kernel follows that link
straight to the directory without walking its ancestors; everything below it keeps its own
permissions and, in the ``landlock`` tier, the Landlock rules. Bubblewrap needs none of this
(it mounts the installation under world-searchable directories).
"""

from __future__ import annotations

import os
import stat
import sys
from functools import cache

_anchors: dict[str, int] = {}
"""Directory -> the O_PATH descriptor that reaches it (open for the worker's whole life)."""


@cache
def _searchable_by_anyone(directory: str) -> bool:
    try:
        return bool(os.stat(directory).st_mode & stat.S_IXOTH)
    except OSError:
        return True  # nothing to fix here: a missing path stays missing


def anchor(path: str) -> str | None:
    """The directory below the deepest ancestor of ``path`` that other users can't pass
    (None: ``path`` is reachable as it is, or is itself that ancestor)."""
    parts = path.rstrip("/").split("/")[1:]
    blocked = -1
    for index in range(len(parts)):
        if not _searchable_by_anyone("/" + "/".join(parts[:index])):
            blocked = index
    if blocked < 0 or blocked >= len(parts):
        return None
    return "/" + "/".join(parts[:blocked + 1])


def reachable(path: object) -> object:
    """``path`` through ``/proc/self/fd`` where a uid of its own could not reach it."""
    if not isinstance(path, str) or not os.path.isabs(path):
        return path
    directory = anchor(path)
    if directory is None:
        return path
    if directory not in _anchors:
        _anchors[directory] = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{_anchors[directory]}{path[len(directory):]}"


def keep_imports_reachable() -> list[str]:
    """Route ``sys.path`` and the packages' ``__path__`` around unreachable ancestors; the
    directories now reached through a descriptor."""
    sys.path[:] = [reachable(entry) for entry in sys.path]
    for module in list(sys.modules.values()):
        try:
            search = module.__dict__.get("__path__")
        except AttributeError:
            continue
        if isinstance(search, list):
            search[:] = [reachable(entry) for entry in search]
    sys.path_importer_cache.clear()
    return sorted(_anchors)
