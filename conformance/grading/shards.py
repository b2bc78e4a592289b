"""Splitting a class into N shards that N machines grade, one each (``grade --shard K/N``).

A student belongs to shard ``1 + H mod N``, where ``H`` is the first 8 bytes (big-endian) of
the sha256 of their **submission id** (UTF-8), the id ``grades.csv`` shows. The shard depends on
nothing else: not on the machine, the Python process, the submission's content, or which other
submissions are there; every id lands in exactly one shard. A student who resubmits keeps their
shard, so rerunning a shard's command on a newer download resumes that shard's folder.

Every shard discovers the whole download (a listing, cheap), then stages and grades only its
part. Rostered students without a submission anywhere in the class are placed by their row's id
the same way; a rostered student who submitted is listed where their submission is. Each
shard's ``run.json`` gains a ``shard`` entry (its K/N, the class it saw, the submissions it
holds) that :mod:`conformance.grading.merge` checks before combining.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from conformance.errors import ConformanceError
from conformance.grading.intake.discovery import Submission
from conformance.grading.intake.roster import Roster
from conformance.grading.report import outputs

BY = "sha256 of the submission id"
"""How a student's shard is chosen, as recorded in each shard's ``run.json``."""


class ShardError(ConformanceError, ValueError):
    """A ``--shard`` that can't be read; one line."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (1 <= index <= count)."""

    index: int
    count: int

    def holds(self, student: str) -> bool:
        """Whether the student with this id belongs to this shard."""
        return shard_of(student, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse(text: str) -> Shard:
    """``K/N`` as a Shard. Raises ShardError (one line)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ShardError(f"--shard {text!r}: give K/N, e.g. 1/4 for the first of four shards")
    index, count = int(match[1]), int(match[2])
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"--shard {text}: K must run from 1 to N, N at least 1 (the shards of "
                         "four are 1/4, 2/4, 3/4 and 4/4)")
    return Shard(index, count)


def shard_of(student: str, count: int) -> int:
    """The shard (1 to ``count``) of the student with this id."""
    digest = hashlib.sha256(student.encode("utf-8")).digest()
    return 1 + int.from_bytes(digest[:8], "big") % count


def part(submissions: list[Submission], shard: Shard) -> list[Submission]:
    """The submissions of ``shard``, in their order."""
    return [s for s in submissions if shard.holds(s.id)]


def roster_part(roster: Roster | None, submissions: list[Submission],
                shard: Shard) -> Roster | None:
    """The roster rows ``shard``'s outputs list: the people matched to one of its submissions,
    and the people matched to no submission of the whole class (``submissions``) whose row id
    (their first id, as the grade book shows it) belongs to it."""
    if roster is None:
        return None
    here: set[int] = set()       # people with a submission in this shard
    anywhere: set[int] = set()   # people with a submission in any shard
    for submission in submissions:
        person = roster.find(submission.id)
        if person is not None:
            anywhere.add(id(person))
            if shard.holds(submission.id):
                here.add(id(person))
    return Roster([person for person in roster.people
                   if id(person) in here
                   or (id(person) not in anywhere and shard.holds(person.ids[0]))])


def class_fingerprint(submissions: list[Submission]) -> dict:
    """What identifies the class a shard saw: how many submissions, and a hash of their ids."""
    ids = "\n".join(sorted(s.id for s in submissions))
    return {"submissions": len(submissions),
            "ids_hash": hashlib.sha256(ids.encode("utf-8")).hexdigest()[:16]}


def stamp(run_json: Path, shard: Shard, submissions: list[Submission],
          held: dict[str, str], left_out: list[str]) -> None:
    """Add the ``shard`` entry to a shard's ``run.json``: its K/N, the class it saw (all of
    ``submissions``), the submissions it holds (id to submission hash) and those it left out."""
    summary = json.loads(run_json.read_text(encoding="utf-8"))
    summary["shard"] = {"index": shard.index, "count": shard.count, "by": BY,
                        "class": class_fingerprint(submissions),
                        "submissions": dict(sorted(held.items())),
                        "left_out": sorted(left_out)}
    outputs.write_json(run_json, summary)
