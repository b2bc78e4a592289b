"""``attention-conformance``: run the catalogue on implementations and print the verdicts.

Exit status: 0 when every failure is an expected one, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

from conformance._version import VERSION_LINE
from conformance.benchmark.decode import DEFAULT_CONTEXTS
from conformance.benchmark.ladder import DEFAULT_LENGTHS
from conformance.errors import one_line
from conformance.frontends import grade as grading_cli
from conformance.frontends.bench_command import run_bench
from conformance.frontends.command_targets import resolved_targets
from conformance.frontends.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from conformance.frontends.github_annotations import annotations, located, on_github
from conformance.frontends.html_report import render_html
from conformance.frontends.interface_language import error_words
from conformance.frontends.junit_report import render_junit
from conformance.frontends.progress_line import ProgressLine
from conformance.frontends.report import render_json, render_text
from conformance.frontends.run_flags import argparse_form, processes
from conformance.frontends.watch import WatchLines, watch
from conformance.generation.cases import Case
from conformance.generation.profiles import example_database
from conformance.generation.strategies import available_devices
from conformance.loading.registry import ResolveError, check_form, registered
from conformance.model import expectations
from conformance.model.check_names import CHECK_NAMES
from conformance.model.declaration_sources import parse_init
from conformance.model.declaration_specs import SPECS, DeclarationSpec, Form, validate
from conformance.model.declarations import DeclarationError, Declarations
from conformance.model.results import CheckResult, Status, checked_nowhere
from conformance.model.target_spec import TargetSpec
from conformance.run.isolated import BadInput, Interfaces, Isolated, Target
from conformance.run.many import check_many
from conformance.run.options import RunOptions, replay_case
from conformance.worker.local import CALL_SECONDS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attention-conformance",
        description="Property-based conformance checks for attention layers.")
    parser.add_argument("--version", action="version", version=VERSION_LINE)
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check", help="run the catalogue and print the verdicts")
    _add(check, "impl", nargs="*")
    _add(check, "profile", default="quick")
    check.add_argument("--json", type=Path, metavar="PATH",
                       help="also write the results as JSON ('-': to stdout, the report then "
                            "going to stderr)")
    _add(check, "html")
    check.add_argument("--junit-xml", type=Path, metavar="PATH",
                       help="also write JUnit XML (a testcase per check and device), for CI "
                            "test viewers")
    _add(check, "device", type=_device)
    check.add_argument("--check", action="append", dest="checks", choices=CHECK_NAMES,
                       metavar="NAME", help=f"only these checks (repeatable): {', '.join(CHECK_NAMES)}"
                                            " (what each asserts and when it applies: "
                                            "attention-conformance list --checks)")
    check.add_argument("--seed", type=int,
                       help="hypothesis seed: the examples are drawn from it (in either profile)")
    _add(check, "replay")
    check.add_argument("--jobs", "-j", type=int, default=0, metavar="N",
                       help="processes to check in: N implementations at a time, or one "
                            "implementation's checks shared out over N (default 0: one per "
                            "CPU core, one inside a pytest-xdist worker; 1: one after "
                            "another); verdicts don't depend on it")
    _add(check, "isolate")
    _add(check, "call-timeout", default=CALL_SECONDS)
    _add(check, "time-budget")
    check.add_argument("--example-database", action=argparse.BooleanOptionalAction,
                       default=None,
                       help="keep each failing example in .hypothesis/examples and try it first "
                            "next time (default: on a terminal or with --profile thorough, never "
                            "under CI)")
    check.add_argument("--watch", action="store_true",
                       help="check FILE::Class again on every save of FILE, the checks that "
                            "failed last time first (a warm process; Ctrl-C ends it)")
    check.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="the live progress line on a terminal, a line per check elsewhere, "
                            "and a line per implementation (default: on)")
    _add(check, "strict")
    _add(check, "xfails")
    declare = check.add_argument_group(
        "declarations", "override what is inferred for undeclared classes (also in pyproject.toml: "
        "[tool.attention-conformance.declare.\"IMPL\"])")
    for spec in SPECS:
        declare.add_argument(spec.flag, dest=spec.name, help=spec.help, **_argument_form(spec))
    check.add_argument("--debug", action="store_true", help="show tracebacks for bad input")

    listing = commands.add_parser("list", help="list the registered implementations (--checks: "
                                                "the checks)")
    listing.add_argument("--checks", action="store_true",
                         help="the checks instead: each one's name, what it asserts, and when it "
                              "applies")
    commands.add_parser("serve", help="stay warm: each check of this installation started "
                                      "meanwhile runs here, without the cold start (Ctrl-C stops)")
    grading_cli.add_parser(commands)

    bench = commands.add_parser("bench", help="time and memory against sequence length, beside "
                                              "F.scaled_dot_product_attention")
    bench.add_argument("impls", nargs="*", metavar="IMPL",
                       help="as for check (default: every registered implementation meant for "
                            "benchmarking: not the mutants)")
    bench.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)),
                       help="comma-separated sequence lengths (default: %(default)s)")
    bench.add_argument("--budget", type=float, default=30.0, metavar="SECONDS",
                       help="per implementation: longer lengths are skipped past it (default 30)")
    bench.add_argument("--batch", type=int, default=2)
    bench.add_argument("--heads", type=int, default=4)
    bench.add_argument("--head-dim", type=int, default=32)
    bench.add_argument("--dtype", choices=("float32", "float64", "float16", "bfloat16"),
                       default="float32")
    bench.add_argument("--device", default="cpu")
    bench.add_argument("--backward", action="store_true", help="time forward + backward")
    bench.add_argument("--backends", action="store_true",
                       help="also time torch's SDPA backends alone (flash, efficient, cudnn, "
                            "math), each a row beside the implementations")
    bench.add_argument("--decode", action="store_true",
                       help="time the decode step with the KV cache, per token, beside SDPA "
                            "with a cache (implementations that declare a cache)")
    bench.add_argument("--contexts", default=",".join(map(str, DEFAULT_CONTEXTS)),
                       help="--decode: comma-separated tokens cached before the step "
                            "(default: %(default)s)")
    bench.add_argument("--rounds", type=int, default=7, help="timed calls each (default 7)")
    bench.add_argument("--threads", type=int, default=1, metavar="N",
                       help="torch threads for the timed calls (default 1: figures that don't "
                            "depend on what else the machine runs)")
    bench.add_argument("--json", type=Path, metavar="PATH", help="also write the points as JSON")
    bench.add_argument("--plot", type=Path, metavar="FILE.png",
                       help="draw time and memory against length, log-log")
    return parser


def _add(parser: argparse.ArgumentParser, name: str, **own: object) -> None:
    """The run option ``name`` (:data:`~conformance.frontends.run_flags.RUN_FLAGS`), with the
    command line's ``own`` default or value type."""
    flag, form = argparse_form(name)
    parser.add_argument(flag, **{**form, **own})


def _argument_form(spec: DeclarationSpec) -> dict[str, object]:
    """argparse's keywords for how ``spec`` is written on the command line."""
    if spec.form is Form.SWITCH:
        return {"action": "store_const", "const": "true"}
    if spec.choices:
        return {"choices": spec.choices}
    metavar = spec.grammar if " " not in spec.grammar else "SPEC"
    return {"metavar": metavar, **({"action": "append"} if spec.form is Form.REPEATED else {})}


def _unavailable(devices: Sequence[str]) -> list[str]:
    candidates = ["cuda", "mps"] if sys.platform == "darwin" else ["cuda"]
    present = available_devices()
    return [d for d in candidates if d not in present and d not in devices] + [
        d for d in devices if d not in present]


def _check(args: argparse.Namespace) -> int:
    try:
        init = tuple(parse_init(item) for item in args.init) if args.init else None
        # Checked against the table as every other reader checks it: a bad value is one line
        # now, whatever is checked (a registered implementation never reads its declarations).
        declared = validate(Declarations(**{
            **{f.name: getattr(args, f.name) for f in fields(Declarations)},
            "init": init,
            "mask_formats": tuple(args.mask_formats) if args.mask_formats else None,
            "layer": tuple(args.layer) if args.layer else None}))
    except DeclarationError as error:
        raise UsageError(error_words(error, "cli")) from error
    devices = args.devices or available_devices()
    checks = args.checks or list(CHECK_NAMES)
    replay = _replay(args.replay, args.checks)
    if args.watch:
        return _watch(args, declared, devices, checks)
    start = time.perf_counter()
    isolate = args.isolate is not False  # files and modules: isolated unless --no-isolate
    failures, warnings = _expected(args.expected_failures)
    targets: list[Target] = []
    for spec in args.impls or [None]:
        if spec is not None and TargetSpec.parse(spec).located:
            _well_formed(spec)
        if spec is not None and isolate and TargetSpec.parse(spec).located:
            targets.append((spec, Isolated(failures, warnings, args.call_timeout)))
        else:
            targets += resolved_targets([spec] if spec else [], (failures, warnings), declared)
    progress = ProgressLine(live=args.progress, final=args.progress,
                            lines=False if args.progress is False else None, total=len(targets))
    interfaces: Interfaces = {}
    try:
        results = check_many(targets, _run_options(args, devices, checks, replay,
                                                   sys.stdout.isatty()
                                                   or args.profile == "thorough"),
                             declared=declared, progress=progress, interfaces=interfaces)
    except BadInput as error:
        raise UsageError(error_words(error, "cli")) from error
    finally:
        progress.close()
    seconds = time.perf_counter() - start
    shown_devices = [d for d in devices if d in available_devices()] or devices
    json_to_stdout = args.json is not None and str(args.json) == "-"
    reproduce = _reproduction(args.impls)
    print(render_text(results, checks=checks, profile=args.profile, devices=shown_devices,
                      unavailable=_unavailable(devices), seconds=seconds,
                      notes={name: notes for name, (_, notes) in interfaces.items()},
                      reproduce=reproduce),
          file=sys.stderr if json_to_stdout else sys.stdout)
    if args.html:
        args.html.write_text(render_html(results, checks=checks, profile=args.profile,
                                         devices=shown_devices, seconds=seconds,
                                         interfaces=interfaces, reproduce=reproduce),
                             encoding="utf-8")
    if args.junit_xml:
        args.junit_xml.write_text(render_junit(results, seconds=seconds, reproduce=reproduce),
                                  encoding="utf-8")
    if on_github():
        places = {target.origin: located(target) for target in map(TargetSpec.parse, args.impls)
                  if target.located}
        for line in annotations(results, places.get):
            print(line)
    if args.json:
        payload = render_json(results, interfaces=interfaces, profile=args.profile,
                              devices=shown_devices, unavailable=_unavailable(devices),
                              seconds=seconds)
        text = json.dumps(payload, indent=2) + "\n"
        if json_to_stdout:
            sys.stdout.write(text)
        else:
            args.json.write_text(text)
    if any(r.status is Status.SUITE_ERROR for r in results):
        return EXIT_USAGE  # the suite's own error: no verdict, as for bad input (exit 2)
    if any(r.is_failure for r in results):
        return EXIT_FAILED
    # An implementation no device checked anything of has no verdict: never OK (exit 2).
    return EXIT_USAGE if checked_nowhere(results) else EXIT_OK


def _watch(args: argparse.Namespace, declared: Declarations, devices: Sequence[str],
           checks: Sequence[str]) -> int:
    """``check --watch FILE::Class`` (see :mod:`conformance.frontends.watch`)."""
    if len(args.impls) != 1 or ("::" not in args.impls[0] and not args.impls[0].endswith(".py")):
        raise UsageError("--watch takes one FILE::Class (or FILE) to check on every save")
    if args.isolate is False or args.replay or args.json or args.html or args.junit_xml:
        raise UsageError("--watch checks each save in a fresh worker and prints a line per "
                         "save: drop --no-isolate, --replay, --json, --html and --junit-xml")
    (spec,) = args.impls
    _well_formed(spec)
    failures, warnings = _expected(args.expected_failures)
    target = (spec, Isolated(failures, warnings, args.call_timeout))
    options = _run_options(args, devices, checks, None, interactive=True, pictures=False)

    def check_once(order: Sequence[str], lines: WatchLines) -> list[CheckResult]:
        return check_many([target], replace(options, checks=tuple(order)), declared=declared,
                          progress=lines)

    path = Path(TargetSpec.parse(spec).location)
    print(f"watching {path} (Ctrl-C to stop)", flush=True)
    return watch(check_once, [path], checks, sys.stdout)


def _run_options(args: argparse.Namespace, devices: Sequence[str], checks: Sequence[str],
                 replay: Case | None, interactive: bool, pictures: bool | None = None) -> RunOptions:
    """The run ``check`` asks for: its options, the example database kept where the run is
    ``interactive`` (see :func:`_database`), pictures for ``--html``."""
    return RunOptions(profile=args.profile, seed=args.seed, strict=args.strict, replay=replay,
                      time_budget=args.time_budget, database=_database(args, interactive),
                      pictures=args.html is not None if pictures is None else pictures,
                      devices=tuple(devices), checks=tuple(checks),
                      jobs=processes(args.jobs, one_in_xdist=True))


def _device(name: str) -> str:
    """A device the run can name (whether this machine has it is the run's to say)."""
    if re.fullmatch(r"cpu|mps|cuda(:\d+)?", name):
        return name
    raise argparse.ArgumentTypeError(f"unknown device {name!r}: cpu, cuda, cuda:N or mps (repeat "
                                     "--device for several)")


def _well_formed(spec: str) -> None:
    """A FILE::Class or package.module:Attr that can't name anything is one line (exit 2)."""
    try:
        check_form(spec)
    except ResolveError as error:
        raise UsageError(error_words(error, "cli")) from error


def _database(args: argparse.Namespace, interactive: bool):
    """Hypothesis' example database for this run: ``--example-database`` or
    ``--no-example-database`` where given, else kept where the run is ``interactive``."""
    return example_database(interactive if args.example_database is None
                            else args.example_database)


def _replay(text: str | None, checks: Sequence[str] | None) -> Case | None:
    """``--replay``'s case, for exactly one ``--check``."""
    if text is None:
        return None
    if not checks or len(checks) != 1:
        raise UsageError("--replay runs one check on one case: name it with one --check")
    try:
        return replay_case(text)
    except ValueError as error:
        raise UsageError(f"--replay: {error}") from error


def _reproduction(specs: Sequence[str]):
    """How the report says to replay a falsifying example: this command line, for its check."""
    by_name = {target.origin: target.text for target in map(TargetSpec.parse, specs)
               if target.located}

    def command(result: CheckResult) -> str | None:
        spec = by_name.get(result.implementation, result.implementation)
        if spec not in specs and len(specs) == 1:
            spec = specs[0]  # declared in the file under another name
        # A Case's repr quotes its strings with single quotes, and holds no $, ` or ".
        return (f"attention-conformance check {shlex.quote(spec)} --check {result.check} "
                f'--replay "{result.counterexample}"')

    return command


def _expected(path: Path | None) -> tuple[dict, dict]:
    """Expected failures and warnings from ``--expected-failures``."""
    if path is None:
        return {}, {}
    try:
        return expectations.load_all(path)
    except expectations.ExpectationsError as error:
        raise UsageError(error_words(error, "cli")) from error


def _list_checks() -> int:
    """Each check's name, what it asserts and when it applies, in report order."""
    from conformance.checks.catalogue import CATALOGUE, GATE
    from conformance.checks.invariants.base import STRUCTURE_WORDS

    width = max(len(name) for name in CHECK_NAMES) + 2
    for check in (GATE, *CATALOGUE):
        print(f"{check.name.ljust(width)}{check.title}")
        print(f"{'':{width}}applies to: {check.applies}")
        for need in sorted(getattr(check, "requires", ())):  # the gate requires nothing observed
            print(f"{'':{width}}requires: {STRUCTURE_WORDS[need]}")
    print(f"\n{len(CATALOGUE) + 1} checks; each one's property, tolerance and why: docs/checks.md")
    return EXIT_OK


def _list(checks: bool = False) -> int:
    if checks:
        return _list_checks()
    implementations = registered()
    width = max(map(len, implementations), default=0) + 2
    for name, impl in implementations.items():
        print(f"{name.ljust(width)}{impl.description}")
    print(f"\n{len(implementations)} implementations; the checks: attention-conformance list "
          "--checks")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "grade":
        return grading_cli.run(args)
    if args.command == "serve":  # the command's entry starts it (frontends/entry.py)
        print("attention-conformance: error: serve runs as its own command "
              "(attention-conformance serve)", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "bench":
            return run_bench(args)
        return _check(args) if args.command == "check" else _list(args.checks)
    except UsageError as error:
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"attention-conformance: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # the suite's own defect: said as the suite's, never a verdict
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"attention-conformance: internal error (the suite's own, not the code checked): "
              f"{one_line(error, 200)}; please report it (--debug shows where)", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
