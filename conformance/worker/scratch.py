"""The worker's scratch copy of a submission: made, handed to the worker's uid, deleted."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path


def copy_submission(source: Path, target: Path, limit: int) -> None:
    """Copy a submission (a directory, or one file) into ``target``: regular files and
    directories only, symlinks only where they stay inside the submission (the checker never
    follows a link out of it: it could point at the rubric), at most ``limit`` bytes."""
    source = source.resolve()
    target.mkdir(parents=True)
    if source.is_file():
        shutil.copyfile(source, target / source.name)
        return
    total = 0
    for directory, subdirs, files in os.walk(source):
        here = Path(directory)
        subdirs[:] = [d for d in subdirs if d != "__pycache__" and not (here / d).is_symlink()]
        (target / here.relative_to(source)).mkdir(exist_ok=True)
        for name in files:
            path = here / name
            destination = target / path.relative_to(source)
            if path.is_symlink():
                resolved = path.resolve()
                if source in resolved.parents and resolved.is_file():
                    os.symlink(os.path.relpath(resolved, path.parent), destination)
                continue
            if not stat.S_ISREG(path.lstat().st_mode):
                continue
            total += path.lstat().st_size
            if total > limit:
                raise ValueError(f"the submission is larger than {limit} bytes")
            shutil.copyfile(path, destination)


def chown_tree(root: Path, uid: int) -> None:
    """Give the scratch copy to the worker's own uid (and group)."""
    for directory, subdirs, files in os.walk(root):
        os.lchown(directory, uid, uid)
        for name in subdirs + files:
            os.lchown(os.path.join(directory, name), uid, uid)


def remove_tree(root: Path) -> None:
    """Delete the scratch tree, even where the submission made it unwritable; never touch
    anything outside it (the supervisor may have deleted it already)."""
    if not root.is_dir() or root.is_symlink():
        return
    inside = str(root) + os.sep

    def writable(function, failed, _):
        parent = os.path.dirname(failed)
        if not (parent + os.sep).startswith(inside) or os.path.islink(failed):
            return
        with contextlib.suppress(OSError):
            os.chmod(parent, 0o700)
            if not os.path.isdir(failed):
                function(failed)
                return
            os.chmod(failed, 0o700)
            shutil.rmtree(failed, ignore_errors=True)

    shutil.rmtree(root, onerror=writable)
