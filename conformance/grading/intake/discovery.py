"""Finding the submissions in a folder as an LMS hands it out: one submission per student.

Recognised layouts (checked in this order, entry by entry; one download may mix them):

- **Canvas** flat files ``{name}_{userid}_{submissionid}_{file}``, late ones
  ``{name}_LATE_{userid}_{submissionid}_{file}`` (``late`` in any case). The student id is the
  Canvas user id; every file with the same user id belongs to one submission; Canvas' ``-1``,
  ``-2`` suffix for resubmitted files (``attention-1.py``) is taken off again.
- **Moodle** folders ``{Full Name}_{participantid}_assignsubmission_file_/`` (and the flat form
  ``{Full Name}_{participantid}_assignsubmission_file_{file}``); the id is the participant id.
  ``..._onlinetext_`` entries are ignored.
- **GitHub Classroom** repositories ``{assignment}-{username}/``: the assignment prefix is the
  rubric's ``github_classroom_prefix``, or else the longest ``-``-terminated prefix shared by two
  or more remaining folders; the id is the username.
- any other **folder** is one student's (id: the folder name); any other **file** (``.py``,
  ``.ipynb``, ``.zip``) is one student's (id: the file name without its extension).

Hidden entries and archiver debris (``__MACOSX``, ``.DS_Store``) are skipped. Ids are made safe
as file names (letters, digits, ``.``, ``_``, ``-``); a clash gets ``-2``, ``-3``... The order of
submissions is sorted by id, so nothing depends on the order the file system lists them in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from conformance.grading.intake.archives import is_junk

CANVAS = re.compile(r"^(?P<name>[^_]+)(?P<late>_late)?_(?P<user>\d+)_(?P<submission>\d+)_"
                    r"(?P<file>.+)$", re.IGNORECASE)
MOODLE_FOLDER = re.compile(r"^(?P<name>.+?)_(?P<id>\d+)_assignsubmission_(?P<plugin>[a-z]+)_$")
MOODLE_FILE = re.compile(r"^(?P<name>.+?)_(?P<id>\d+)_assignsubmission_(?P<plugin>[a-z]+)_"
                         r"(?P<file>.+)$")
RESUBMISSION = re.compile(r"^(?P<stem>.+)-\d+(?P<suffix>\.[A-Za-z0-9]+)$")
CODE_SUFFIXES = (".py", ".ipynb", ".zip")


@dataclass(frozen=True)
class SubmissionSource:
    """A file or folder that is (part of) a submission, and the name it gets when staged."""

    path: Path
    staged_name: str


@dataclass
class Submission:
    """One student's submission as found in the download.

    Attributes:
        id: the student's id (from the LMS naming), safe as a file name.
        name: the student's name where the naming carries one ("" otherwise).
        layout: ``canvas``, ``moodle``, ``github-classroom``, ``folder`` or ``file``.
        sources: the files and folders to stage, in a fixed order.
        late: the LMS marked it late (Canvas ``_LATE_``).
        repository: the GitHub Classroom repository's folder name.
    """

    id: str
    name: str
    layout: str
    sources: list[SubmissionSource] = field(default_factory=list)
    late: bool = False
    repository: str | None = None


def safe_id(text: str) -> str:
    """``text`` as a file-name-safe id."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip()).strip("-.")
    return cleaned or "submission"


def _canvas_file_name(name: str) -> str:
    match = RESUBMISSION.match(name)
    return f"{match['stem']}{match['suffix']}" if match else name


def _entries(folder: Path) -> list[Path]:
    return sorted((entry for entry in folder.iterdir()
                   if not entry.name.startswith(".") and not is_junk((entry.name,))),
                  key=lambda entry: entry.name)


def _github_prefix(names: list[str], configured: str | None) -> str | None:
    """The GitHub Classroom assignment prefix: configured, or the ``-``-terminated prefix that
    the most folders (two at least) share, the longest among equals."""
    if configured:
        return configured.rstrip("-") + "-"
    counts: dict[str, int] = {}
    for name in names:
        for cut, character in enumerate(name[:-1]):
            if character == "-" and cut > 0:
                counts[name[:cut + 1]] = counts.get(name[:cut + 1], 0) + 1
    shared = [(count, len(prefix), prefix) for prefix, count in counts.items() if count >= 2]
    return max(shared)[2] if shared else None


def discover(folder: Path, *, github_classroom_prefix: str | None = None,
             exclude: tuple[Path, ...] = ()) -> list[Submission]:
    """Every submission in ``folder`` (see the module docstring for the layouts); ``exclude``:
    entries that are not submissions (the output folder, when it lies inside)."""
    excluded = {path.resolve() for path in exclude}
    by_key: dict[tuple[str, str], Submission] = {}
    generic_folders: list[Path] = []
    generic_files: list[Path] = []

    def add(layout: str, key: str, name: str, source: SubmissionSource, late: bool = False) -> None:
        submission = by_key.setdefault((layout, key), Submission(id=key, name=name, layout=layout))
        staged = {s.staged_name for s in submission.sources}
        if source.staged_name in staged:  # two files by one name: keep both, the later renamed
            source = SubmissionSource(source.path, f"{Path(source.staged_name).stem}-{len(staged)}"
                                                   f"{Path(source.staged_name).suffix}")
        submission.sources.append(source)
        submission.late = submission.late or late

    for entry in _entries(folder):
        if entry.is_symlink():
            continue  # a link may point anywhere: never followed
        if entry.resolve() in excluded:
            continue
        if entry.is_dir():
            moodle = MOODLE_FOLDER.match(entry.name)
            if moodle:
                if moodle["plugin"] == "file":
                    add("moodle", moodle["id"], moodle["name"], SubmissionSource(entry, ""))
                continue
            generic_folders.append(entry)
            continue
        if not entry.is_file():
            continue
        moodle = MOODLE_FILE.match(entry.name)
        if moodle:
            if moodle["plugin"] == "file":
                add("moodle", moodle["id"], moodle["name"], SubmissionSource(entry, moodle["file"]))
            continue
        canvas = CANVAS.match(entry.name)
        if canvas:
            add("canvas", canvas["user"], canvas["name"],
                SubmissionSource(entry, _canvas_file_name(canvas["file"])), late=bool(canvas["late"]))
            continue
        if entry.suffix.lower() in CODE_SUFFIXES:
            generic_files.append(entry)

    prefix = _github_prefix([f.name for f in generic_folders], github_classroom_prefix)
    for entry in generic_folders:
        if prefix and entry.name.startswith(prefix) and len(entry.name) > len(prefix):
            user = entry.name[len(prefix):]
            submission = Submission(id=user, name="", layout="github-classroom",
                                    sources=[SubmissionSource(entry, "")], repository=entry.name)
            by_key[("github-classroom", user)] = submission
        else:
            add("folder", entry.name, "", SubmissionSource(entry, ""))
    for entry in generic_files:
        add("file", entry.stem, "", SubmissionSource(entry, entry.name))

    submissions = sorted(by_key.values(), key=lambda s: (safe_id(s.id), s.layout))
    taken: set[str] = set()
    for submission in submissions:
        base = safe_id(submission.id)
        candidate, number = base, 1
        while candidate in taken:
            number += 1
            candidate = f"{base}-{number}"
        submission.id = candidate
        taken.add(candidate)
    return submissions
