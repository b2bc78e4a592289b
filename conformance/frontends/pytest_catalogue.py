"""The catalogue's pytest hooks and fixtures, loaded by :mod:`conformance.frontends.pytest_plugin` only
for a run that is about the catalogue (``--attention-impl``, or the catalogue's own test modules
named): one test per check, parametrized over implementations and devices; verdicts from the same
:class:`~conformance.run.runner.Runner` the CLI uses.
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from conformance.errors import SuiteError
from conformance.frontends import pytest_html
from conformance.frontends.interface_language import Interface, error_words
from conformance.frontends.pytest_options import (
    BENCHMARK_MODULE,
    CATALOGUE_MODULE,
    names_catalogue,
    pasteable_id,
    run_options,
)
from conformance.frontends.report import Reproduction, failure_block, inferred
from conformance.generation.cases import Case
from conformance.generation.strategies import available_devices, fixed_features
from conformance.loading.registry import ResolveError, registered, resolve
from conformance.model import expectations
from conformance.model.declaration_sources import from_mapping
from conformance.model.declarations import DeclarationError, Declarations
from conformance.model.results import CheckResult, Status
from conformance.model.target_spec import TargetSpec
from conformance.run.runner import Runner
from conformance.subject.boundary import Subject
from conformance.subject.in_process import InProcessSubject

_SUBJECTS = pytest.StashKey[list[Subject]]()
_SPECS = pytest.StashKey[dict[str, str]]()
_RUNNER = pytest.StashKey[Runner]()


def _devices(config: pytest.Config) -> list[str]:
    chosen = config.getoption("attention_device")
    if chosen:
        return list(chosen)
    return ["cpu", "cuda", "mps"] if sys.platform == "darwin" else ["cpu", "cuda"]


def _subjects(config: pytest.Config) -> list[Subject]:
    if _SUBJECTS not in config.stash:
        specs = config.getoption("attention_impl")
        isolate = config.getoption("attention_isolate")
        try:
            declared = _declared(config.getoption("attention_declare"))
            xfails = config.getoption("attention_xfails")
            expected = expectations.load_all(xfails) if xfails else ({}, {})
            subjects: list[Subject] = []
            specs_of: dict[str, str] = {}
            for spec in specs or [None]:
                if spec is not None and isolate and TargetSpec.parse(spec).located:
                    found: list[Subject] = _isolated(config, spec, expected, declared)
                else:
                    implementations = resolve(spec, declared) if spec else list(
                        registered().values())
                    found = [InProcessSubject(impl) for impl in
                             expectations.apply(implementations, *expected)]
                subjects += found
                specs_of.update({subject.name: spec or subject.name for subject in found})
        except (ResolveError, expectations.ExpectationsError, DeclarationError) as error:
            raise pytest.UsageError(
                f"attention-conformance: {error_words(error, 'pytest')}") from error
        config.stash[_SUBJECTS] = subjects
        config.stash[_SPECS] = specs_of
    return config.stash[_SUBJECTS]


def _declared(items: list[str]) -> Declarations | None:
    """``--attention-declare NAME=VALUE`` options as Declarations (None when there are none)."""
    if not items:
        return None
    values: dict[str, object] = {}
    for item in items:
        name, equals, value = item.partition("=")
        if not equals:
            raise DeclarationError(f"--attention-declare {item!r}: use NAME=VALUE, e.g. "
                                   "kv-grouping=tiled")
        key = name.strip().replace("-", "_")
        if key in ("init", "mask_formats"):
            values.setdefault(key, []).append(value)  # type: ignore[union-attr]
        else:
            values[key] = value
    return from_mapping(values, "--attention-declare")


def _isolated(config: pytest.Config, spec: str, expected: tuple[dict, dict],
              declared: Declarations | None = None) -> list[Subject]:
    """``spec``'s implementations in worker processes of their own, closed with the session; one
    that can't be loaded is a usage error (it hangs or crashes while loading: the message says)."""
    from conformance.worker import LoadError, WorkerStartError
    from conformance.worker.local import CALL_SECONDS, open_all

    seconds = config.getoption("attention_call_timeout") or CALL_SECONDS
    try:
        subjects = open_all(spec, declared, call_seconds=seconds)
        for subject in subjects:
            config.add_cleanup(subject.close)
        for subject in subjects:
            subject.loaded()  # a model's other kinds: each loaded in its worker, in parallel
    except (LoadError, WorkerStartError) as error:
        raise pytest.UsageError(
            f"attention-conformance: {spec}: {error_words(error, 'pytest')}") from error
    failures, warnings = expected
    for subject in subjects:
        subject.expected_failures = {**subject.expected_failures,
                                     **failures.get(subject.name, {})}
        subject.expected_warnings = {**subject.expected_warnings,
                                     **warnings.get(subject.name, {})}
    return subjects


def runner(config: pytest.Config) -> Runner:
    """A Runner for this session's options (profile, seed, verbosity, strictness, a replayed
    case); a bad ``--attention-replay`` or profile is a usage error."""
    try:
        return Runner.of(run_options(config))
    except ValueError as error:
        raise pytest.UsageError(f"attention-conformance: {error}") from error


def reproduction(extra: Callable[[CheckResult], str] | None = None):
    """How a failure under pytest says to replay its falsifying example: the test's own id (as
    pytest runs it now), any ``extra`` options, and ``--attention-replay``."""
    def command(result: CheckResult) -> str | None:
        current = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        if not current:
            return None
        options = f" {extra(result)}" if extra is not None else ""
        return (f"pytest {shlex.quote(current)}{options} "
                f'--attention-replay "{result.counterexample}"')

    return command


def configure(config: pytest.Config) -> None:
    """Set the run up (called once, by the light plugin, when this module is registered)."""
    config.stash[_RUNNER] = runner(config)
    # `pytest --attention-impl IMPL` from any repository: collect the catalogue too, unless the
    # command line already names it (`--pyargs conformance`).
    if config.getoption("attention_impl") and not names_catalogue(config):
        config.args.append(str(CATALOGUE_MODULE))
        if config.getoption("attention_bench"):
            config.args.append(str(BENCHMARK_MODULE))


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    present = available_devices()
    devices = ", ".join(d if d in present else f"{d} (not available: skipped)"
                        for d in _devices(config))
    names = ", ".join(s.name for s in _subjects(config))
    search = config.stash[_RUNNER]
    seed = f"; seed {search.seed}" if search.seed is not None else ""
    replay = f"; replaying {search.replay!r}" if search.replay is not None else ""
    # What inference settled (a bundled registration says nothing): as check prints it, in
    # pytest's words.
    notes = {s.name: getattr(s, "notes", ()) for s in _subjects(config)}
    return [f"attention-conformance: profile {search.profile}{seed}{replay}; devices {devices}",
            f"attention-conformance: implementations under test: {names}",
            *inferred(notes, interface="pytest")]


def catalogue_reproduction(config: pytest.Config):
    """The catalogue's replay line: its test id needs the implementation named again."""
    specs = config.stash.get(_SPECS, {})
    return reproduction(lambda result: "--attention-impl "
                        + shlex.quote(specs.get(result.implementation, result.implementation)))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "attention_bench_case" in metafunc.fixturenames:
        metafunc.parametrize("attention_bench_case", _bench_params(metafunc.config))
        return
    if "attention_target" not in metafunc.fixturenames:
        return
    params = [
        pytest.param((subject, device), id=pasteable_id(subject.name) if device == "cpu"
                     else f"{pasteable_id(subject.name)}-{device}")
        for subject in _subjects(metafunc.config)
        for device in _devices(metafunc.config)
    ]
    metafunc.parametrize("attention_target", params)


@dataclass(frozen=True)
class BenchCase:
    """One implementation at one length, dtype and device, for the benchmark fixtures."""

    subject: Subject
    length: int
    dtype: str
    device: str

    def group(self, mode: str) -> str:
        """The pytest-benchmark group: the implementation beside SDPA at the same work."""
        return f"{mode} L={self.length} {self.dtype} {self.device}"

    def prepare(self):
        if self.device not in available_devices():
            pytest.skip(f"{self.device} is not available on this machine")
        caps = self.subject.capabilities
        heads = caps.heads or 4
        case = Case(batch=2, q_len=self.length, kv_len=self.length, num_heads=heads,
                    head_dim=128 // heads, dtype=self.dtype, device=self.device, seed=0,
                    causal=caps.causality.kind == "always", **fixed_features(caps))
        if caps.max_len is not None and self.length > caps.max_len:
            pytest.skip(f"beyond its max_len {caps.max_len}")
        instance = self.subject.instantiate(case.config, case.seed)
        instance.settle()  # built before the timing starts
        cotangent = torch.ones(2, self.length, case.d_model, dtype=case.config.dtype,
                               device=self.device)
        return instance, case.inputs(caps.call, use_mask=False), cotangent


def _bench_params(config: pytest.Config) -> list:
    from conformance.implementations.reference_sdpa import IMPLEMENTATION as SDPA

    subjects = [s for s in _subjects(config) if s.name != SDPA.name] + [InProcessSubject(SDPA)]
    lengths = [int(n) for n in config.getoption("attention_bench_lengths").split(",")]
    dtype = config.getoption("attention_bench_dtype")
    return [pytest.param(BenchCase(subject, length, dtype, device),
                         id=f"{pasteable_id(subject.name)}-L{length}-{dtype}"
                         + ("" if device == "cpu" else f"-{device}"))
            for subject in subjects for length in lengths for device in _devices(config)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("attention_bench") or config.getoption("benchmark_only", default=False):
        return
    skip = pytest.mark.skip(reason="benchmarks run with --attention-bench or --benchmark-only")
    for item in items:
        if "attention_bench_case" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def attention_runner(request: pytest.FixtureRequest) -> Runner:
    """The session's Runner: one gate per (implementation, device), shared by every test."""
    return request.config.stash[_RUNNER]


class AttentionConformanceWarning(UserWarning):
    """A robustness finding beyond the normal range of the dtype: reported, not failed (use
    ``--attention-strict`` to fail on it)."""


def enforce(result: CheckResult, reproduce: Reproduction | None = None,
            interface: Interface = "pytest") -> None:
    """Turn a verdict into the pytest outcome: pass, skip, xfail, a warning (the test passes and
    pytest's warnings summary shows the evidence) or a failure that explains itself (and says
    how to replay its falsifying example: ``reproduce``), what to declare said for
    ``interface`` (pytest's options, or a test file's ``declare=``)."""
    pytest_html.enforced(result)
    if result.status is Status.WARNED:
        warnings.warn(AttentionConformanceWarning(failure_block(result, reproduce, interface)),
                      stacklevel=2)
        return
    if result.status is Status.SKIPPED:
        pytest.skip(result.reason)
    if result.status is Status.EXPECTED_FAILURE:
        pytest.xfail(f"{result.reason} ({'; '.join(result.details[-1:])})")
    if result.status is Status.FAILED:
        pytest.fail(failure_block(result, reproduce, interface), pytrace=False)
    if result.status is Status.SUITE_ERROR:  # not the implementation's: pytest's error, not a fail
        raise SuiteError(failure_block(result, reproduce, interface))
