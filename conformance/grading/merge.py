"""Combining the outputs of ``grade --shard K/N`` into one (``grade --merge OUT1 ... --out OUT``).

The merged folder holds what one run over the whole class writes: the shards' stored results
(``results/ID.json``) and staged files, and every output written afresh from those results, the
rubric and the roster by the functions a run uses (:func:`pipeline.assemble`,
:func:`pipeline.write_outputs`). So ``grades.csv`` is the one a single run writes, byte for
byte, the class report is computed over the whole class, and running ``grade`` on the merged
folder later resumes it like any output folder. Nothing is run: merging reads JSON and writes
files.

Refused, in one line (:class:`MergeError`): a folder that is not a shard output; shards of
different splits (N), of different rubrics (rubric hash or execution key) or of other versions
than each other or than this installation; shards that saw different downloads; a shard that
left submissions ungraded (``--only``) or whose stored results are not the ones it listed; a
student in two shards with different results; and missing shards.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from conformance.errors import ConformanceError
from conformance.grading import pipeline, shards
from conformance.grading.intake.discovery import Submission
from conformance.grading.intake.roster import Roster
from conformance.grading.run.store import KEYED_VERSIONS, Record, Store, versions
from conformance.grading.score.rubric import Rubric


class MergeError(ConformanceError):
    """Shard outputs that can't be combined; one line."""


@dataclass
class ShardOutput:
    """What a shard's ``run.json`` says about it."""

    folder: Path
    shard: shards.Shard
    rubric_hash: str
    execution_key: str
    versions: dict[str, str]
    fingerprint: dict
    submissions: dict[str, str]
    """Student id to the submission hash of the result it holds."""
    left_out: list[str]


@dataclass
class Merged:
    """The merged class: its grade-book rows and the shards it came from."""

    students: list[pipeline.Student]
    outputs: list[ShardOutput]
    submissions: int


def read(folder: Path) -> ShardOutput:
    """The shard output in ``folder``. Raises MergeError (one line)."""
    try:
        summary = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise MergeError(f"{folder}: no readable run.json (not the output of grade)") from None
    info = summary.get("shard") if isinstance(summary, dict) else None
    if not isinstance(info, dict):
        raise MergeError(f"{folder} is not a shard output (its run.json has no shard): grade "
                         "each part with --shard K/N")
    try:
        return ShardOutput(
            folder=folder, shard=shards.Shard(int(info["index"]), int(info["count"])),
            rubric_hash=str(summary["rubric_hash"]), execution_key=str(summary["execution_key"]),
            versions={k: str(summary["versions"].get(k)) for k in KEYED_VERSIONS},
            fingerprint=dict(info["class"]),
            submissions={str(k): str(v) for k, v in dict(info["submissions"]).items()},
            left_out=[str(i) for i in info.get("left_out", [])])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise MergeError(f"{folder}: its run.json's shard entry is incomplete") from None


def _differ(outputs: list[ShardOutput], value) -> tuple[ShardOutput, ShardOutput] | None:
    first = outputs[0]
    for other in outputs[1:]:
        if value(other) != value(first):
            return first, other
    return None


def check(outputs: list[ShardOutput], rubric: Rubric) -> None:
    """Refuse (MergeError) shard outputs that do not make one class under ``rubric`` together."""
    for verb, value in [("are shards of different splits", lambda o: o.shard.count),
                        ("were graded under different rubrics (rubric hash)",
                         lambda o: o.rubric_hash),
                        ("were graded under different rubrics (execution key)",
                         lambda o: o.execution_key),
                        ("were graded by different versions", lambda o: o.versions),
                        ("saw different downloads", lambda o: o.fingerprint)]:
        pair = _differ(outputs, value)
        if pair:
            a, b = pair
            raise MergeError(f"{a.folder} (shard {a.shard}) and {b.folder} (shard {b.shard}) "
                             f"{verb}: {_say(value(a))} vs {_say(value(b))}")
    first = outputs[0]
    if first.execution_key != rubric.execution_key():
        raise MergeError(f"{first.folder} was graded under another rubric than {rubric.path} "
                         f"(execution key {first.execution_key}, not {rubric.execution_key()}): "
                         "merge with the rubric the shards were graded with")
    here = {k: versions()[k] for k in KEYED_VERSIONS}
    differ = [k for k in KEYED_VERSIONS if first.versions[k] != here[k]]
    if differ:
        raise MergeError(f"{first.folder} was graded by "
                         f"{_say({k: first.versions[k] for k in differ})}, this is "
                         f"{_say({k: here[k] for k in differ})}: merge with the versions that "
                         "graded")
    for output in outputs:
        if output.left_out:
            raise MergeError(f"{output.folder} (shard {output.shard}) left "
                             f"{len(output.left_out)} submission(s) ungraded "
                             f"({', '.join(output.left_out[:5])}): rerun it without --only")
    count = first.shard.count
    missing = sorted(set(range(1, count + 1)) - {o.shard.index for o in outputs})
    if missing:
        named = ", ".join(f"{k}/{count}" for k in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        raise MergeError(f"missing shard(s) {named}{more}: merge the outputs of every shard")


def _say(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return str(value)


def _verdicts(record: Record) -> tuple:
    """What a result grades by (statuses, per check), leaving out timings and output."""
    outcome = record.outcome
    return (record.submission_hash, outcome.status, outcome.message,
            tuple((t.target, t.status, tuple((r.check, r.status) for r in t.results))
                  for t in outcome.targets))


def records(outputs: list[ShardOutput], rubric: Rubric) -> dict[str, Record]:
    """Every shard's stored results, by student id. Raises MergeError (one line)."""
    key = rubric.execution_key()
    found: dict[str, Record] = {}
    where: dict[str, Path] = {}
    for output in outputs:
        store = Store(output.folder / "results")
        for student, submission_hash in output.submissions.items():
            if not output.shard.holds(student):
                raise MergeError(f"{output.folder}: {student} does not belong to shard "
                                 f"{output.shard} ({shards.BY})")
            record = store.current(student, submission_hash, key)
            if record is None:
                raise MergeError(f"{output.folder}: results/{student}.json is missing or not "
                                 "the result its run.json lists: rerun that shard's command")
            if student in found and _verdicts(found[student]) != _verdicts(record):
                raise MergeError(f"{student} is in {where[student]} and {output.folder} with "
                                 "different results")
            found.setdefault(student, record)
            where.setdefault(student, output.folder)
    expected = outputs[0].fingerprint.get("submissions")
    if len(found) != expected:
        raise MergeError(f"the shards hold {len(found)} of the class's {expected} submissions")
    return found


def merge(folders: list[Path], rubric: Rubric, out: Path, *, roster: Roster | None = None,
          as_of: datetime | None = None) -> Merged:
    """Combine the shard outputs in ``folders`` into ``out``: every stored result and staged
    folder copied, every output written as one run over the whole class writes it."""
    if not folders:
        raise MergeError("no shard outputs to merge")
    resolved = {folder.resolve() for folder in folders}
    if out.resolve() in resolved:
        raise MergeError(f"--out {out} is one of the shard outputs: merge into another folder")
    outputs = [read(folder) for folder in folders]
    check(outputs, rubric)
    found = records(outputs, rubric)
    store = Store(out / "results")
    source = {}
    for output in outputs:
        for student in output.submissions:
            source.setdefault(student, output.folder)
    for student, record in sorted(found.items()):
        store.save(record)
        staged = source[student] / "staged" / student
        if staged.is_dir():
            target = out / "staged" / student
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(staged, target, symlinks=True)
    submissions = [Submission(id=r.id, name=r.name, layout=r.layout, late=r.late,
                              repository=r.repository) for _, r in sorted(found.items())]
    students = pipeline.assemble(rubric, submissions, found, roster)
    pipeline.write_outputs(out, rubric, students, roster=roster, as_of=as_of)
    return Merged(students, outputs, len(found))
