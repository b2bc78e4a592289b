"""pytest plugin: the catalogue as ordinary tests.

``pytest --pyargs conformance --attention-impl IMPL`` collects ``conformance/test_conformance.py``:
one test per check, parametrized over implementations (and devices other than the CPU), with ids
such as ``test_padding[seed002-MultiHeadAttention]``. Verdicts come from the same
:class:`~conformance.catalogue.Runner` the CLI uses; an expected failure is an xfail, a check the
implementation can't take part in is a skip, a device that is absent is a clean skip.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conformance import expectations
from conformance.adapter import InProcessSubject, Subject
from conformance.cases import Case
from conformance.catalogue import Runner
from conformance.inference.declarations import DeclarationError, Declarations, from_mapping
from conformance.profiles import PROFILE_NAMES
from conformance.registry import ResolveError, is_located, registered, resolve
from conformance.report import failure_block
from conformance.results import CheckResult, Status
from conformance.strategies import available_devices, fixed_features

CATALOGUE_MODULE = Path(__file__).with_name("test_conformance.py")
BENCHMARK_MODULE = Path(__file__).with_name("test_benchmarks.py")
_SUBJECTS = pytest.StashKey[list[Subject]]()
_RUNNER = pytest.StashKey[Runner]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attention-conformance")
    group.addoption("--attention-impl", action="append", default=[], metavar="IMPL",
                    help="implementation to check: registered name, package.module:Attr or "
                         "path/to/file.py::Attr (repeatable; default: every registered one)")
    group.addoption("--attention-profile", choices=PROFILE_NAMES, default=None,
                    help="the suite's hypothesis profile (default quick; "
                         "--hypothesis-profile attention-conformance-NAME also selects it)")
    group.addoption("--attention-device", action="append", default=[], metavar="DEVICE",
                    help="devices to test on (repeatable; default cpu and cuda, absent ones skip)")
    group.addoption("--attention-bench", action="store_true",
                    help="run the benchmark fixtures (conformance/test_benchmarks.py)")
    group.addoption("--attention-bench-lengths", default="128,512", metavar="L,L,...",
                    help="sequence lengths for the benchmark fixtures (default 128,512)")
    group.addoption("--attention-bench-dtype", default="float32",
                    choices=("float32", "float64", "float16", "bfloat16"))
    group.addoption("--attention-isolate", action="store_true",
                    help="run each implementation named by a file or module in a worker process "
                         "of its own: a call that hangs fails its test after "
                         "--attention-call-timeout, a crash fails with its status")
    group.addoption("--attention-call-timeout", type=float, default=None, metavar="SECONDS",
                    help="time limit of one call in an isolated implementation (default 10)")
    group.addoption("--attention-strict", action="store_true",
                    help="warnings (robustness findings beyond the normal range) fail the test")
    group.addoption("--attention-xfails", default=None, metavar="FILE",
                    help="expected failures, TOML: [implementation] tables of check = \"reason\"")
    group.addoption("--attention-declare", action="append", default=[], metavar="NAME=VALUE",
                    help="a declaration for the classes named by --attention-impl, as the "
                         "command line's flags spell it: e.g. kv-grouping=tiled, "
                         "mask=ignore_bool:key_padding@key_padding_mask, returns=tensor "
                         "(repeatable; init and mask-format accumulate)")


def _profile(config: pytest.Config) -> str:
    chosen = config.getoption("attention_profile")
    if chosen:
        return chosen
    hypothesis_profile = config.getoption("hypothesis_profile", default=None) or ""
    prefix = "attention-conformance-"
    if hypothesis_profile.startswith(prefix) and hypothesis_profile[len(prefix):] in PROFILE_NAMES:
        return hypothesis_profile[len(prefix):]
    return "quick"


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
            for spec in specs or [None]:
                if spec is not None and isolate and is_located(spec):
                    subjects += _isolated(config, spec, expected, declared)
                    continue
                implementations = resolve(spec, declared) if spec else list(
                    registered().values())
                subjects += [InProcessSubject(impl) for impl in
                             expectations.apply(implementations, *expected)]
        except (ResolveError, expectations.ExpectationsError, DeclarationError) as error:
            raise pytest.UsageError(f"attention-conformance: {error}") from error
        config.stash[_SUBJECTS] = subjects
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
    from conformance.worker import LoadError
    from conformance.worker.local import CALL_SECONDS, open_all

    seconds = config.getoption("attention_call_timeout") or CALL_SECONDS
    try:
        subjects = open_all(spec, declared, call_seconds=seconds)
    except LoadError as error:
        raise pytest.UsageError(f"attention-conformance: {spec}: {error}") from error
    failures, warnings = expected
    for subject in subjects:
        config.add_cleanup(subject.close)
        subject.expected_failures = {**subject.expected_failures,
                                     **failures.get(subject.name, {})}
        subject.expected_warnings = {**subject.expected_warnings,
                                     **warnings.get(subject.name, {})}
    return subjects


def _wanted(config: pytest.Config) -> bool:
    """Whether this run is about the catalogue (so the header is worth printing)."""
    return bool(config.getoption("attention_impl")) or _names_catalogue(config)


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RUNNER] = Runner(_profile(config),
                                   config.getoption("hypothesis_seed", default=None),
                                   strict=config.getoption("attention_strict"))
    # `pytest --attention-impl IMPL` from any repository: collect the catalogue too, unless the
    # command line already names it (`--pyargs conformance`).
    if config.getoption("attention_impl") and not _names_catalogue(config):
        config.args.append(str(CATALOGUE_MODULE))
        if config.getoption("attention_bench"):
            config.args.append(str(BENCHMARK_MODULE))


def _names_catalogue(config: pytest.Config) -> bool:
    return any(arg == "conformance" or "test_conformance" in arg
               or Path(arg.split("::")[0]).resolve() == CATALOGUE_MODULE.parent
               for arg in config.args)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if not _wanted(config):
        return None
    present = available_devices()
    devices = ", ".join(d if d in present else f"{d} (not available: skipped)"
                        for d in _devices(config))
    names = ", ".join(s.name for s in _subjects(config))
    return [f"attention-conformance: profile {_profile(config)}; devices {devices}",
            f"attention-conformance: implementations under test: {names}"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "attention_bench_case" in metafunc.fixturenames:
        metafunc.parametrize("attention_bench_case", _bench_params(metafunc.config))
        return
    if "attention_target" not in metafunc.fixturenames:
        return
    params = [
        pytest.param((subject, device),
                     id=subject.name if device == "cpu" else f"{subject.name}-{device}")
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
                    causal=caps.causal == "always", **fixed_features(caps))
        if caps.max_len is not None and self.length > caps.max_len:
            pytest.skip(f"beyond its max_len {caps.max_len}")
        instance = self.subject.instantiate(case.config, case.seed)
        cotangent = torch.ones(2, self.length, case.d_model, dtype=case.config.dtype,
                               device=self.device)
        return instance, case.inputs(caps.call, use_mask=False), cotangent


def _bench_params(config: pytest.Config) -> list:
    from implementations.reference_sdpa import IMPLEMENTATION as SDPA

    subjects = [s for s in _subjects(config) if s.name != SDPA.name] + [InProcessSubject(SDPA)]
    lengths = [int(n) for n in config.getoption("attention_bench_lengths").split(",")]
    dtype = config.getoption("attention_bench_dtype")
    return [pytest.param(BenchCase(subject, length, dtype, device),
                         id=f"{subject.name}-L{length}-{dtype}"
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


def enforce(result: CheckResult) -> None:
    """Turn a verdict into the pytest outcome: pass, skip, xfail, a warning (the test passes and
    pytest's warnings summary shows the evidence) or a failure that explains itself."""
    if result.status is Status.WARNED:
        warnings.warn(AttentionConformanceWarning(failure_block(result)), stacklevel=2)
        return
    if result.status is Status.SKIPPED:
        pytest.skip(result.reason)
    if result.status is Status.EXPECTED_FAILURE:
        pytest.xfail(f"{result.reason} ({'; '.join(result.details[-1:])})")
    if result.status is Status.FAILED:
        pytest.fail(failure_block(result), pytrace=False)
