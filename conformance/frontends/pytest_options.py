"""What the catalogue's pytest side shares, importing pytest alone: where the catalogue's test
modules are, the suite's profile names, and this run's options as a :class:`RunOptions`.

:mod:`conformance.frontends.pytest_plugin` (loaded by pytest in every run) declares the options;
:mod:`conformance.frontends.pytest_catalogue` and :mod:`conformance.testing` (loaded only for a
run about the catalogue) read them here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from conformance.frontends.run_flags import PROFILE_NAMES

if TYPE_CHECKING:
    from conformance.run.options import RunOptions

# The catalogue's test modules live at the package's root, so `pytest --pyargs conformance`
# collects them and their ids read `conformance/test_conformance.py::...`.
CATALOGUE_MODULE = Path(__file__).parents[1] / "test_conformance.py"
BENCHMARK_MODULE = Path(__file__).parents[1] / "test_benchmarks.py"
HYPOTHESIS_PREFIX = "attention-conformance-"
HYPOTHESIS_BUILTIN = ("default", "ci")
"""Hypothesis' own profiles (``ci`` is loaded under ``CI=true``): the suite's quick profile
stays quick under them, reproducible wherever it runs."""
CONFIGS: list[pytest.Config] = []
"""The configs of the pytest sessions in progress, the innermost last (pytester nests them)."""


def profile(config: pytest.Config) -> str:
    """The suite's profile for this run: ``--attention-profile``, else a ``--hypothesis-profile
    attention-conformance-NAME``, else a profile the user registered and named with
    ``--hypothesis-profile NAME`` (``hypothesis:NAME``), else quick."""
    chosen = config.getoption("attention_profile")
    if chosen:
        return chosen
    hypothesis_profile = config.getoption("hypothesis_profile", default=None) or ""
    name = hypothesis_profile.removeprefix(HYPOTHESIS_PREFIX)
    if hypothesis_profile.startswith(HYPOTHESIS_PREFIX) and name in PROFILE_NAMES:
        return name
    if hypothesis_profile and hypothesis_profile not in HYPOTHESIS_BUILTIN:
        return f"hypothesis:{hypothesis_profile}"
    return "quick"


_DATABASES: dict[str, object] = {}
"""The example database of each working directory a session ran in (one object, so runners
made for the same options are one runner)."""


def run_options(config: pytest.Config) -> RunOptions:
    """How this run's checks search, from pytest's and hypothesis' options: the profile, a seed
    (``--hypothesis-seed``), hypothesis' verbosity, strictness, a case to replay (a bad one is a
    ValueError), each check's time budget, and hypothesis' example database
    (``.hypothesis/examples``: failures kept and replayed first; none under CI)."""
    from conformance.generation.profiles import example_database
    from conformance.run.options import RunOptions, replay_case

    where = str(Path.cwd())
    if where not in _DATABASES:
        _DATABASES[where] = example_database(interactive=True)
    seed = config.getoption("hypothesis_seed", default=None)
    return RunOptions(profile=profile(config),
                      seed=int(seed) if isinstance(seed, str) and seed.isdigit() else seed,
                      verbosity=config.getoption("hypothesis_verbosity", default=None),
                      strict=config.getoption("attention_strict"),
                      replay=replay_case(config.getoption("attention_replay") or None),
                      time_budget=config.getoption("attention_time_budget"),
                      database=_DATABASES[where],
                      pictures=bool(config.getoption("attention_html", default=None)))


def current_config() -> pytest.Config | None:
    """The running pytest session's config (None outside pytest): tests parametrized by
    :func:`conformance.testing.parametrize_with_checks` read their options from it."""
    return CONFIGS[-1] if CONFIGS else None


def names_catalogue(config: pytest.Config) -> bool:
    """Whether the command line names the catalogue's own test modules."""
    return any(arg == "conformance" or "test_conformance" in arg or "test_benchmarks" in arg
               or Path(arg.split("::")[0]).resolve() == CATALOGUE_MODULE.parent
               for arg in config.args)


def pasteable_id(name: str) -> str:
    """An implementation's name as a part of a pytest test id that pastes back as a command-line
    argument: pytest splits arguments at ``::``, so a file's ``attention.py::MHA`` is written
    ``attention.py:MHA`` there."""
    return name.replace("::", ":")
