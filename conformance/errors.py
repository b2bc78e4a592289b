"""The root of the suite's exceptions, and the one list of them: every error it raises for a user is
a :class:`ConformanceError`.

Each layer defines its own errors where they arise (a declaration that can't be read, an IMPL that
names nothing, a rubric, a worker that crashed, ...), all subclasses of this one, so a program that
drives the suite can catch them in one clause. Their message is one line for the user. Where an
error also is a standard one (a bad value is a ``ValueError``), it subclasses both. Each class
stays beside the code that raises it; this module only lists them.

Every one of them, where it lives (under ``conformance.``) and when it is raised; a subclass is
said after its base (``tests/test_errors.py`` keeps the table and the package the same):

===================  ===========================  =======================================================
Error                Module (conformance.)        Raised when
===================  ===========================  =======================================================
ConformanceError     errors                       the root: every error the suite raises for a user
SuiteError           errors                       the suite itself failed in a check (its own defect)
WeightLayoutError    model.weights                parameters don't match the declared weight layout
ExpectationsError    model.expectations           an expected-failures file can't be used
DeclarationError     model.declarations           a declaration can't be read
ImplementationError  subject.boundary             the implementation raised, or returned no tensor
CapabilityError      subject.boundary             a check asked for something undeclared (a suite bug)
MaskEncodingError    subject.masks                a mask the convention can't express (a ValueError)
CacheProtocolError   subject.cache_session        a cache handed back not as its declared style says
Violation            checks.invariants.violation  a check's property does not hold (an AssertionError)
NotApplicable        checks.invariants.violation  a check can't judge this implementation: skipped
CheckFailed          checks.invariants.violation  a check failed: its violation and minimal case
InferenceError       inference.plan               an interface can't be inferred; says what to declare
ResolveError         loading.resolve_errors       an IMPL argument names nothing checkable
MissingPackage       loading.resolve_errors       the code imports a package not installed (ResolveError)
CodecError           worker.codec                 a value on the wire does not fit its type (ValueError)
WorkerError          worker.errors                a call to an isolated implementation failed
LoadError            worker.errors                the worker could not load the submission (WorkerError)
WorkerStartError     worker.errors                the worker could not start (the machine's problem)
ProtocolError        worker.errors                a malformed frame or message, from the worker or to it
SandboxUnavailable   worker.sandbox               the requested sandbox does not work on this machine
BadInput             run.isolated                 an isolated implementation is not checkable
UsageError           frontends.exit_codes         bad input to any command (exit status EXIT_USAGE)
GradingInputError    grading.pipeline             input that can't be graded (a folder, an --only id)
ShardError           grading.shards               a --shard that can't be read (a ValueError)
MergeError           grading.merge                shard outputs that can't be combined
RosterError          grading.intake.roster        a roster that can't be read
ArchiveError         grading.intake.archives      a student's archive that can't be used
NotebookError        grading.intake.notebooks     a notebook that can't be read
RubricError          grading.score.rubric         a rubric that can't be used
===================  ===========================  =======================================================
"""

from __future__ import annotations


class ConformanceError(Exception):
    """An error of the suite's, for a user: what went wrong, in one line."""


class SuiteError(ConformanceError):
    """The suite itself failed while checking (its own defect, not the implementation's): no
    verdict where it happened. Raised where a front end must not report it as a failure of the
    implementation (pytest); please report it."""


def clipped(text: str, limit: int) -> str:
    """``text``'s first line, cut at a word (with an ellipsis) where longer than ``limit``: no
    message is cut mid-word."""
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    if len(line) <= limit:
        return line
    cut = line[:limit].rsplit(" ", 1)[0] if " " in line[:limit] else line[:limit]
    return cut.rstrip(" ,;:") + "…"


def one_line(error: BaseException, limit: int | None = None) -> str:
    """``Type: first line`` of ``error`` (its message clipped to ``limit``, see :func:`clipped`)."""
    text = str(error)
    line = clipped(text, limit) if limit is not None else (text.strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {line}".rstrip(": ")


def raised_by_its_code(error: BaseException) -> str | None:
    """Where ``error`` was raised in code the suite called (``file:line`` of the deepest frame
    outside the suite, torch and the standard library, below the suite's last frame), or None
    where it is the suite's own (raised in the suite, or in torch called by the suite itself)."""
    import os
    import sysconfig
    import traceback

    here = os.path.dirname(os.path.abspath(__file__))
    library = {os.path.abspath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}
    frames = traceback.extract_tb(error.__traceback__)
    last_ours = max((i for i, f in enumerate(frames) if os.path.abspath(f.filename).startswith(
        here + os.sep)), default=-1)

    def its_own(filename: str) -> bool:
        path = os.path.abspath(filename)
        return not (path.startswith(here + os.sep) or f"{os.sep}torch{os.sep}" in path
                    or any(path.startswith(lib + os.sep) for lib in library))

    theirs = [f for f in frames[last_ours + 1:] if its_own(f.filename)]
    return f"{os.path.basename(theirs[-1].filename)}:{theirs[-1].lineno}" if theirs else None
