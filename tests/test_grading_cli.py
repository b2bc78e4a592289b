"""``attention-conformance grade`` on the command line: grading through the worker (a fake one
here), Gradescope mode, the self-test, progress, and one clear line for bad input."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from conformance.frontends.cli import main
from conformance.grading import selftest
from conformance.grading.progress import GradingProgress
from conformance.grading.score.outcome import RunStatus, SubmissionOutcome, TargetOutcome
from conformance.grading.score.rubric_file import load
from conformance.model.results import CheckResult, Status
from conformance.worker import sandbox

EXAMPLE = Path(__file__).parents[1] / "examples" / "attention-assignment"
SUBMISSIONS = EXAMPLE / "submissions"

RUBRIC = """
[assignment]
name = "mini"
reference = "{reference}"
seed = 1
[[targets]]
class = "MultiHeadAttention"
interface = {{ call = "self", mask = "keep_bool:key_padding", causal = "never" }}
[[targets.items]]
check = "gate"
points = 0
[[targets.items]]
check = "padding"
points = 2
[[targets.items]]
check = "scale"
points = 1
"""


@pytest.fixture
def mini(tmp_path):
    """Two students (one correct, one with the wrong scale) and a small rubric."""
    folder = tmp_path / "download"
    folder.mkdir()
    for name in ("lovelaceada_1001_50001_attention.py", "turingalan_LATE_1003_50003_attention-1.py"):
        shutil.copy(SUBMISSIONS / name, folder / name)
    rubric = tmp_path / "rubric.toml"
    rubric.write_text(RUBRIC.format(reference=EXAMPLE / "reference" / "attention.py"))
    return folder, rubric


def test_grade_writes_every_output_and_says_so(mini, tmp_path, capsys):
    folder, rubric = mini
    out = tmp_path / "out"
    code = main(["grade", str(folder), "--rubric", str(rubric), "--out", str(out),
                 "--as-of", "2026-02-01T00:00:00Z"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert stderr == ""                                      # no progress line: not a terminal
    tier = sandbox.resolve_kind("filesystem")                # bubblewrap, else Landlock
    assert stdout.startswith(f"sandbox: {tier}\n")
    assert "graded 2, reused 0" in stdout and "statuses: graded 2" in stdout
    assert stdout.startswith(f"sandbox: {tier}\nreference solution: 3 / 3 (full marks)\n")
    rows = (out / "grades.csv").read_text().splitlines()
    assert rows[1] == "Points Possible,,,0,2,1,3,100,,,,"
    assert rows[2].startswith("1001,lovelaceada,,0,2,1,3,100.0,graded,")
    assert rows[3].startswith("1003,turingalan,yes,0,2,0,2,66.7,graded,")
    results = json.loads((out / "students" / "1003" / "results.json").read_text())
    assert results["extra_data"]["isolation"] == "worker"
    assert results["extra_data"]["sandbox"] == tier
    run = json.loads((out / "run.json").read_text())
    assert run["sandbox"] == [tier] and run["sandboxed"] is True
    assert f"- **Sandbox:** {tier} (2)\n" in (out / "class_report.md").read_text()
    # Again: nothing to do.
    assert main(["grade", str(folder), "--rubric", str(rubric), "--out", str(out)]) == 0
    assert "graded 0, reused 2" in capsys.readouterr().out


def test_bad_input_is_one_line(mini, tmp_path, capsys):
    folder, rubric = mini
    for argv, message in [
        (["grade", str(folder), "--rubric", str(rubric), "--only", "1001,42"],
         "--only: no submission with id 42"),
        (["grade", str(folder), "--rubric", str(rubric), "--as-of", "yesterday"], "--as-of"),
        (["grade", str(folder), "--rubric", str(rubric), "--roster", str(tmp_path / "no.csv")],
         "roster"),
        (["grade", "--rubric", str(rubric)], "name the SUBMISSIONS folder"),
    ]:
        code = main([*argv, "--out", str(tmp_path / "out")])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1 and message in err, (argv, err)


def test_students_are_graded_in_the_sandboxed_worker_and_the_run_says_how(mini, tmp_path,
                                                                          capsys):
    folder, rubric = mini
    out = tmp_path / "out"
    assert main(["grade", str(folder), "--rubric", str(rubric), "--out", str(out)]) == 0
    capsys.readouterr()
    record = json.loads(next((out / "results").glob("*.json")).read_text())
    assert record["outcome"]["isolation"] == "worker"
    assert "own session" in " ".join(record["outcome"]["protections"])


def test_without_a_filesystem_sandbox_every_mode_refuses_in_one_line(mini, tmp_path, capsys,
                                                                     monkeypatch):
    folder, rubric = mini
    monkeypatch.setattr(sandbox, "available", lambda: ("unshare", "none"))  # no bwrap, no Landlock
    submission = tmp_path / "autograder" / "submission"
    submission.mkdir(parents=True)
    shutil.copy(SUBMISSIONS / "lovelaceada_1001_50001_attention.py", submission / "attention.py")
    for argv in (["grade", str(folder), "--out", str(tmp_path / "out")],
                 ["grade", "--self-test"],
                 ["grade", "--gradescope", str(submission), "--results",
                  str(tmp_path / "results.json")]):
        code = main([*argv, "--rubric", str(rubric)])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1, (argv, out, err)
        assert "no filesystem sandbox works here" in err and \
            "install bubblewrap (apt-get install bubblewrap)" in err and "--no-sandbox" in err
    assert not (tmp_path / "out" / "grades.csv").exists()
    assert not (tmp_path / "results.json").exists()


def test_no_sandbox_grades_the_same_and_every_output_says_it_was_not_sandboxed(mini, tmp_path,
                                                                             capsys, monkeypatch):
    folder, rubric = mini
    monkeypatch.setattr(sandbox, "available", lambda: ("unshare", "none"))
    out = tmp_path / "out"
    code = main(["grade", str(folder), "--rubric", str(rubric), "--out", str(out), "--no-sandbox",
                 "--as-of", "2026-02-01T00:00:00Z"])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert stdout.splitlines()[0] == ("sandbox: NONE (--no-sandbox; unshare): student code is NOT "
                                      "SANDBOXED and can read and write whatever this user can")
    rows = (out / "grades.csv").read_text().splitlines()  # as in the sandboxed run above
    assert rows[2].startswith("1001,lovelaceada,,0,2,1,3,100.0,graded,")
    assert rows[3].startswith("1003,turingalan,yes,0,2,0,2,66.7,graded,")
    run = json.loads((out / "run.json").read_text())
    assert run["sandbox"] == ["none"] and run["sandboxed"] is False
    for student in ("1001", "1003"):
        results = json.loads((out / "students" / student / "results.json").read_text())
        assert results["extra_data"]["sandbox"] == "none"
    report = (out / "class_report.md").read_text()
    assert "- **Sandbox:** NOT SANDBOXED (2 submission(s), --no-sandbox)" in report


def test_a_reference_short_of_full_marks_stops_grading_before_any_student(mini,
                                                                           tmp_path, capsys):
    folder, rubric = mini
    wrong = tmp_path / "wrong_reference.py"
    shutil.copy(SUBMISSIONS / "turingalan_LATE_1003_50003_attention-1.py", wrong)
    rubric.write_text(RUBRIC.format(reference=wrong))
    code = main(["grade", str(folder), "--rubric", str(rubric), "--out", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert code == 2 and "the reference solution scores 2 / 3" in err and "scale" in err
    assert not (tmp_path / "out" / "grades.csv").exists()


def test_gradescope_mode_reads_the_submission_and_writes_results_json(mini, tmp_path,
                                                                      capsys):
    _, rubric = mini
    autograder = tmp_path / "autograder"
    (autograder / "submission").mkdir(parents=True)
    shutil.copy(SUBMISSIONS / "lovelaceada_1001_50001_attention.py",
                autograder / "submission" / "attention.py")
    (autograder / "submission_metadata.json").write_text(json.dumps(
        {"id": 5, "users": [{"id": 77, "name": "Ada Lovelace", "email": "ada@example.edu"}]}))
    results = autograder / "results" / "results.json"
    code = main(["grade", "--gradescope", "--rubric", str(rubric), str(autograder / "submission"),
                 "--results", str(results)])
    assert code == 0, capsys.readouterr().err
    payload = json.loads(results.read_text())
    assert payload["score"] == 3 and payload["extra_data"]["id"] == "77"
    assert [t["name"] for t in payload["tests"]] == [
        "MultiHeadAttention: found and loaded", "MultiHeadAttention: gate",
        "MultiHeadAttention: padding", "MultiHeadAttention: scale"]
    assert (results.parent / "feedback.html").is_file()
    assert "77: 3 / 3 (graded)" in capsys.readouterr().out


def test_the_self_test_tells_caught_mutants_from_uncovered_ones(mini):
    _, rubric_path = mini
    rubric = load(rubric_path)
    wanted = {"mutant-scale-missing", "mutant-mask-inverted", "mutant-bool-mask-inverted",
              "mutant-causal-shows-next-token", "mutant-dropout-on-logits",
              "mutant-output-projection-skipped"}
    mutants = [m for m in selftest.bundled_mutants() if m.name in wanted]
    result = selftest.run(rubric, jobs=2, mutants=mutants)
    verdicts = {row.mutant.name: row.verdict for row in result.rows}
    # The causal mutant has no causal target to be graded against.
    # A dropout bug can't occur in a class with no dropout, nor a second mask format's in one
    # that takes one format: no student could make them.
    verdict = selftest.MutantVerdict
    not_run = [(row.mutant.name, row.not_run, row.not_run_why) for row in result.not_run]
    assert not not_run, f"a mutant could not run: {not_run}"
    assert verdicts == {"mutant-scale-missing": verdict.CAUGHT,
                        "mutant-mask-inverted": verdict.CAUGHT,
                        "mutant-output-projection-skipped": verdict.NOT_COVERED,
                        "mutant-bool-mask-inverted": verdict.NOT_APPLICABLE,
                        "mutant-dropout-on-logits": verdict.NOT_APPLICABLE}
    assert result.ok and result.reference_problems == []
    text = selftest.render(result)
    assert "reference solution: 3 / 3 (full marks)" in text
    # A correct solution with other names earns what the reference earns.
    (variant,) = result.variants
    assert variant.description.startswith("the reference with its attributes renamed (")
    assert "q_proj -> layer" in variant.description and variant.problems == []
    assert result.warnings == []
    listed = [line for line in text.splitlines() if "indistinguishable from" in line]
    assert len(listed) == 1 and "mutant-output-projection-skipped" in listed[0]
    assert "2 of them bugs of a feature the assignment's classes do not have" in text
    assert text.endswith("OK: the reference gets full marks and every graded bug costs its points")


def test_the_self_test_names_the_items_no_mutant_lost_points_in(mini):
    """With the mask mutant alone, nothing tests the scale item: said, not implied covered."""
    _, rubric_path = mini
    rubric = load(rubric_path)
    mutants = [m for m in selftest.bundled_mutants() if m.name == "mutant-mask-inverted"]
    result = selftest.run(rubric, jobs=1, mutants=mutants)
    scale = next(item.key for item in rubric.items if "scale" in item.checks)
    assert result.unexercised == [scale]
    assert (f"items no mutant lost points in, so this self-test shows nothing about them: "
            f"{scale}") in selftest.render(result)


def test_a_mutant_keeping_the_points_of_its_check_fails_the_self_test(mini, monkeypatch, capsys):
    _, rubric_path = mini

    def lenient(rubric, target, implementation, limits=None, *, sandbox="filesystem"):
        passed = [CheckResult(target.name, check, "cpu", Status.PASSED) for check in target.checks]
        return SubmissionOutcome(RunStatus.GRADED, "", [TargetOutcome(target.name, RunStatus.GRADED,
                                                                      results=passed)])

    monkeypatch.setattr(selftest, "run_registered", lenient)
    code = main(["grade", "--self-test", "--rubric", str(rubric_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "mutant-scale-missing" in out and "NOT CAUGHT" in out
    assert "FAILED:" in out and "keep the points of the check that should catch them" in out


def test_a_mutant_that_could_not_run_fails_the_self_test_with_its_status(mini, monkeypatch,
                                                                       capsys):
    """Points a mutant lost without running prove nothing: the row says so, with the status."""
    _, rubric_path = mini

    def timed_out(rubric, target, implementation, limits=None, *, sandbox="filesystem"):
        return SubmissionOutcome(RunStatus.TIMEOUT, "it hung",
                                 [TargetOutcome(target.name, RunStatus.TIMEOUT)])

    monkeypatch.setattr(selftest, "run_registered", timed_out)
    mutants = [m for m in selftest.bundled_mutants() if m.name == "mutant-scale-missing"]
    result = selftest.run(load(rubric_path), mutants=mutants)
    (row,) = result.rows
    assert row.verdict is selftest.MutantVerdict.COULD_NOT_RUN and row.not_run == "timeout"
    assert row.not_run_why == "it hung"
    assert result.not_run == [row] and not result.ok
    text = selftest.render(result)
    assert "COULD NOT RUN (timeout)" in text
    assert "mutant-scale-missing as MultiHeadAttention could not run (timeout): it hung" in text
    assert text.endswith("FAILED: 1 mutant(s) could not be run: mutant-scale-missing")


def test_the_progress_line_shows_count_rate_and_time_left_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    progress = GradingProgress(4, screen)
    progress.status("grading the reference solution (attention.py)")
    progress.status("")
    progress.advance("1001: graded 3/3")
    progress.advance("1002: timeout 0/3")
    progress.close()
    text = screen.getvalue()
    assert text.startswith("\rgrading the reference solution (attention.py)\r")
    assert "\r[1/4] " in text and "/min · about " in text and "left · 1002: timeout 0/3" in text
    quiet = io.StringIO()
    GradingProgress(4, quiet).advance("1001")
    assert quiet.getvalue() == ""


def test_the_rubric_of_the_example_class_self_tests_in_the_docs():
    """docs/grading.md shows the example rubric's self-test: the verdicts it states hold."""
    docs = (Path(__file__).parents[1] / "docs" / "grading.md").read_text()
    assert "20 of 20 mutants whose bug the rubric grades lose those points" in docs
    rubric = load(EXAMPLE / "rubric.toml")
    # a mutant is graded against the targets of its causality
    covered = [m for m in selftest.bundled_mutants()
               if any(m.catches in t.checks for t in rubric.targets if t.causal == m.causal)]
    assert len(covered) == 20
