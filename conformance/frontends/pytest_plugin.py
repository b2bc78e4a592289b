"""pytest plugin: the catalogue as ordinary tests.

``pytest --pyargs conformance --attention-impl IMPL`` (or ``pytest --attention-impl IMPL`` in
any repository) collects ``conformance/test_conformance.py``: one test per check, parametrized
over implementations (and devices other than the CPU), with ids such as
``test_padding[seed002-MultiHeadAttention]``. An expected failure is an xfail, a check the
implementation can't take part in is a skip, a device that is absent is a clean skip.

pytest loads this module in every run of an environment where the suite is installed, so it
costs nothing until used: it declares the options and imports only pytest; the hooks and
fixtures that need torch and the suite (:mod:`conformance.frontends.pytest_catalogue`) are registered only
when the run is about the catalogue.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.frontends.pytest_options import (
    BENCHMARK_MODULE,
    CATALOGUE_MODULE,
    CONFIGS,
    HYPOTHESIS_PREFIX,
    names_catalogue,
)
from conformance.frontends.run_flags import addoption_form


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attention-conformance")
    for name in ("impl", "profile", "device"):
        _add(group, name)
    group.addoption("--attention-bench", action="store_true",
                    help="run the benchmark fixtures (conformance/test_benchmarks.py)")
    group.addoption("--attention-bench-lengths", default="128,512", metavar="L,L,...",
                    help="sequence lengths for the benchmark fixtures (default 128,512)")
    group.addoption("--attention-bench-dtype", default="float32",
                    choices=("float32", "float64", "float16", "bfloat16"))
    for name in ("isolate", "call-timeout", "time-budget", "strict", "xfails", "replay", "html"):
        _add(group, name)
    group.addoption("--attention-declare", action="append", default=[], metavar="NAME=VALUE",
                    help="a declaration for the classes named by --attention-impl, as the "
                         "command line's flags spell it: e.g. kv-grouping=tiled, "
                         "mask=ignore_bool:key_padding@key_padding_mask, returns=tensor "
                         "(repeatable; init and mask-format accumulate; every NAME: the "
                         "docs' Declarations page)")



def _add(group: pytest.OptionGroup, name: str) -> None:
    """The run option ``name`` (:data:`~conformance.frontends.run_flags.RUN_FLAGS`), spelled
    ``--attention-NAME``."""
    flag, form = addoption_form(name)
    group.addoption(flag, **form)


def _rerunnable(config: pytest.Config) -> None:
    """Test ids as pytest prints them for the catalogue (``::test_padding[attention.py:MHA]``, or
    ``test_conformance.py::...``: the module lives with the suite, outside the user's repository)
    pasted back as arguments: pointed at the catalogue's module."""
    for index, arg in enumerate(config.args):
        path, separator, selection = arg.partition("::")
        if separator and (not path or Path(path).name in (CATALOGUE_MODULE.name,
                                                          BENCHMARK_MODULE.name)):
            module = BENCHMARK_MODULE if selection.startswith("test_bench") else CATALOGUE_MODULE
            if not path or not Path(path).exists():
                config.args[index] = f"{module}::{selection}"


def wanted(config: pytest.Config) -> bool:
    """Whether this run is about the catalogue."""
    return bool(config.getoption("attention_impl")) or names_catalogue(config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    CONFIGS.append(config)
    # `--hypothesis-profile attention-conformance-NAME` is loaded by hypothesis' own plugin in
    # its pytest_configure: the suite's profiles must be registered before (tryfirst).
    if (config.getoption("hypothesis_profile", default=None) or "").startswith(HYPOTHESIS_PREFIX):
        pass
    if config.getoption("attention_html"):
        from conformance.frontends import pytest_html

        config.pluginmanager.register(pytest_html, "attention-conformance-html")
    if wanted(config):
        _rerunnable(config)
        from conformance.frontends import pytest_catalogue

        config.pluginmanager.register(pytest_catalogue, "attention-conformance-catalogue")
        pytest_catalogue.configure(config)


def _catalogue_modules(config: pytest.Config) -> list[Path]:
    # Where the modules are, not resolved: a virtualenv's lib64 links to its lib, and the way
    # through the link would collect them twice.
    return [CATALOGUE_MODULE.absolute(),
            *([BENCHMARK_MODULE.absolute()] if config.getoption("attention_bench") else [])]


def _virtualenv(path: Path) -> Path | None:
    """The virtualenv ``path`` lies in (the folder holding ``pyvenv.cfg``), or None."""
    return next((folder for folder in path.parents if (folder / "pyvenv.cfg").is_file()), None)


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The catalogue's modules are collected even when the suite is installed in a virtualenv
    inside the repository (a project's own ``.venv``), which pytest otherwise skips: inside that
    virtualenv only the folders on the way to them, and they, are collected; nothing else."""
    if not wanted(config):
        return None
    modules = _catalogue_modules(config)
    venv = _virtualenv(modules[0])
    path = collection_path.absolute()
    if venv is None or not (path == venv or venv in path.parents):
        return None
    on_the_way = any(path == module or path in module.parents for module in modules)
    return not on_the_way


def pytest_unconfigure(config: pytest.Config) -> None:
    if config in CONFIGS:
        CONFIGS.remove(config)


def _checks_attention(item: pytest.Item) -> bool:
    return bool({"attention_target", "attention_check"} & set(getattr(item, "fixturenames", ())))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """``--hypothesis-show-statistics`` for the suite's tests: their searches run inside the test
    (not as ``@given`` tests of their own), so hypothesis' plugin can't see them; their statistics
    are collected here and handed to it, which prints them in its section."""
    if not (item.config.getoption("hypothesis_show_statistics", default=False)
            and _checks_attention(item)):
        yield
        return
    from hypothesis.statistics import collector, describe_statistics

    collected: list[dict] = []
    with collector.with_value(collected.append):
        yield
    described = []
    for number, stats in enumerate(collected, 1):
        stats["nodeid"] = item.nodeid + (f" (search {number} of {len(collected)})"
                                         if len(collected) > 1 else "")
        described.append(describe_statistics(stats))
    if described:
        item.hypothesis_statistics = "\n\n".join(described)
