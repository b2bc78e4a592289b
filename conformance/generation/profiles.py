"""The suite's hypothesis settings profiles.

They are built from hypothesis' ``default`` profile, never from whatever profile is loaded, so
they stay what they say under ``CI=true`` (which loads hypothesis' ``ci`` profile) and under
``--hypothesis-profile``. Neither uses an example database unless a front end asks for one for
interactive use (:func:`example_database`): then a failing example is kept in hypothesis'
``.hypothesis/examples`` and tried first by the next run, the hypothesis way. Without one
(grading, CI, the Python API), results depend only on the code under test and, for
``thorough`` without a seed, on chance.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

PROFILE_NAMES = ("quick", "thorough")

_COMMON = dict(
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    verbosity=Verbosity.quiet,
)

PROFILES: dict[str, settings] = {
    # Reproducible: the same examples on every run and machine.
    "quick": settings(settings.get_profile("default"), max_examples=25, derandomize=True,
                      **_COMMON),
    # Explores: fresh examples each run (fix them with a seed).
    "thorough": settings(settings.get_profile("default"), max_examples=150, derandomize=False,
                         **_COMMON),
}

for _name, _profile in PROFILES.items():
    # Registered so `--hypothesis-profile attention-conformance-quick` can name them too.
    settings.register_profile(f"attention-conformance-{_name}", _profile)


USER_PREFIX = "hypothesis:"
"""``hypothesis:NAME``: a hypothesis profile the user registered (``--hypothesis-profile NAME``
under pytest), honoured for what it says about the search."""


def example_database(interactive: bool) -> ExampleDatabase | None:
    """Hypothesis' example database for interactive use (a terminal, the thorough profile,
    pytest outside CI): ``.hypothesis/examples`` in the working directory, where hypothesis
    users expect it. None otherwise, and always under ``CI`` (a CI run, like grading, never
    depends on what an earlier run found)."""
    if not interactive or os.environ.get("CI", "").lower() not in ("", "0", "false"):
        return None
    return DirectoryBasedExampleDatabase(Path(".hypothesis") / "examples")


def keep_examples(test: object, key: bytes | None, search: int) -> None:
    """Keep the failing examples of a check's ``search``-th search under ``key`` (its
    implementation, check and device) in the settings' example database. Every search is the
    same inner function, whose digest would be hypothesis' key for all of them; the key it
    reads first is this attribute (hypothesis' own pytest plugin tells parametrized tests apart
    the same way)."""
    if key is not None:
        test._hypothesis_internal_database_key = key + b".%d" % search  # type: ignore[attr-defined]


def examples_key(implementation: str, check: str, device: str) -> bytes:
    """The example database's key for one check of one implementation on one device."""
    return hashlib.sha256(f"attention-conformance/{implementation}/{check}/{device}".encode()
                          ).hexdigest()[:32].encode()


def profile_settings(name: str, *, seed: int | None = None, verbosity: str | None = None,
                     database: ExampleDatabase | None = None) -> settings:
    """The settings of profile ``name``: ``quick``, ``thorough``, or ``hypothesis:NAME``.

    A user's profile gives the search its size, phases, derandomisation, verbosity and blob
    printing; the suite keeps what its checks need whatever the profile (no deadline: a call may
    be slow; no health checks; one bug reported; no example database). A ``seed`` makes even a
    derandomised profile draw from it (the examples then change with the seed); ``verbosity``
    (hypothesis' names: quiet, normal, verbose, debug) overrides the profile's. A
    ``database`` (see :func:`example_database`) keeps failing examples and replays them first.
    """
    if name.startswith(USER_PREFIX):
        try:
            base = settings.get_profile(name.removeprefix(USER_PREFIX))
        except Exception as error:  # InvalidArgument: an unknown name
            raise ValueError(f"unknown hypothesis profile {name.removeprefix(USER_PREFIX)!r}") \
                from error
        phases = tuple(dict.fromkeys((Phase.explicit, *base.phases)))
        chosen = settings(base, phases=phases, **{k: v for k, v in _COMMON.items()
                                                  if k not in ("phases", "verbosity",
                                                               "print_blob")})
    else:
        try:
            chosen = PROFILES[name]
        except KeyError:
            raise ValueError(f"unknown profile {name!r}: choose one of "
                             f"{', '.join(PROFILES)}") from None
    if seed is not None and chosen.derandomize:
        chosen = settings(chosen, derandomize=False)
    if verbosity is not None:
        chosen = settings(chosen, verbosity=Verbosity[verbosity])
    if database is not None:
        chosen = settings(chosen, database=database,
                          phases=tuple(dict.fromkeys((Phase.explicit, Phase.reuse,
                                                      *chosen.phases))))
    return chosen


@contextlib.contextmanager
def inside_a_users_search():
    """Where the suite runs inside a user's own hypothesis test (``conformance.check`` called in
    an ``@given`` test), hypothesis' nested-``@given`` health check would fail each check's
    search as an error of the suite's: it is suppressed for the suite's own searches (their
    cost is the suite's, bounded by its profile). Hypothesis offers this through its settings
    context, which moved between its versions: without it, nothing changes."""
    try:
        from hypothesis._settings import local_settings
    except ImportError:  # pragma: no cover - another hypothesis: its own behaviour
        yield
        return
    current = settings.default
    with local_settings(settings(current, suppress_health_check=(
            *current.suppress_health_check, HealthCheck.nested_given))):
        yield
