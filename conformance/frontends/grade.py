"""``attention-conformance grade``: the command line of the grading front-end.

::

    attention-conformance grade SUBMISSIONS --rubric RUBRIC.toml [--out DIR] [--jobs N]
                                [--roster CSV] [--only ID,...] [--run-all-cells] [--as-of WHEN]
                                [--shard K/N] [--no-sandbox]
    attention-conformance grade --merge OUT1 OUT2 ... --rubric RUBRIC.toml --out DIR
                                [--roster CSV] [--as-of WHEN]
    attention-conformance grade --self-test --rubric RUBRIC.toml [--jobs N]
    attention-conformance grade --gradescope --rubric RUBRIC.toml [SUBMISSION] [--results PATH]

Exit status: 0 when grading finished (whatever the grades) or the self-test passed; 1 when the
self-test failed; 2 for bad input (a rubric that doesn't parse or names an unknown check, a
missing or empty folder, an unknown --only id, shard outputs that don't make one class), said in
one line. Student code is only run through the sandboxed worker, in a filesystem sandbox
(Landlock or bubblewrap, see ``worker/sandbox.py``); where neither works, every mode stops with
one line saying what to install (exit 2), unless ``--no-sandbox`` is given: then the code runs
in no filesystem sandbox, and the run's first line, ``run.json``, every ``results.json`` and the
class report say so.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

from conformance.frontends.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from conformance.frontends.run_flags import processes
from conformance.grading import gradescope, merge, pipeline, selftest, shards
from conformance.grading.intake.roster import Roster, RosterError
from conformance.grading.intake.roster import load as load_roster
from conformance.grading.progress import GradingProgress
from conformance.grading.report import class_report
from conformance.grading.score.rubric import Rubric, RubricError
from conformance.grading.score.rubric_file import load as load_rubric
from conformance.worker import SandboxUnavailable
from conformance.worker import sandbox as sandboxes


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``grade`` command on the CLI's subparsers."""
    grade = subparsers.add_parser(
        "grade", help="grade a class of submissions against a rubric",
        description="Grade student submissions of an attention layer against a rubric "
                    "(TOML, see docs/grading.md). Outputs in --out: grades.csv, classroom.csv, "
                    "per-student results.json (Gradescope), feedback.md/.html, a class report.")
    grade.add_argument("submissions", nargs="?", type=Path, metavar="SUBMISSIONS",
                       help="the LMS download: a folder (Canvas, Moodle, GitHub Classroom "
                            "layouts, .py/.ipynb/.zip files) or a .zip of one")
    grade.add_argument("--rubric", type=Path, required=True, metavar="RUBRIC.toml")
    grade.add_argument("--out", type=Path, default=Path("grading"), metavar="DIR",
                       help="output folder (default: ./grading); rerunning resumes")
    grade.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                       help="submissions at a time (0: one per CPU core); grades don't depend "
                            "on it")
    grade.add_argument("--roster", type=Path, metavar="CSV",
                       help="ids to names and emails; rostered students without a submission "
                            "get a row")
    grade.add_argument("--only", metavar="ID,...",
                       help="regrade only these students (the others are reused)")
    grade.add_argument("--run-all-cells", action="store_true",
                       help="notebooks: run every code cell, not only imports and definitions")
    grade.add_argument("--as-of", metavar="WHEN",
                       help="the date-time feedback visibility is judged at (ISO 8601; "
                            "default: now)")
    grade.add_argument("--self-test", action="store_true",
                       help="grade the rubric's reference solution and the bundled mutants "
                            "instead of students, and say whether the rubric tells them apart")
    grade.add_argument("--gradescope", action="store_true",
                       help="run as a Gradescope autograder: SUBMISSIONS defaults to "
                            f"{gradescope.SUBMISSION}, results go to --results")
    grade.add_argument("--results", type=Path, default=gradescope.RESULTS, metavar="PATH",
                       help=f"(--gradescope) where results.json goes (default: "
                            f"{gradescope.RESULTS})")
    grade.add_argument("--shard", metavar="K/N",
                       help="grade only shard K of N (1 <= K <= N): the students whose id "
                            "hashes there; combine the N outputs with --merge")
    grade.add_argument("--merge", nargs="+", type=Path, metavar="OUT",
                       help="instead of grading, combine these --shard outputs into --out, "
                            "as one run over the whole class writes it")
    grade.add_argument("--no-sandbox", action="store_true",
                       help="run student code in no filesystem sandbox (grading refuses where "
                            "neither bubblewrap nor Landlock works, unless given this): it can "
                            "then read and write whatever this user can; every output says so")
    return grade


def _jobs(args: argparse.Namespace) -> int:
    """``--jobs``: 0 (or less) one per CPU core."""
    return processes(max(args.jobs, 0), one_in_xdist=False)


def _as_of(text: str | None) -> datetime:
    if not text:
        return datetime.now(timezone.utc)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--as-of {text!r}: give an ISO 8601 date-time, e.g. "
                         "2026-03-02T09:00:00Z") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _error(message: str) -> int:
    print(f"attention-conformance: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    """Run ``grade`` with parsed arguments; the exit status."""
    try:
        rubric = load_rubric(args.rubric)
        if args.shard and (args.self_test or args.gradescope or args.merge):
            raise UsageError("--shard grades part of a class: not with --self-test, "
                             "--gradescope or --merge")
        if args.merge:
            return _merge(rubric, args)
        if args.self_test:
            return _self_test(rubric, args)
        if args.gradescope:
            return _gradescope(rubric, args)
        return _grade(rubric, args)
    except (UsageError, RubricError, RosterError, pipeline.GradingInputError, shards.ShardError,
            merge.MergeError) as error:
        return _error(str(error))


def _sandbox(args: argparse.Namespace) -> sandboxes.Tier:
    """The tier every worker of this run uses, said as the run's first line: a filesystem
    sandbox, else (only with --no-sandbox) none."""
    if args.no_sandbox:
        tier = sandboxes.unsandboxed()
        print(f"sandbox: NONE (--no-sandbox; {tier}): student code is NOT SANDBOXED and can read "
              "and write whatever this user can")
        return tier
    try:
        tier = sandboxes.resolve_kind("filesystem")
    except SandboxUnavailable as error:
        raise UsageError(f"{error}; or pass --no-sandbox to run student code "
                         "without one") from None
    print(f"sandbox: {tier}")
    return tier


def _check_reference(rubric: Rubric, sandbox: sandboxes.Tier, progress: GradingProgress) -> str | None:
    """The reference must get full marks before any student is graded: its score in words, or
    None without a reference."""
    if rubric.reference is None:
        return None
    progress.status(f"grading the reference solution ({rubric.reference.name})")
    graded, _, problems = selftest.grade_reference(rubric, sandbox)
    progress.status("")
    if problems:
        raise UsageError(f"the reference solution scores {graded.total:g} / "
                         f"{graded.max_points:g} under {rubric.path}, not full marks "
                         f"({problems[0]}); fix the rubric or the reference (see --self-test)")
    return f"reference solution: {graded.total:g} / {graded.max_points:g} (full marks)"


def _grade(rubric: Rubric, args: argparse.Namespace) -> int:
    if args.submissions is None:
        raise UsageError("name the SUBMISSIONS folder")
    roster = _roster(args)
    only = {part.strip() for part in args.only.split(",") if part.strip()} if args.only else None
    as_of = _as_of(args.as_of)
    shard = shards.parse(args.shard) if args.shard else None
    # Bad input before any work (and before the run's first line).
    found = pipeline.find_submissions(args.submissions, rubric, args.out)
    pipeline.check_only(found, only)
    sandbox = _sandbox(args)
    progress = GradingProgress(0)
    reference = _check_reference(rubric, sandbox, progress)
    result = pipeline.grade_class(args.submissions, rubric, args.out, jobs=_jobs(args),
                                  only=only, roster=roster, run_all_cells=args.run_all_cells,
                                  progress=progress, as_of=as_of, shard=shard, sandbox=sandbox,
                                  found=found)
    statuses: dict[str, int] = {}
    for student in result.students:
        statuses[student.status.value] = statuses.get(student.status.value, 0) + 1
    if reference:
        print(reference)
    print((f"shard {shard}: " if shard else "")
          + f"graded {len(result.graded)}, reused {len(result.reused)} from an earlier run"
          + (f", left out {len(result.left_out)} (not in --only, never graded)"
             if result.left_out else "") + f"; {len(result.students)} row(s) in "
          f"{args.out / 'grades.csv'}")
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    printed = class_report.printed_output(result.students)
    if printed:
        print(f"printed output (for you only, never in feedback): {len(printed)} submission(s), "
              f"in {args.out / 'printed'}/ID.txt")
    _where_reports(args.out)
    return EXIT_OK


def _roster(args: argparse.Namespace) -> Roster | None:
    """``--roster``'s students, where given."""
    return load_roster(args.roster) if args.roster else None


def _where_reports(out: Path) -> None:
    """Where a run over the whole class (or the merge of its shards) put the class report and
    each student's feedback."""
    print(f"class report: {out / 'class_report.html'}; feedback: "
          f"{out / 'students'}/ID/feedback.html")


def _merge(rubric: Rubric, args: argparse.Namespace) -> int:
    if args.submissions is not None or args.only:
        raise UsageError("--merge combines shard outputs: give no SUBMISSIONS and no --only")
    roster = _roster(args)
    merged = merge.merge(args.merge, rubric, args.out, roster=roster, as_of=_as_of(args.as_of))
    count = merged.outputs[0].shard.count
    print(f"merged {count} shard(s) from {len(args.merge)} folder(s): {merged.submissions} "
          f"submission(s), {len(merged.students)} row(s) in {args.out / 'grades.csv'}")
    _where_reports(args.out)
    return EXIT_OK


def _self_test(rubric: Rubric, args: argparse.Namespace) -> int:
    if rubric.reference is None:
        raise UsageError(f"{rubric.path}: the self-test needs a reference solution: add "
                         "reference = \"path/to/solution.py\" under [assignment]")
    sandbox = _sandbox(args)
    mutants = selftest.bundled_mutants()
    pairs = sum(1 for m in mutants for t in rubric.targets if m.causal == t.causal)
    progress = GradingProgress(pairs)
    try:
        result = selftest.run(rubric, jobs=_jobs(args), mutants=mutants,
                              on_done=progress.advance, sandbox=sandbox)
    finally:
        progress.close()
    print(selftest.render(result))
    return EXIT_OK if result.ok else EXIT_FAILED


def _gradescope(rubric: Rubric, args: argparse.Namespace) -> int:
    folder = args.submissions or gradescope.SUBMISSION
    if not folder.is_dir():
        raise UsageError(f"no submission folder {folder}")
    as_of = _as_of(args.as_of)
    student = gradescope.autograde(rubric, folder, args.results,
                                   run_all_cells=args.run_all_cells, as_of=as_of,
                                   sandbox=_sandbox(args))
    print(f"{student.id}: {student.score.total:g} / {student.score.max_points:g} "
          f"({student.status.value}); wrote {args.results}")
    outcome = student.outcome
    if outcome is not None and outcome.output.strip():
        # The autograder's own output: Gradescope shows it to instructors only
        # (results.json says stdout_visibility "hidden").
        print(f"what the submission printed ({outcome.printed_bytes} bytes; beginning and end):")
        print(outcome.output)
    return EXIT_OK
