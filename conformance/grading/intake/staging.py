"""Staging: one student's files, whatever their form, copied into one directory to import from.

Single files keep their (LMS-stripped) names; folders keep their structure; ``.zip`` archives
are extracted safely (:mod:`conformance.grading.intake.archives`) where they lie; notebooks become
``.py`` modules (:mod:`conformance.grading.intake.notebooks`) beside where they were. Symbolic links
are never followed, debris is skipped, and sizes are capped. The submission hash is computed on
the staged files (relative paths and bytes), before anything runs, so what a submission writes
while it runs never changes its hash.

Problems are returned, never raised: an unreadable archive or notebook is a status for the
student's row.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from conformance.grading.intake.archives import ArchiveError, ArchiveLimits, extract_zip, is_junk
from conformance.grading.intake.discovery import Submission
from conformance.grading.intake.notebooks import NotebookError, convert
from conformance.grading.score.outcome import RunStatus

MAX_FILE_BYTES = 20 * 2**20
MAX_TOTAL_BYTES = 200 * 2**20
MAX_FILES = 5000


@dataclass
class Staged:
    """A staged submission.

    Attributes:
        directory: where its files are.
        hash: sha256 (first 16 hex digits) of the staged files' relative paths and bytes.
        files: the staged files, relative, sorted.
        notes: what staging did that the student should know (notebook cells skipped...).
        syntax_errors: notebook cells that did not parse (they explain a missing class).
        problem: a status when staging failed (unreadable input, no code), with ``message``.
    """

    directory: Path
    hash: str = ""
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    syntax_errors: list[str] = field(default_factory=list)
    problem: RunStatus | None = None
    message: str = ""


class _StagingError(Exception):
    def __init__(self, status: RunStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def module_file_name(stem: str) -> str:
    """A notebook's stem as an importable module name (``My Notebook (2)`` -> ``My_Notebook_2``)."""
    name = re.sub(r"\W+", "_", stem).strip("_") or "notebook"
    return f"nb_{name}" if name[0].isdigit() else name


class _Budget:
    def __init__(self) -> None:
        self.files = 0
        self.bytes = 0

    def take(self, path: Path) -> None:
        size = path.stat().st_size
        self.files += 1
        self.bytes += size
        if size > MAX_FILE_BYTES:
            raise _StagingError(RunStatus.UNREADABLE,
                                f"{path.name} is larger than {MAX_FILE_BYTES // 2**20} MiB")
        if self.files > MAX_FILES or self.bytes > MAX_TOTAL_BYTES:
            raise _StagingError(RunStatus.UNREADABLE,
                                f"the submission is larger than {MAX_FILES} files or "
                                f"{MAX_TOTAL_BYTES // 2**20} MiB")


def stage(submission: Submission, destination: Path, *, run_all_cells: bool = False) -> Staged:
    """Copy ``submission`` into ``destination`` (emptied first) and hash it."""
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    staged = Staged(directory=destination)
    budget = _Budget()
    try:
        for source in submission.sources:
            if source.path.is_dir():
                _copy_folder(source.path, destination, budget)
            else:
                _place(source.path, destination / source.staged_name, budget)
        _expand(destination, staged, run_all_cells, budget)
    except _StagingError as error:
        staged.problem, staged.message = error.status, str(error)
    except OSError as error:
        staged.problem, staged.message = RunStatus.UNREADABLE, f"cannot read it: {error}"
    staged.files = sorted(p.relative_to(destination).as_posix()
                          for p in destination.rglob("*") if p.is_file())
    staged.hash = tree_hash(destination)
    if staged.problem is None and not any(f.endswith(".py") for f in staged.files):
        staged.problem = RunStatus.NO_CODE
        staged.message = ("no Python code found (files: " + (", ".join(staged.files[:5]) or "none")
                          + ")")
    return staged


def _copy_folder(folder: Path, destination: Path, budget: _Budget) -> None:
    # os.walk without following links: a linked folder or file is never entered or copied.
    for root, folders, files in sorted(os.walk(folder, followlinks=False)):
        here = Path(root)
        folders[:] = sorted(d for d in folders if not d.startswith(".")
                            and not is_junk((d,)) and not (here / d).is_symlink())
        for name in sorted(files):
            path = here / name
            relative = path.relative_to(folder)
            if name.startswith(".") or is_junk(relative.parts) or path.is_symlink():
                continue
            _place(path, destination / relative, budget)


def _place(path: Path, target: Path, budget: _Budget) -> None:
    if path.is_symlink() or not path.is_file():
        return
    budget.take(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)


def _expand(destination: Path, staged: Staged, run_all_cells: bool, budget: _Budget) -> None:
    """Archives extracted in place (one level), then notebooks converted beside themselves."""
    for archive in sorted(destination.rglob("*.zip")):
        try:
            extract_zip(archive, archive.parent,
                        ArchiveLimits(max_total_bytes=MAX_TOTAL_BYTES - budget.bytes))
        except ArchiveError as error:
            raise _StagingError(RunStatus.UNREADABLE, str(error)) from None
        archive.unlink()
    for notebook in sorted(destination.rglob("*.ipynb")):
        try:
            converted = convert(notebook.read_bytes(), run_all_cells=run_all_cells,
                                name=notebook.name)
        except NotebookError as error:
            raise _StagingError(RunStatus.UNREADABLE, str(error)) from None
        module = notebook.with_name(module_file_name(notebook.stem) + ".py")
        if module.exists():
            module = module.with_name(module.stem + "_notebook.py")
        module.write_text(converted.source, encoding="utf-8")
        notebook.unlink()
        relative = module.relative_to(destination).as_posix()
        staged.notes += [f"{notebook.name} (as {relative}): {note}" for note in converted.notes]
        staged.syntax_errors += [f"{notebook.name}, {error}" for error in converted.syntax_errors]


def tree_hash(directory: Path) -> str:
    """sha256 of every file's relative path and bytes under ``directory``, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]
