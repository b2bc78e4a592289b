"""Scale-out: the partition of a class into shards (``--shard K/N``) and merging their outputs
(``--merge``): who lands where, what a merge equals, and the shard outputs it refuses.

The class here is made of submissions without Python code ("no code"): they are graded without
running anything, so every shard takes milliseconds. The example class, graded for real in two
shards, is in test_grading_example.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conformance.frontends.cli import main
from conformance.grading import merge, pipeline, shards
from conformance.grading.intake.discovery import Submission
from conformance.grading.intake.roster import Person, Roster
from conformance.grading.intake.roster import load as load_roster
from conformance.grading.score.rubric_file import load as load_rubric

AS_OF = datetime(2026, 2, 20, tzinfo=timezone.utc)
RUBRIC = """
[assignment]
name = "tiny"
seed = {seed}
[[targets]]
class = "MultiHeadAttention"
interface = {{ call = "self", mask = "keep_bool:key_padding", causal = "never" }}
[[targets.items]]
check = "gate"
points = 0
[[targets.items]]
check = "padding"
points = {points}
"""
IDS = [f"{n}" for n in range(1001, 1013)]
ROSTER = ("id,name,email\n" + "".join(f"{i},Student {i},s{i}@example.edu\n" for i in IDS)
          + "2001,Never Submitted,never@example.edu\n2002,Also Absent,absent@example.edu\n")


# -- the partition ---------------------------------------------------------------------------

def test_shard_parses_k_of_n_and_refuses_anything_else():
    assert shards.parse("1/4") == shards.Shard(1, 4) and str(shards.parse(" 4 / 4 ")) == "4/4"
    for bad in ("0/4", "5/4", "1/0", "4", "a/b", "-1/4", "1/4/2", ""):
        with pytest.raises(shards.ShardError, match="--shard"):
            shards.parse(bad)


def test_every_student_lands_in_exactly_one_shard_and_the_shards_are_balanced():
    ids = [f"student-{n}" for n in range(2000)] + ["1001", "torvalds", "Ada Lovelace", "é"]
    for count in (1, 2, 3, 7):
        owners = {i: [k for k in range(1, count + 1) if shards.Shard(k, count).holds(i)]
                  for i in ids}
        assert all(len(owner) == 1 for owner in owners.values()), count
    sizes = [sum(shards.shard_of(i, 4) == k for i in ids[:2000]) for k in range(1, 5)]
    assert all(430 <= size <= 570 for size in sizes), sizes  # 500 each, +-3.5 sd


def test_a_students_shard_does_not_depend_on_the_others_or_on_the_process():
    submissions = [Submission(id=f"s{n}", name="", layout="file") for n in range(60)]
    shard = shards.Shard(2, 3)
    every = shards.part(submissions, shard)
    some = shards.part(submissions[::4], shard)
    assert some == [s for s in every if s in submissions[::4]]
    # Another interpreter with another string-hash seed puts every id in the same shard.
    code = ("from conformance.grading.shards import shard_of; "
            "print(' '.join(str(shard_of(f's{n}', 3)) for n in range(60)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert other.stdout.split() == [str(shards.shard_of(f"s{n}", 3)) for n in range(60)]


def test_rostered_students_are_listed_once_across_the_shards():
    ada, bob, cy, dee = (Person(("ada",), "Ada"), Person(("bob",), "Bob"),
                         Person(("cy1", "cy2"), "Cy"), Person(("dee",), "Dee"))
    roster = Roster([ada, bob, cy, dee])
    submitted = [Submission(id=i, name="", layout="file") for i in ("ada", "cy1", "cy2", "zed")]
    count = 3
    listed = {k: shards.roster_part(roster, submitted, shards.Shard(k, count)).people
              for k in range(1, count + 1)}
    for person in (bob, dee):  # no submission: in the one shard of their row id
        assert [k for k, people in listed.items() if person in people] \
            == [shards.shard_of(person.ids[0], count)]
    # With a submission: wherever one of theirs is, never as "no submission" elsewhere.
    assert [k for k, people in listed.items() if ada in people] == [shards.shard_of("ada", count)]
    assert {k for k, people in listed.items() if cy in people} \
        == {shards.shard_of("cy1", count), shards.shard_of("cy2", count)}
    assert shards.roster_part(None, submitted, shards.Shard(1, 2)) is None


# -- merging ---------------------------------------------------------------------------------

@pytest.fixture
def tiny(tmp_path):
    """A class of twelve Canvas submissions without code and a roster with two absentees."""
    folder = tmp_path / "download"
    folder.mkdir()
    for i in IDS:
        (folder / f"student{i}_{i}_5{i}_notes.txt").write_text(f"notes of {i}\n")
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(RUBRIC.format(seed=1, points=2))
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER)
    return folder, rubric, roster


def grade(tiny, out: Path, shard: str | None = None, *, rubric: Path | None = None,
          folder: Path | None = None, only: set[str] | None = None):
    download, default_rubric, roster = tiny
    return pipeline.grade_class(folder or download, load_rubric(rubric or default_rubric), out,
                                roster=load_roster(roster), as_of=AS_OF, only=only,
                                shard=shards.parse(shard) if shard else None)


def merged(tiny, folders: list[Path], out: Path, *, rubric: Path | None = None):
    _, default_rubric, roster = tiny
    return merge.merge(folders, load_rubric(rubric or default_rubric), out,
                       roster=load_roster(roster), as_of=AS_OF)


def test_three_shards_merged_write_what_one_run_writes(tiny, tmp_path):
    single = tmp_path / "single"
    grade(tiny, single)
    parts = [tmp_path / f"s{k}" for k in (1, 2, 3)]
    results = [grade(tiny, part, f"{k}/3") for k, part in enumerate(parts, 1)]
    rows = [{s.id for s in r.students} for r in results]
    assert all(rows) and sum(map(len, rows)) == len(set().union(*rows)) == 14
    summary = json.loads((parts[0] / "run.json").read_text())["shard"]
    assert (summary["index"], summary["count"], summary["class"]["submissions"]) == (1, 3, 12)
    assert set(summary["submissions"]) == rows[0] - {"2001", "2002"}
    out = tmp_path / "merged"
    result = merged(tiny, parts, out)
    assert result.submissions == 12 and len(result.students) == 14
    for name in ("grades.csv", "classroom.csv", "class_report.md"):
        assert (out / name).read_bytes() == (single / name).read_bytes(), name
    for i in [*IDS, "2001", "2002"]:
        ours, theirs = out / "students" / i, single / "students" / i
        assert (ours / "feedback.md").read_bytes() == (theirs / "feedback.md").read_bytes(), i
        # The same content (a stored result's versions come back in sorted order, as on resuming).
        assert json.loads((ours / "results.json").read_text()) \
            == json.loads((theirs / "results.json").read_text()), i
    assert sorted(p.name for p in (out / "results").iterdir()) == [f"{i}.json" for i in IDS]
    assert sorted(p.name for p in (out / "staged").iterdir()) == IDS
    run = json.loads((out / "run.json").read_text())
    assert "shard" not in run and run == json.loads((single / "run.json").read_text())
    # The merged folder resumes like one run's.
    again = grade(tiny, out)
    assert again.graded == [] and len(again.reused) == 12
    assert (out / "grades.csv").read_bytes() == (single / "grades.csv").read_bytes()


def test_a_shard_that_holds_nobody_still_writes_its_outputs(tiny, tmp_path):
    count = 40
    taken = {shards.shard_of(i, count) for i in [*IDS, "2001", "2002"]}
    empty = min(set(range(1, count + 1)) - taken)
    result = grade(tiny, tmp_path / "empty", f"{empty}/{count}")
    assert result.students == [] and result.graded == []
    assert (tmp_path / "empty" / "grades.csv").read_text().count("\n") == 2  # header, points
    summary = json.loads((tmp_path / "empty" / "run.json").read_text())["shard"]
    assert summary["submissions"] == {} and summary["class"]["submissions"] == 12


@pytest.fixture
def halves(tiny, tmp_path):
    parts = [tmp_path / "s1", tmp_path / "s2"]
    for k, part in enumerate(parts, 1):
        grade(tiny, part, f"{k}/2")
    return parts


def refused(tiny, folders, tmp_path, match, **options):
    with pytest.raises(merge.MergeError, match=match):
        merged(tiny, folders, tmp_path / "merged", **options)


def test_merge_refuses_missing_shards_and_shards_of_other_splits(tiny, halves, tmp_path):
    refused(tiny, halves[:1], tmp_path, r"missing shard\(s\) 2/2: merge the outputs of every")
    third = tmp_path / "third"
    grade(tiny, third, "3/3")
    refused(tiny, [*halves, third], tmp_path, r"are shards of different splits: 2 vs 3")
    refused(tiny, [*halves, tmp_path / "nowhere"], tmp_path, "no readable run.json")
    whole = tmp_path / "whole"
    grade(tiny, whole)
    refused(tiny, [*halves, whole], tmp_path, "is not a shard output")
    with pytest.raises(merge.MergeError, match="is one of the shard outputs"):
        merged(tiny, halves, halves[0])


def test_merge_refuses_shards_of_other_rubrics_or_versions(tiny, halves, tmp_path):
    points = tmp_path / "points.toml"
    points.write_text(RUBRIC.format(seed=1, points=3))
    other = tmp_path / "other-points"
    grade(tiny, other, "2/2", rubric=points)
    refused(tiny, [halves[0], other], tmp_path, r"different rubrics \(rubric hash\)")
    seed = tmp_path / "seed.toml"
    seed.write_text(RUBRIC.format(seed=2, points=2))
    refused(tiny, halves, tmp_path, r"graded under another rubric than .*seed\.toml "
                                     r"\(execution key", rubric=seed)
    for which in (halves[1], halves[0]):
        run = json.loads((which / "run.json").read_text())
        run["versions"]["torch"] = "1.0.0"
        (which / "run.json").write_text(json.dumps(run))
        if which == halves[1]:
            refused(tiny, halves, tmp_path, r"were graded by different versions: .*torch 1\.0\.0")
    refused(tiny, halves, tmp_path, r"was graded by torch 1\.0\.0, this is torch \S+: "
                                    r"merge with the versions that graded")


def test_merge_refuses_different_downloads_and_unfinished_shards(tiny, halves, tmp_path):
    bigger = tmp_path / "bigger"
    shutil.copytree(tiny[0], bigger)
    (bigger / "late_1099_51099_notes.txt").write_text("late\n")
    other = tmp_path / "other-download"
    grade(tiny, other, "2/2", folder=bigger)
    refused(tiny, [halves[0], other], tmp_path, r"saw different downloads: submissions 12, ids_hash")
    # --only on a fresh folder leaves the rest of the shard ungraded.
    mine = [i for i in IDS if shards.shard_of(i, 2) == 2]
    partial = tmp_path / "partial"
    grade(tiny, partial, "2/2", only={mine[0]})
    refused(tiny, [halves[0], partial], tmp_path,
            rf"left {len(mine) - 1} submission\(s\) ungraded .*rerun it without --only")
    # A stored result removed (or replaced) after the shard's run.json was written.
    (halves[1] / "results" / f"{mine[1]}.json").unlink()
    refused(tiny, halves, tmp_path, rf"results/{mine[1]}\.json is missing or not the result")


def test_merge_takes_a_student_twice_only_with_the_same_result(tiny, halves, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(halves[0], copy)
    result = merged(tiny, [*halves, copy], tmp_path / "merged")
    assert result.submissions == 12
    student = next(iter(json.loads((copy / "run.json").read_text())["shard"]["submissions"]))
    record_path = copy / "results" / f"{student}.json"
    record = json.loads(record_path.read_text())
    record["outcome"]["status"] = "unreadable"
    record_path.write_text(json.dumps(record))
    refused(tiny, [*halves, copy], tmp_path, rf"{student} is in .* with different results")


def test_shard_and_merge_on_the_command_line(tiny, tmp_path, capsys):
    folder, rubric, roster = tiny
    common = ["--rubric", str(rubric), "--roster", str(roster), "--as-of", "2026-02-20T00:00:00Z"]
    for k in (1, 2):
        assert main(["grade", str(folder), *common, "--shard", f"{k}/2",
                     "--out", str(tmp_path / f"s{k}")]) == 0
    assert "shard 2/2: graded" in capsys.readouterr().out
    out = tmp_path / "merged"
    assert main(["grade", "--merge", str(tmp_path / "s1"), str(tmp_path / "s2"), *common,
                 "--out", str(out)]) == 0
    assert "merged 2 shard(s) from 2 folder(s): 12 submission(s), 14 row(s)" \
        in capsys.readouterr().out
    assert main(["grade", str(folder), *common, "--out", str(tmp_path / "single")]) == 0
    assert (out / "grades.csv").read_bytes() == (tmp_path / "single" / "grades.csv").read_bytes()
    for argv, message in [
        (["grade", str(folder), *common, "--shard", "3/2"], "--shard 3/2: K must run from 1 to N"),
        (["grade", "--merge", str(tmp_path / "s1"), *common, "--out", str(tmp_path / "m")],
         "missing shard(s) 2/2"),
        (["grade", "--merge", str(tmp_path / "s1"), *common, "--shard", "1/2"],
         "--shard grades part of a class: not with"),
        (["grade", str(folder), "--merge", str(tmp_path / "s1"), *common],
         "--merge combines shard outputs: give no SUBMISSIONS"),
    ]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        stderr = capsys.readouterr().err
        assert message in stderr and stderr.count("\n") == 1, stderr


def test_the_job_files_grade_shards_one_to_n_and_merge_them_all():
    folder = Path(__file__).parents[1] / "docs" / "scale-out"
    k8s = (folder / "k8s-indexed-job.yaml").read_text()
    count = int(re.search(r"completions: (\d+)", k8s)[1])
    assert f"parallelism: {count}" in k8s and re.search(rf'name: SHARDS\s+value: "{count}"', k8s)
    assert "K=$((JOB_COMPLETION_INDEX + 1))" in k8s and '--shard "$K/$SHARDS"' in k8s
    actions = (folder / "github-actions.yml").read_text()
    count = int(re.search(r"SHARDS: (\d+)", actions)[1])
    matrix = re.search(r"shard: \[([\d, ]+)\]", actions)[1]
    assert [int(k) for k in matrix.split(",")] == list(range(1, count + 1))
    assert '--shard "${{ matrix.shard }}/$SHARDS"' in actions
    slurm = (folder / "slurm-array.sbatch").read_text()
    assert "--array=1-" in slurm and '--shard "$K/$N"' in slurm
    for name, merged_folders in [("k8s-merge-job.yaml", "shards/*/"),
                                 ("github-actions.yml", "shards/shard-*/"),
                                 ("slurm-merge.sbatch", "shards/*/")]:
        text = (folder / name).read_text()
        assert f"grade --merge {merged_folders} --rubric rubric.toml" in text, name
        assert "--roster roster.csv --out grading" in text, name
