"""The catalogue on several implementations, ``jobs`` at a time, and on one target of any kind.

:func:`check_many` takes IMPL strings paired with what they resolve to and runs them in this
process or in spawned processes (the verdicts don't depend on ``jobs``); :func:`check` is the
library's front door for one target (a class, an instance, a function, an IMPL string, ...).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import torch

from conformance.generation.cases import Case
from conformance.loading.registry import implementations_of, resolve
from conformance.model.check_names import unknown_checks
from conformance.model.declarations import Declarations
from conformance.model.results import CheckResult
from conformance.model.spec import Implementation
from conformance.run.isolated import Interfaces, Isolated, Target, isolated_results
from conformance.run.options import RunOptions, replay_case
from conformance.run.runner import Progress, Runner
from conformance.subject.boundary import Subject
from conformance.subject.in_process import InProcessSubject


def _results(runner: Runner, spec: str, what: Implementation | Isolated,
             declared: Declarations | None, options: RunOptions,
             interfaces: Interfaces) -> list[CheckResult]:
    """Every verdict of one target, on ``options``' devices and checks."""
    if isinstance(what, Isolated):
        return isolated_results(runner, spec, what, declared, options.devices, options.checks,
                                interfaces)
    subject = InProcessSubject(what)
    interfaces[what.name] = (subject.describe(), tuple(what.notes))
    return runner.run(subject, devices=options.devices, checks=options.checks)


@dataclass(frozen=True)
class _Resolved:
    """An in-process implementation on its way to a spawned process: its factory may be a local
    function, so it travels as its name and expectations and is resolved again there."""

    name: str
    expected_failures: dict[str, str]
    expected_warnings: dict[str, str]


def _travelling(what: Implementation | Isolated) -> _Resolved | Isolated:
    if isinstance(what, Isolated):
        return what
    return _Resolved(what.name, dict(what.expected_failures), dict(what.expected_warnings))


_RESOLVED: dict[tuple[str, Declarations | None, str], list[Implementation]] = {}
"""What each IMPL resolved to in this worker process, for each implementation of it wanted (a
model's one kind of attention layer: the others are not inferred)."""


def _resolved(spec: str, declared: Declarations | None, name: str) -> list[Implementation]:
    key = (spec, declared, name)
    try:
        hash(key)
    except TypeError:  # a declaration holding an unhashable value (an init list): resolved anew
        return resolve(spec, declared, named=name)
    if key not in _RESOLVED:
        _RESOLVED[key] = resolve(spec, declared, named=name)
    return _RESOLVED[key]


def _check_in_worker(spec: str, what: _Resolved | Isolated, declared: Declarations | None,
                     options: RunOptions) -> tuple[list[CheckResult], Interfaces]:
    """One target's verdicts (and interfaces), in a spawned process: an in-process one is
    resolved again there by its IMPL (expected failures and declarations travel along: they may
    come from files or flags the process never saw)."""
    torch.set_num_threads(1)  # the processes share the cores between them
    if isinstance(what, _Resolved):
        (impl,) = [i for i in _resolved(spec, declared, what.name) if i.name == what.name]
        what = replace(impl, expected_failures=what.expected_failures,
                       expected_warnings=what.expected_warnings)
    interfaces: Interfaces = {}
    results = _results(Runner.of(replace(options, jobs=1)), spec, what, declared, options,
                       interfaces)
    return results, interfaces


def check_many(targets: Sequence[Target], options: RunOptions | None = None, *,
               declared: Declarations | None = None, progress: Progress | None = None,
               interfaces: Interfaces | None = None, **changes: Any) -> list[CheckResult]:
    """Verdicts for several implementations, ``options.jobs`` at a time (one implementation: its
    checks shared out over ``jobs`` processes, see :mod:`conformance.run.shared`); results in
    input order.

    ``targets`` pairs each implementation with the IMPL string (and ``declared``, the
    declarations) that resolve to it, so a worker process can find it again; an
    :class:`Isolated` target's implementations run in worker processes of their own. ``options``
    (:class:`RunOptions`; default: the quick profile, every available device, the whole
    catalogue, one process) say how the checks search and where; ``changes``, any of its fields,
    over them (``devices=["cpu"], jobs=2``). The verdicts don't depend on ``jobs``.
    ``interfaces``, when given, receives what each implementation declares and what was
    inferred. Raises :class:`BadInput` when an isolated implementation is not checkable.
    """
    options = replace(options or RunOptions(), **changes)
    interfaces = interfaces if interfaces is not None else {}
    if options.jobs <= 1 or len(targets) <= 1:
        runner = Runner.of(options, progress)
        return [result for spec, what in targets
                for result in _results(runner, spec, what, declared, options, interfaces)]
    # Spawned, not forked: torch's thread pools don't survive a fork.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(options.jobs, len(targets)),
                             mp_context=context) as pool:
        futures = [pool.submit(_check_in_worker, spec, _travelling(what), declared, options)
                   for spec, what in targets]
        results: list[CheckResult] = []
        start = time.perf_counter()
        for future in futures:
            done, seen = future.result()
            interfaces.update(seen)
            if progress is not None:
                for name in dict.fromkeys(r.implementation for r in done):
                    progress.finished(name, [r for r in done if r.implementation == name],
                                      time.perf_counter() - start)
            results += done
        return results


def check(target: object, *, profile: str = "quick", devices: Sequence[str] | None = None,
          checks: Iterable[str] | None = None, seed: int | None = None, strict: bool = False,
          declare: Mapping[str, object] | None = None,
          replay: Case | str | None = None,
          time_budget: float | None = None) -> list[CheckResult]:
    """Run the catalogue on an implementation; one result per (implementation, check, device).

    ``target`` is what the command line takes: an ``nn.Module`` class (inferred), an instance
    (through its class), a core attention function, an :class:`Implementation` (or several), a
    :class:`Subject`, a registered name or an IMPL string. ``declare`` overrides inference with
    the command line's declarations in their TOML spellings (``{"causal": "always"}``), over what
    the nearest ``pyproject.toml`` declares. ``devices`` defaults to every available one;
    ``checks`` to the whole catalogue (an unknown name is a ValueError with a suggestion).
    Expected failures declared by the implementation come back as ``expected-failure``;
    robustness findings as ``warning``, or as failures with ``strict=True``. ``replay`` runs the
    checks on that one falsifying example (a ``Case`` or its text, as a report prints it).
    ``time_budget`` bounds each check, in seconds (default: the profile's, 30 s for ``quick``;
    0: none): a check it cuts short is a warning saying how many examples ran.
    """
    from conformance.model.declaration_sources import from_mapping

    names = list(checks) if checks is not None else None
    problem = unknown_checks(names or [])
    if problem:
        raise ValueError(problem)
    runner = Runner.of(RunOptions(profile, seed, strict, replay=replay_case(replay),
                                  time_budget=time_budget))
    if isinstance(target, Subject):
        return runner.run(target, devices=devices, checks=names)
    stated = from_mapping(dict(declare or {}), "check(declare=...)") if declare else None
    return [result for impl in implementations_of(target, stated)
            for result in runner.run(InProcessSubject(impl), devices=devices, checks=names)]
