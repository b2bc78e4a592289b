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
    (pytest-benchmark then refuses ``--benchmark-only``): the children get a clean environment.

    No command a test runs is handed to a developer's warm ``attention-conformance serve``: the
    tests check what the command does in its own process tree (the workers it leaves, its exit,
    its imports), and a server of this installation would otherwise take every ``check`` they
    start. The tests of serving start their own server, in a folder of their own, and lift this.

    One torch thread per test process: the two workers share the cores, and torch's intra-op
    threads on the tests' small tensors spin on a core the other worker needs (measured beside a
    second run of itself: tests/test_wild_styles_are_correct.py took 37 s of CPU with torch's
    default threads, 7.5 s with one). The suite's checks already run with one
    (``conformance.numerics.threads.one_thread``); this is for the tests' own torch work."""
    import os

    import torch

    from conformance.frontends import served

    torch.set_num_threads(1)
    os.environ[served.SWITCH] = "0"
    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
        del os.environ[name]
