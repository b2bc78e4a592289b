"""Implementations checked in worker processes of their own: loaded there, never imported here.

An :class:`Isolated` target names what an IMPL string is expected to fail; a load the worker
reports as bad input (a syntax or import error, nothing found, an interface that can't be
inferred) is :class:`BadInput`, one line for the user; one that hangs or crashes while it is
loaded fails the gate with the worker's evidence (:func:`not_loaded`), and a load that ran out
of time says that the time covers the suite's own probing too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conformance.checks.catalogue import GATE
from conformance.errors import ConformanceError
from conformance.generation.base_case import base_case
from conformance.generation.constraints import discover
from conformance.generation.strategies import available_devices, device_kind
from conformance.model.check_names import CHECK_NAMES
from conformance.model.declarations import Declarations
from conformance.model.remedies import Note, Remedy, remedy_of
from conformance.model.results import CheckResult, Status
from conformance.model.spec import Config, Implementation
from conformance.model.status import is_load_problem
from conformance.model.target_spec import TargetSpec
from conformance.run import shared
from conformance.run.runner import BLOCKED, Runner
from conformance.subject.boundary import ImplementationError, Subject

if TYPE_CHECKING:  # the worker's side is imported where a run isolates something
    from conformance.worker.errors import LoadError


@dataclass(frozen=True)
class Isolated:
    """Every implementation an IMPL string names, to check in worker processes of their own
    (``check --isolate``), never imported here: what each is expected to fail or warn, by name
    (from an expected-failures file; their own declarations add theirs), and the time limit of
    one call (see :class:`conformance.worker.local.CallLimits`)."""

    expected_failures: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    expected_warnings: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    call_seconds: float = 10.0


Target = tuple[str, "Implementation | Isolated"]
"""An IMPL string, and what it resolves to: an Implementation (checked in this process), or
Isolated (its implementations checked in worker processes)."""

Interfaces = dict[str, tuple[str, tuple[Note, ...]]]
"""``{implementation: (what it declares, what was inferred)}``, for reports."""


class BadInput(ConformanceError):
    """An isolated implementation is not checkable (a syntax or import error, not found, an
    interface that can't be inferred): one line for the user, as in-process resolution gives,
    and what to declare where a declaration settles it."""

    def __init__(self, message: str, remedy: Remedy | None = None) -> None:
        super().__init__(message)
        self.remedy = remedy


def not_loaded(name: str, error: BaseException, devices: Sequence[str] | None,
               checks: Sequence[str] | None) -> list[CheckResult]:
    """The verdicts of an implementation the isolated worker could not load (a constructor that
    hangs, a crash while its interface is inferred): the gate fails with the worker's evidence,
    the rest is blocked. A load that ran out of time says what that time covers: a constructor
    that hangs and a slow probe look alike from outside the worker."""
    status = getattr(error, "status", None)
    reason = f"{getattr(status, 'value', status)}: loading it in the isolated worker: {error}"
    if getattr(status, "value", status) == "timeout":
        reason += (" (loading it is importing it and inferring its interface by probing it: if "
                   "it is only slow, give the worker more time per call)")
    return [CheckResult(name, check, device,
                        Status.FAILED if check == GATE.name else Status.SKIPPED,
                        reason=reason if check == GATE.name else BLOCKED,
                        remedy=remedy_of(error) if check == GATE.name else None)
            for device in (devices or available_devices())
            for check in (list(checks) if checks is not None else list(CHECK_NAMES))]


def _not_loaded(spec: str, name: str, error: LoadError, devices: Sequence[str] | None,
                checks: Sequence[str] | None, interfaces: Interfaces) -> list[CheckResult]:
    """The verdicts of ``name``, one of what ``spec`` names, that its worker did not load; a load
    problem (not found, not inferred) is the input's, said in one line (BadInput)."""

    if is_load_problem(error.status):
        said = str(error)  # where the worker's words name it already, it is not said twice
        named = said.startswith((f"{spec}:", f"{TargetSpec.parse(spec).origin}:"))
        raise BadInput(said if named else f"{spec}: {said}", error.remedy) from None
    interfaces[name] = ("not loaded", ())
    return not_loaded(name, error, devices, checks)


WORKER_DEVICES = ("cpu", "cuda")
"""Devices an isolated worker computes on: a CUDA one where the run asks for it, admitted by its
sandbox (``worker/gpu.py``: the device files, a data limit in place of the address-space one)."""

WORKER_DEVICE_SKIP = ("the isolated worker can't use {device} (only cpu and cuda): check your "
                      "own code on {device} in process (not isolated)")


def preflight(subject: Subject) -> None:
    """BadInput when the constructor raises for every generated configuration: said once, in
    a line, instead of every check failing (one that rejects some is the gate's to narrow
    down)."""
    caps = subject.capabilities
    case = base_case(caps, caps.floats.supported[0], "cpu")
    try:
        subject.instantiate(case.config, case.seed).settle()
    except ImplementationError as error:
        def builds(heads: int, head_dim: int) -> bool:
            config = Config(batch=2, q_len=5, kv_len=5, d_model=heads * head_dim,
                            num_heads=heads, dtype=caps.floats.supported[0])
            try:
                subject.instantiate(config, 0).settle()
            except ImplementationError:
                return False
            return True

        try:
            discover(builds, heads=caps.heads)
        except ValueError:
            raise BadInput(f"{subject.name}: {error}") from error


def isolated_results(runner: Runner, spec: str, what: Isolated,
                     declared: Declarations | None, devices: Sequence[str] | None,
                     checks: Sequence[str] | None,
                     interfaces: Interfaces) -> list[CheckResult]:
    """Every verdict of the implementations ``spec`` names, each in a worker of its own; what each
    declares goes into ``interfaces``."""
    # Deferred: a run that isolates nothing never loads the worker's checker side.
    from conformance.worker.errors import LoadError, WorkerStartError
    from conformance.worker.local import open_all

    twins = shared.wanted(runner.processes, list(checks) if checks is not None
                          else list(CHECK_NAMES))
    wanted = list(devices or available_devices())
    # An absent device is the runner's to skip; a present accelerator the worker can't reach.
    usable = [d for d in wanted if device_kind(d) in WORKER_DEVICES or d not in available_devices()]
    gpu = any(device_kind(d) == "cuda" and d in available_devices() for d in usable)
    try:
        subjects = open_all(spec, declared, call_seconds=what.call_seconds, twins=twins,
                            accelerators=gpu)
    except WorkerStartError as error:
        raise BadInput(f"{spec}: {error}") from None
    except LoadError as error:
        return _not_loaded(spec, TargetSpec.parse(spec).origin, error, devices, checks, interfaces)
    names = list(checks) if checks is not None else list(CHECK_NAMES)
    results: list[CheckResult] = []
    try:
        for subject in subjects:
            try:
                subject.loaded()  # a model's other kind: loaded in its worker while one was checked
            except LoadError as error:
                results += _not_loaded(spec, subject.name, error, devices, checks, interfaces)
                continue
            preflight(subject)
            subject.expected_failures = {**subject.expected_failures,
                                         **what.expected_failures.get(subject.name, {})}
            subject.expected_warnings = {**subject.expected_warnings,
                                         **what.expected_warnings.get(subject.name, {})}
            interfaces[subject.name] = (subject.describe(), tuple(subject.notes))
            if usable:
                results += runner.run(subject, devices=usable, checks=checks, closed_after=True)
            results += [CheckResult(subject.name, name, device, Status.SKIPPED,
                                    reason=WORKER_DEVICE_SKIP.format(device=device))
                        for device in wanted if device not in usable for name in names]
    finally:
        for subject in subjects:
            subject.close()
    return results
