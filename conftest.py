"""The project's own tests run under one fixed hypothesis profile, whatever CI or flags say."""

from hypothesis import settings

settings.register_profile(
    "attention-conformance-project-tests",
    settings(settings.get_profile("default"), max_examples=25, derandomize=True, database=None,
             deadline=None, print_blob=False),
)
settings.load_profile("attention-conformance-project-tests")


def pytest_configure(config) -> None:
    """Under pytest-xdist (``make test`` runs two workers), a pytest or CLI the tests start
    inherits the worker's ``PYTEST_XDIST_*`` variables and believes it is a worker itself
    (pytest-benchmark then refuses ``--benchmark-only``): the children get a clean environment."""
    import os

    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
        del os.environ[name]
