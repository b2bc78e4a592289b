"""The suite's hypothesis settings profiles.

They are built from hypothesis' ``default`` profile, never from whatever profile is loaded, so
they stay what they say under ``CI=true`` (which loads hypothesis' ``ci`` profile) and under
``--hypothesis-profile``. Both use no example database: results depend only on the code under
test and, for ``thorough`` without a seed, on chance.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, Verbosity, settings

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


def profile_settings(name: str) -> settings:
    """The settings of profile ``name`` (``quick`` or ``thorough``)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}") from None
