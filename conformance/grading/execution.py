"""Running one staged submission: the only module that knows how student code is executed.

:func:`run_submission` finds the rubric's classes by reading the source (nothing runs for
that), then runs every target's checks and returns a :class:`SubmissionOutcome`. Two ways to
run exist, chosen by :class:`Isolation`:

``Isolation.WORKER`` (production; the only one the CLI uses for student code)
    The sandboxed worker, :mod:`conformance.worker`, built separately: one isolated worker
    process per submission. The checker stays in this process and never imports student code;
    it talks to the submission through the worker's :class:`~conformance.adapter.Subject`. The
    contract this module expects from the worker is :class:`WorkerAPI` below. Until that
    package exists, asking for it raises :class:`WorkerUnavailable`, and the CLI refuses to
    grade students (one line, exit 2).

``Isolation.TRUSTED_UNSANDBOXED`` (TEMPORARY; trusted code only)
    For the tests and ``--self-test`` (the instructor's reference and the bundled mutants),
    until the worker lands. Each submission runs in a child process of its own (forked from a
    preloaded fork server), where checker *and* submission live together: the child gets a
    wall-clock limit (killed at the submission limit), a per-check alarm, an address-space
    limit, one CPU thread, its own process group, and its stdout/stderr captured. That keeps one
    submission's crash, hang, memory or global monkey-patching away from the others, but it is
    **not a sandbox**: the code can read and write files, use the network, and, sharing the
    checker's process, could forge its own verdicts. Never use it for student code. The
    integrator replaces it by the worker; nothing outside this module depends on it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import multiprocessing
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from conformance.grading.outcome import (
    RunStatus,
    SubmissionOutcome,
    TargetOutcome,
    overall_status,
    result_from_dict,
)
from conformance.grading.rubric import Limits, Rubric, Target
from conformance.grading.targets import Location, locate, near_misses, scan
from conformance.inference.declarations import Declarations
from conformance.results import CheckResult, Status

OUTPUT_CHARS = 4000
"""How much of a submission's output is kept (head and tail)."""

_MEMORY_MARKERS = ("MemoryError", "can't allocate memory", "not enough memory",
                   "Cannot allocate memory", "out of memory")


class Isolation(str, Enum):
    """How student code is run (see the module docstring)."""

    WORKER = "worker"
    TRUSTED_UNSANDBOXED = "trusted-unsandboxed"


class WorkerUnavailable(Exception):
    """The sandboxed worker is not part of this build; one line for the user."""


# --------------------------------------------------------------------------------------------
# The contract expected from the sandboxed worker (conformance.worker).


class WorkerError(Protocol):
    """What the worker raises (an exception class), and sets as ``Worker.failure``.

    ``status`` is one of the :class:`RunStatus` values ``syntax error``, ``import error``,
    ``not found``, ``interface mismatch``, ``timeout``, ``crashed``, ``out of memory``;
    ``fatal`` is True when the worker process is gone (every later request fails).
    """

    status: str
    fatal: bool


class Worker(Protocol):
    """One worker process, serving one submission directory."""

    protections: Sequence[str]
    """Which protections are active (e.g. "seccomp", "no network", "read-only fs")."""

    output: str
    """What the submission printed so far (stdout and stderr)."""

    failure: Any
    """The WorkerError of the last request, when it broke a limit or the worker died; else
    None. Read after each check: a request that hit its time limit fails inside the check."""

    def load(self, spec: str, *, declarations: Declarations, name: str,
             paths: Sequence[str]) -> Any:
        """Import ``spec`` (``rel/path.py::Class`` or ``pkg.module:Class``, relative to the
        submission directory, with ``paths`` first on ``sys.path``) inside the worker, infer
        what ``declarations`` leaves open, and return a :class:`conformance.adapter.Subject`
        named ``name`` whose calls run in the worker (with ``notes``: the interface in words).
        Raises WorkerError."""

    def defined_names(self, module: str) -> list[str]:
        """The class names the imported module defines (for "did you mean")."""


class WorkerAPI(Protocol):
    """The module :mod:`conformance.worker` as this one uses it."""

    WorkerError: type

    def Limits(self, *, request_seconds: float, submission_seconds: float,
               memory_bytes: int) -> Any:
        """Wall-clock per request and per submission, and memory, for one worker."""

    def open_worker(self, directory: Path, limits: Any) -> contextlib.AbstractContextManager[Worker]:
        """A worker process for the submission in ``directory``; stopped on exit."""


def worker_api() -> WorkerAPI:
    """The sandboxed worker, as :class:`WorkerAPI`; WorkerUnavailable when it is missing or
    offers neither that contract nor the ``IsolatedSubject`` API adapted below."""
    try:
        module = importlib.import_module("conformance.worker")
    except ImportError as error:
        raise WorkerUnavailable(
            "the sandboxed worker (conformance.worker) is not part of this build, and student "
            f"code is only ever run inside it; --self-test, which runs trusted code, works "
            f"without it ({error})") from None
    if hasattr(module, "open_worker"):
        return module  # type: ignore[return-value]
    if all(hasattr(module, name) for name in ("IsolatedSubject", "Limits", "LoadError",
                                              "WorkerError")):
        return IsolatedSubjectAPI(module)
    raise WorkerUnavailable("conformance.worker offers neither open_worker nor IsolatedSubject: "
                            "adapt conformance/grading/execution.py (see WorkerAPI)")


# The worker as built on the ``worker`` branch (read at its commit 379be26): one
# ``IsolatedSubject(submission, spec, declared=, limits=, expected_failures=)`` per target, each
# with its own worker process (restarted after a fatal failure, up to ``max_restarts``);
# ``LoadError`` (status, ``defined_names``, ``output``); ``WorkerError`` is an
# ``ImplementationError`` (a request past its limit fails the check in flight) and fatal ones are
# appended to ``subject.failures``; ``Limits`` has ``request_seconds``, ``load_seconds``,
# ``lifetime_seconds``, ``memory_bytes``. It puts the submission's root on ``sys.path``, not a
# nested file's own folder (``paths`` beyond "." are not passed on).

# Its statuses that have no RunStatus of their own.
_WORKER_STATUSES = {"exited": RunStatus.CRASHED, "cpu limit": RunStatus.TIMEOUT,
                    "output limit": RunStatus.CRASHED, "protocol error": RunStatus.CRASHED,
                    "worker error": RunStatus.GRADER_ERROR, "restart limit": RunStatus.CRASHED}


@dataclass(frozen=True)
class _Failure:
    """A failure as :func:`_run_in_worker` reads it: ``fatal`` means nothing more will run."""

    status: str
    message: str
    fatal: bool

    def __str__(self) -> str:
        return self.message


class _IsolatedWorker:
    """:class:`Worker` over one IsolatedSubject per loaded target."""

    def __init__(self, module: Any, directory: Path, limits: Any) -> None:
        self._module, self._directory, self._limits = module, directory, limits
        self._subjects: list[Any] = []
        self._seen = 0
        self._load_output: list[str] = []
        self._names: list[str] = []

    def load(self, spec: str, *, declarations: Declarations, name: str,
             paths: Sequence[str]) -> Any:
        try:
            subject = self._module.IsolatedSubject(self._directory, spec, declared=declarations,
                                                   limits=self._limits, expected_failures={})
        except self._module.LoadError as error:
            self._names = list(getattr(error, "defined_names", ()))
            self._load_output.append(str(getattr(error, "output", "")))
            # Each target has a worker of its own: one that died loading stops no other target.
            raise self._module.WorkerError(error.status, str(error), fatal=False) from None
        self._subjects.append(subject)
        self._seen = len(subject.failures)
        return subject

    def defined_names(self, module: str) -> list[str]:
        """The names the last target that failed to load defines (asked right after)."""
        return list(self._names)

    @property
    def failure(self) -> _Failure | None:
        """A fatal failure since the last look (the check in flight failed with it); final only
        once the worker won't be restarted."""
        if not self._subjects:
            return None
        failures = self._subjects[-1].failures
        if len(failures) == self._seen:
            return None
        self._seen = len(failures)
        error = failures[-1][1]
        status = str(getattr(error.status, "value", error.status))
        return _Failure(status, str(error), fatal=status == "restart limit")

    @property
    def output(self) -> str:
        return "\n".join(t for t in [*self._load_output, *(s.output for s in self._subjects)] if t)

    @property
    def protections(self) -> list[str]:
        return list(self._subjects[-1].protections) if self._subjects else []

    def close(self) -> None:
        for subject in self._subjects:
            subject.close()


class IsolatedSubjectAPI:
    """:class:`WorkerAPI` over the worker's ``IsolatedSubject`` API (see above)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.WorkerError = module.WorkerError

    def Limits(self, *, request_seconds: float, submission_seconds: float,
               memory_bytes: int) -> Any:
        return self.module.Limits(request_seconds=request_seconds, load_seconds=request_seconds,
                                  lifetime_seconds=submission_seconds, memory_bytes=memory_bytes)

    @contextlib.contextmanager
    def open_worker(self, directory: Path, limits: Any) -> Iterator[_IsolatedWorker]:
        worker = _IsolatedWorker(self.module, directory, limits)
        try:
            yield worker
        finally:
            worker.close()


# --------------------------------------------------------------------------------------------
# Entry points.


def plan(staged_dir: Path, rubric: Rubric,
         syntax_errors: Sequence[str] = ()) -> list[tuple[Target, Location | TargetOutcome]]:
    """Where each target is, read from the source alone (nothing is imported or run)."""
    scans = scan(staged_dir)
    return [(target, locate(target, scans, staged_dir, list(syntax_errors),
                            _other_names(rubric, target)))
            for target in rubric.targets]


def _other_names(rubric: Rubric, target: Target) -> tuple[str, ...]:
    return tuple(name for other in rubric.targets if other is not target for name in other.names)


def run_submission(staged_dir: Path, rubric: Rubric, limits: Limits | None = None, *,
                   isolation: Isolation = Isolation.WORKER,
                   syntax_errors: Sequence[str] = (),
                   api: WorkerAPI | None = None) -> SubmissionOutcome:
    """Run every target's checks on the submission staged in ``staged_dir``.

    ``syntax_errors`` are problems staging found (notebook cells that don't parse): they explain
    a class that is missing. ``isolation`` picks the worker (default) or the temporary trusted
    path (tests and self-test only). ``api`` replaces :mod:`conformance.worker` (tests).
    Raises WorkerUnavailable when the worker is asked for and missing; never raises for
    anything the submission does.
    """
    limits = limits or rubric.limits
    start = time.perf_counter()
    steps = plan(staged_dir, rubric, syntax_errors)
    if all(isinstance(located, TargetOutcome) for _, located in steps):
        targets = [located for _, located in steps]  # nothing to run
        outcome = SubmissionOutcome(overall_status(targets), targets[0].message, targets,
                                    isolation=isolation.value)
    elif isolation is Isolation.WORKER:
        outcome = _run_in_worker(api or worker_api(), staged_dir, rubric, limits, steps)
    else:
        jobs = [_TargetJob.from_plan(target, located, _other_names(rubric, target))
                for target, located in steps]
        outcome = _run_trusted_unsandboxed(staged_dir, rubric, limits, jobs)
    outcome.seconds = time.perf_counter() - start
    return outcome


def run_registered(rubric: Rubric, target: Target, implementation: str,
                   limits: Limits | None = None) -> SubmissionOutcome:
    """TEMPORARY, trusted code only: grade a registered implementation (a bundled mutant) as
    ``target``, with its own declaration (not the target's interface). For ``--self-test``."""
    job = _TargetJob(target=target.name, checks=list(target.checks), registered=implementation)
    return _run_trusted_unsandboxed(None, rubric, limits or rubric.limits, [job])


# --------------------------------------------------------------------------------------------
# Production: the sandboxed worker.


def _status(value: object) -> RunStatus:
    text = str(getattr(value, "value", value))
    try:
        return RunStatus(text)
    except ValueError:
        return _WORKER_STATUSES.get(text, RunStatus.CRASHED)


def _run_in_worker(api: WorkerAPI, staged_dir: Path, rubric: Rubric, limits: Limits,
                   steps: list[tuple[Target, Location | TargetOutcome]]) -> SubmissionOutcome:
    from conformance.catalogue import Runner

    runner = Runner(rubric.profile, rubric.seed)
    worker_limits = api.Limits(request_seconds=limits.check_seconds,
                               submission_seconds=limits.submission_seconds,
                               memory_bytes=limits.memory_mb * 2**20)
    targets: list[TargetOutcome] = []
    with api.open_worker(staged_dir, worker_limits) as worker:
        dead: Any = None
        for target, located in steps:
            if isinstance(located, TargetOutcome):
                targets.append(located)
                continue
            if dead is not None:
                targets.append(TargetOutcome(target.name, _status(dead.status),
                                             f"not run: {dead}", located.class_name,
                                             located.file))
                continue
            try:
                subject = worker.load(located.spec, declarations=target.declarations,
                                      name=target.name, paths=located.paths)
            except api.WorkerError as error:
                status = _status(getattr(error, "status", "crashed"))
                misses: list[str] = []
                if status is RunStatus.NOT_FOUND:
                    with contextlib.suppress(api.WorkerError):
                        misses = near_misses(located.class_name,
                                             worker.defined_names(located.module),
                                             _other_names(rubric, target))
                targets.append(TargetOutcome(target.name, status, str(error), located.class_name,
                                             located.file, misses))
                if getattr(error, "fatal", False):
                    dead = error
                continue
            outcome = TargetOutcome(target.name, RunStatus.GRADED, _found(located),
                                    located.class_name, located.file,
                                    interface=list(getattr(subject, "notes", ())))
            targets.append(outcome)
            for check in target.checks:
                try:
                    result = runner.run_check(subject, check, "cpu")
                except api.WorkerError as error:  # fatal: the worker is gone
                    outcome.status, outcome.message = _status(error.status), str(error)
                    dead = error
                    break
                failure = worker.failure
                if failure is not None:
                    result = replace(result, status=Status.FAILED,
                                     reason=f"{_status(failure.status).value}: {failure}")
                    outcome.status, outcome.message = _status(failure.status), f"{check}: {failure}"
                outcome.results.append(result)
                if failure is not None and getattr(failure, "fatal", False):
                    dead = failure
                    break
        output, protections = str(worker.output), list(worker.protections)
    return SubmissionOutcome(overall_status(targets), _message(targets), targets,
                             _truncate(output), protections, Isolation.WORKER.value)


def _found(located: Location) -> str:
    how = {"class": "", "assignment": " (bound by an assignment)",
           "import": " (bound by an import: is it the student's own class?)"}[located.how]
    return f"{located.class_name} in {located.file}{how}"


def _message(targets: list[TargetOutcome]) -> str:
    for target in targets:
        if target.status is not RunStatus.GRADED:
            return f"{target.target}: {target.message}"
    return ""


def _truncate(text: str, limit: int = OUTPUT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters left out ...]\n{text[-half:]}"


# --------------------------------------------------------------------------------------------
# TEMPORARY: the trusted, unsandboxed path (tests and self-test of trusted code only).


@dataclass
class _TargetJob:
    """One target for the child: where to import it from, or a registered name."""

    target: str
    checks: list[str]
    location: dict | None = None
    declarations: Declarations | None = None
    registered: str | None = None
    others: tuple[str, ...] = ()
    static: dict | None = None
    """A TargetOutcome found without running anything (not found, syntax error)."""

    @classmethod
    def from_plan(cls, target: Target, located: Location | TargetOutcome,
                  others: tuple[str, ...] = ()) -> _TargetJob:
        if isinstance(located, TargetOutcome):
            return cls(target.name, [], static=located.to_dict())
        return cls(target.name, list(target.checks), location={
            "file": located.file, "class_name": located.class_name, "module": located.module,
            "spec": located.spec, "paths": list(located.paths), "found": _found(located)},
            declarations=target.declarations, others=others)


@dataclass
class _Job:
    directory: str | None
    targets: list[_TargetJob]
    profile: str
    seed: int
    check_seconds: float
    submission_seconds: float
    memory_mb: int
    output_path: str


_CONTEXT: Any = None


def _context() -> Any:
    """A fork server preloaded with torch and the suite (a child starts in milliseconds instead
    of re-importing torch), or spawn where there is no fork server. Never plain fork: this
    process may hold threads."""
    global _CONTEXT
    if _CONTEXT is None:
        if "forkserver" in multiprocessing.get_all_start_methods():
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload([__name__, "conformance.catalogue",
                                            "conformance.inference.infer"])
        else:  # pragma: no cover - Windows
            context = multiprocessing.get_context("spawn")
        _CONTEXT = context
    return _CONTEXT


def _run_trusted_unsandboxed(directory: Path | None, rubric: Rubric, limits: Limits,
                             jobs: list[_TargetJob]) -> SubmissionOutcome:
    outcomes: dict[str, TargetOutcome] = {}
    for job in jobs:
        if job.static is not None:
            outcomes[job.target] = TargetOutcome.from_dict(job.static)
    runnable = [job for job in jobs if job.static is None]
    with tempfile.TemporaryDirectory(prefix="attention-grade-") as scratch:
        output_path = Path(scratch) / "output.txt"
        job = _Job(directory=str(directory) if directory else None, targets=runnable,
                   profile=rubric.profile, seed=rubric.seed, check_seconds=limits.check_seconds,
                   submission_seconds=limits.submission_seconds, memory_mb=limits.memory_mb,
                   output_path=str(output_path))
        final: set[str] = set()
        ended = _supervise(job, limits, outcomes, final)
        output = output_path.read_text(errors="replace") if output_path.exists() else ""
    if ended is not None:  # the child died or was killed before finishing
        status, message = ended
        for runnable_job in runnable:
            outcome = outcomes.get(runnable_job.target)
            if outcome is None:
                outcomes[runnable_job.target] = TargetOutcome(
                    runnable_job.target, status, f"not run: {message}",
                    location=(runnable_job.location or {}).get("file"))
            elif runnable_job.target not in final:
                outcome.status, outcome.message = status, message
    targets = [outcomes[job.target] for job in jobs]
    return SubmissionOutcome(overall_status(targets), _message(targets), targets,
                             _truncate(output), ["separate process", "wall-clock limit",
                                                 "per-check alarm", "address-space limit",
                                                 "own process group", "NO SANDBOX"],
                             Isolation.TRUSTED_UNSANDBOXED.value)


def _supervise(job: _Job, limits: Limits, outcomes: dict[str, TargetOutcome],
               final: set[str]) -> tuple[RunStatus, str] | None:
    """Run the child, collecting its messages into ``outcomes`` (``final``: the targets it
    finished); how it ended when it did not finish."""
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child_main, args=(job, sender), daemon=True)
    process.start()
    sender.close()
    deadline = time.monotonic() + limits.submission_seconds
    finished = False
    ended: tuple[RunStatus, str] | None = None
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ended = (RunStatus.TIMEOUT,
                         f"exceeded the submission time limit of {limits.submission_seconds:g} s")
                break
            if not receiver.poll(min(remaining, 1.0)):
                if not process.is_alive() and not receiver.poll(0):
                    break
                continue
            try:
                message = json.loads(receiver.recv_bytes(maxlength=1 << 24))
            except (EOFError, OSError, ValueError):
                break
            if message.get("type") == "done":
                finished = True
                break
            _absorb(message, outcomes, final)
    finally:
        _stop(process, grace=0.0 if ended else 5.0)
        receiver.close()
    if finished:
        return None
    if ended is not None:
        return ended
    code = process.exitcode
    if code is not None and code < 0:
        if -code == signal.SIGKILL:
            return (RunStatus.OUT_OF_MEMORY,
                    "killed by the system (SIGKILL), most likely for using too much memory")
        return (RunStatus.CRASHED, f"the process died of signal "
                                   f"{signal.Signals(-code).name}")
    return (RunStatus.CRASHED, f"the process exited (status {code}) before the checks "
                               "finished: os._exit() or a crash in the submission?")


def _stop(process: Any, grace: float) -> None:
    process.join(grace)
    if process.is_alive() or process.exitcode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            os.killpg(process.pid, signal.SIGKILL)  # and whatever it started
        process.kill()
        process.join(5.0)


def _absorb(message: dict, outcomes: dict[str, TargetOutcome], final: set[str]) -> None:
    kind, name = message.get("type"), str(message.get("target"))
    if kind == "target":
        outcome = TargetOutcome.from_dict(message["outcome"])
        outcomes[name] = outcome
        if outcome.status is not RunStatus.GRADED:
            final.add(name)
    elif kind == "result" and name in outcomes:
        outcomes[name].results.append(result_from_dict(message["result"]))
    elif kind == "target-end" and name in outcomes:
        if message["status"] != RunStatus.GRADED.value or name not in final:
            outcomes[name].status = RunStatus(message["status"])
            outcomes[name].message = message.get("message", "") or outcomes[name].message
        final.add(name)


class _CheckTimeout(BaseException):
    """Raised by the alarm: a BaseException, so neither hypothesis nor the checks' own
    ``except Exception`` take it for a failure of the property."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _CheckTimeout


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    signal.signal(signal.SIGALRM, _on_alarm)  # again each time: the submission may have changed it
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _child_main(job: _Job, sender: Any) -> None:
    """The child: set limits, then import, infer and check each target, reporting as it goes."""
    os.setpgrp()
    sys.stdout.flush()
    sys.stderr.flush()
    capture = os.open(job.output_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(capture, 1)
    os.dup2(capture, 2)
    _limit_resources(job)

    import torch

    torch.set_num_threads(1)  # the same numerics whatever --jobs is
    torch.default_generator.manual_seed(job.seed)
    import random

    random.seed(job.seed)

    def send(message: dict) -> None:
        sender.send_bytes(json.dumps(message, default=str).encode())

    if job.directory:
        os.chdir(job.directory)
    for target_job in job.targets:
        try:
            _child_target(job, target_job, send)
        except _CheckTimeout:  # raised between checks: the alarm fired late
            send({"type": "target-end", "target": target_job.target,
                  "status": RunStatus.TIMEOUT.value,
                  "message": f"exceeded the per-check limit of {job.check_seconds:g} s"})
        except BaseException as error:  # whatever else the submission threw our way
            send({"type": "target-end", "target": target_job.target,
                  "status": RunStatus.CRASHED.value,
                  "message": f"the run stopped: {_one_line(error)}"})
    send({"type": "done"})
    sender.close()
    sys.stdout.flush()
    sys.stderr.flush()


def _limit_resources(job: _Job) -> None:
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    with contextlib.suppress(OSError, ValueError):
        # The address space already mapped (torch is large) plus the allowance.
        pages = int(Path("/proc/self/statm").read_text().split()[0])
        mapped = pages * os.sysconf("SC_PAGE_SIZE")
        limit = mapped + job.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    with contextlib.suppress(OSError, ValueError):
        # A backstop should the supervisor itself die: CPU time, not wall-clock.
        seconds = int(job.submission_seconds * 2) + 10
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))


def _where(error: BaseException, directory: str | None) -> str:
    """The last traceback frame inside the submission, as ``file.py:line``."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    for frame in reversed(frames):
        if directory and frame.filename.startswith(directory):
            return f" ({os.path.relpath(frame.filename, directory)}:{frame.lineno})"
    return ""


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _import_target(location: dict, directory: str) -> Any:
    root = Path(directory)
    for path in reversed(location["paths"]):
        sys.path.insert(0, str((root / path).resolve()))
    spec = location["spec"]
    if "::" not in spec:
        return importlib.import_module(spec.partition(":")[0])
    file = (root / location["file"]).resolve()
    stem = file.stem
    if stem.isidentifier() and stem not in sys.modules:
        found = importlib.util.find_spec(stem)
        if found is not None and found.origin and Path(found.origin).resolve() == file:
            return importlib.import_module(stem)  # its plain name: siblings may import it so
    # A name taken (a file called torch.py, say): load it from its path under a private name.
    name = "_submission_" + re.sub(r"\W", "_", location["file"].removesuffix(".py"))
    module_spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _load(job: _Job, target_job: _TargetJob) -> tuple[Any, TargetOutcome]:
    """The Subject for a target, and its outcome so far (status GRADED when it loaded)."""
    from conformance.adapter import ImplementationError, InProcessSubject
    from conformance.inference import InferenceError, infer
    from conformance.inference.declarations import DeclarationError
    from conformance.registry import ResolveError, resolve

    name = target_job.target
    if target_job.registered is not None:
        try:
            (implementation,) = resolve(target_job.registered)
        except ResolveError as error:
            return None, TargetOutcome(name, RunStatus.INTERFACE_MISMATCH, str(error))
        implementation = replace(implementation, name=name, expected_failures={})
        return InProcessSubject(implementation), TargetOutcome(
            name, RunStatus.GRADED, f"registered implementation {target_job.registered}",
            target_job.registered, interface=[implementation.capabilities.describe()])

    location = target_job.location or {}
    outcome = TargetOutcome(name, RunStatus.GRADED, location["found"], location["class_name"],
                            location["file"])

    def fail(status: RunStatus, message: str) -> tuple[None, TargetOutcome]:
        outcome.status, outcome.message = status, message
        return None, outcome

    try:
        with _alarm(job.check_seconds):
            module = _import_target(location, job.directory or ".")
    except _CheckTimeout:
        return fail(RunStatus.TIMEOUT, f"importing {location['file']} took longer than "
                                       f"{job.check_seconds:g} s")
    except SyntaxError as error:
        where = os.path.relpath(error.filename, job.directory) if error.filename and \
            job.directory else location["file"]
        return fail(RunStatus.SYNTAX_ERROR, f"syntax error in {where}, line {error.lineno}: "
                                            f"{error.msg}")
    except MemoryError:
        return fail(RunStatus.OUT_OF_MEMORY, f"importing {location['file']} ran out of memory")
    except SystemExit as error:
        return fail(RunStatus.IMPORT_ERROR, f"importing {location['file']} called "
                                            f"sys.exit({error.code!r})")
    except BaseException as error:  # anything a module can raise at import
        return fail(RunStatus.IMPORT_ERROR, f"importing {location['file']} raised "
                                            f"{_one_line(error)}{_where(error, job.directory)}")
    cls = getattr(module, location["class_name"], None)
    if cls is None:
        classes = [k for k, v in vars(module).items() if isinstance(v, type)]
        outcome.near_misses = near_misses(location["class_name"], classes, target_job.others)
        return fail(RunStatus.NOT_FOUND, f"{location['file']} defines no "
                                         f"{location['class_name']} when imported")
    import torch

    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return fail(RunStatus.INTERFACE_MISMATCH,
                    f"{location['class_name']} is a {type(cls).__name__}, not an nn.Module class")
    try:
        with _alarm(job.check_seconds):
            inferred = infer(cls, name=name, declared=target_job.declarations)
    except _CheckTimeout:
        return fail(RunStatus.TIMEOUT, f"working out its interface took longer than "
                                       f"{job.check_seconds:g} s")
    except (InferenceError, DeclarationError, ImplementationError) as error:
        return fail(RunStatus.INTERFACE_MISMATCH, str(error))
    except (SystemExit, KeyboardInterrupt) as error:
        return fail(RunStatus.CRASHED, f"working out its interface, the submission raised "
                                       f"{type(error).__name__}({getattr(error, 'code', '')!r})")
    except MemoryError:
        return fail(RunStatus.OUT_OF_MEMORY, "working out its interface ran out of memory")
    except Exception as error:
        return fail(RunStatus.INTERFACE_MISMATCH, f"working out its interface raised "
                                                  f"{_one_line(error)}{_where(error, job.directory)}")
    outcome.interface = list(inferred.notes)
    return InProcessSubject(inferred.implementation), outcome


def _child_target(job: _Job, target_job: _TargetJob, send: Any) -> None:
    from conformance.catalogue import Runner

    subject, outcome = _load(job, target_job)
    send({"type": "target", "target": target_job.target, "outcome": outcome.to_dict()})
    if subject is None:
        return
    runner = Runner(job.profile, job.seed)
    status, message = RunStatus.GRADED, ""
    for check in target_job.checks:
        try:
            with _alarm(job.check_seconds):
                result = runner.run_check(subject, check, "cpu")
        except _CheckTimeout:
            result = CheckResult(target_job.target, check, "cpu", Status.FAILED,
                                 reason=f"timed out: longer than the per-check limit of "
                                        f"{job.check_seconds:g} s")
            status, message = RunStatus.TIMEOUT, f"{check} exceeded the per-check limit of " \
                                                 f"{job.check_seconds:g} s"
        except MemoryError:
            result = CheckResult(target_job.target, check, "cpu", Status.FAILED,
                                 reason="ran out of memory")
            status, message = RunStatus.OUT_OF_MEMORY, f"{check} ran out of memory"
        except (SystemExit, KeyboardInterrupt) as error:
            result = CheckResult(target_job.target, check, "cpu", Status.FAILED,
                                 reason=f"the implementation raised {type(error).__name__}"
                                        f"({getattr(error, 'code', '')!r})")
            status, message = RunStatus.CRASHED, f"{check}: the submission raised " \
                                                 f"{type(error).__name__}"
        if (result.status is Status.FAILED and status is RunStatus.GRADED
                and any(marker in result.reason for marker in _MEMORY_MARKERS)):
            status, message = RunStatus.OUT_OF_MEMORY, f"{check}: {result.reason}"
        send({"type": "result", "target": target_job.target, "result": result.to_dict()})
        if check == "gate" and status is RunStatus.TIMEOUT:
            break  # every other check starts with the gate: they would all time out
    send({"type": "target-end", "target": target_job.target, "status": status.value,
          "message": message})
