"""Per-student results on disk, so an interrupted run resumes and a rerun regrades nothing.

One JSON file per student, ``OUT/results/{id}.json``, written atomically (a temporary file,
then a rename) as soon as that student is done. A stored result is reused when it was made
from the same staged files (submission hash), the same execution-relevant rubric
(:meth:`Rubric.execution_key`: targets, interfaces, checks, profile, seed, limits), the same
versions of the suite, torch and hypothesis, and the same installed packages (a digest of their
names and versions: installing the package a submission lacked regrades it). Points, groups,
visibility and the due date are not part of the key: they are applied afresh every time, so
changing them rescores without rerunning anything.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from conformance.grading.score.outcome import RunStatus, SubmissionOutcome

FORMAT = 1


def versions() -> dict[str, str]:
    """The versions a result depends on (and the Python that made it, for the record)."""
    import hypothesis
    import torch

    from conformance._version import __version__

    return {"attention-conformance": __version__, "torch": torch.__version__,
            "hypothesis": hypothesis.__version__, "python": platform.python_version(),
            "environment": environment()}


@functools.cache  # 0.4 s to read; a run installs nothing while it grades
def environment() -> str:
    """A digest of every package installed in this Python (names and versions): a submission
    may import any of them, so installing one (the package a submission was missing) or
    changing one's version makes every stored result stale."""
    from importlib.metadata import distributions

    installed = sorted({f"{(d.metadata['Name'] or '').lower()}=={d.version}"
                        for d in distributions()})
    return hashlib.sha256("\n".join(installed).encode()).hexdigest()[:16]


KEYED_VERSIONS = ("attention-conformance", "torch", "hypothesis", "environment")


@dataclass
class Record:
    """One student's stored result: who, what was graded, and what running it gave."""

    id: str
    name: str
    layout: str
    late: bool
    repository: str | None
    submission_hash: str
    execution_key: str
    files: list[str]
    notes: list[str]
    outcome: SubmissionOutcome
    versions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "id": self.id, "name": self.name, "layout": self.layout,
                "late": self.late, "repository": self.repository,
                "submission_hash": self.submission_hash, "execution_key": self.execution_key,
                "versions": self.versions, "files": self.files, "notes": self.notes,
                "outcome": self.outcome.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> Record:
        return cls(id=data["id"], name=data.get("name", ""), layout=data.get("layout", ""),
                   late=bool(data.get("late", False)), repository=data.get("repository"),
                   submission_hash=data["submission_hash"], execution_key=data["execution_key"],
                   files=list(data.get("files", [])), notes=list(data.get("notes", [])),
                   outcome=SubmissionOutcome.from_dict(data["outcome"]),
                   versions=dict(data.get("versions", {})))


class Store:
    """The ``results/`` folder of an output directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, student: str) -> Path:
        return self.directory / f"{student}.json"

    def load(self, student: str) -> Record | None:
        """The stored record, or None (absent, unreadable, or of another format)."""
        path = self.path(student)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                return None
            return Record.from_dict(data)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def current(self, student: str, submission_hash: str, execution_key: str) -> Record | None:
        """The stored record when it still holds for these files, rubric and versions."""
        record = self.load(student)
        if record is None or record.submission_hash != submission_hash \
                or record.execution_key != execution_key:
            return None
        if record.outcome.status is RunStatus.MISSING_PACKAGE:
            return None  # the environment's problem: tried again, whatever the digest says
        # (a package may become importable without its name or version changing: installed
        # where the sandboxed worker can read it)
        now = versions()
        if any(record.versions.get(k) != now[k] for k in KEYED_VERSIONS):
            return None
        return record

    def save(self, record: Record) -> None:
        """Write atomically: an interrupted run never leaves half a file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        text = json.dumps(record.to_dict(), indent=1, sort_keys=True) + "\n"
        handle, temporary = tempfile.mkstemp(dir=self.directory, prefix=f".{record.id}.",
                                             suffix=".tmp")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as stream:
                stream.write(text)
            os.replace(temporary, self.path(record.id))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
