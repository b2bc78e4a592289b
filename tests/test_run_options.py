"""One RunOptions, and the run options both front ends take from one table (run_flags)."""

from __future__ import annotations

import argparse

import pytest

from conformance.frontends import cli, pytest_plugin
from conformance.frontends.run_flags import RUN_FLAGS, jobs_said, processes
from conformance.generation.cases import Case
from conformance.run.options import RunOptions, replay_case

CASE = "Case(batch=1, q_len=2, kv_len=2, num_heads=2, head_dim=1, dtype='float32', seed=0)"


def test_options_are_frozen_and_hold_tuples():
    options = RunOptions(devices=["cpu"], checks=["gate"])
    assert options.devices == ("cpu",) and options.checks == ("gate",)
    with pytest.raises(AttributeError):
        options.profile = "thorough"  # type: ignore[misc]
    assert hash(RunOptions(replay=replay_case(CASE))) == hash(RunOptions(replay=replay_case(CASE)))


def test_a_replayed_case_is_read_in_one_place():
    case = replay_case(CASE)
    assert isinstance(case, Case) and replay_case(case) is case and replay_case(None) is None
    with pytest.raises(ValueError, match="is not a Case"):
        replay_case("Case(")


def test_jobs(monkeypatch):
    assert jobs_said(["check", "x.py", "-j", "3"]) == "3"
    assert jobs_said(["check", "--jobs=2"]) == "2" and jobs_said(["check", "-j4"]) == "4"
    assert jobs_said(["check"]) == "1"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert processes(3, one_in_xdist=True) == 3
    assert processes(0, one_in_xdist=True) == 1
    assert processes(0, one_in_xdist=False) >= 1


def _check_flags() -> set[str]:
    parser = cli._parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    check = commands.choices["check"]
    return {option for action in check._actions for option in action.option_strings} | {
        action.dest for action in check._actions if not action.option_strings}


class _Recorder:
    def __init__(self) -> None:
        self.options: dict[str, dict] = {}

    def getgroup(self, *args, **kwargs):
        return self

    def addoption(self, *names, **kwargs):
        self.options[names[0]] = kwargs


def test_both_front_ends_take_every_run_option_from_the_table():
    recorder = _Recorder()
    pytest_plugin.pytest_addoption(recorder)
    flags = _check_flags()
    for flag in RUN_FLAGS.values():
        assert flag.flag in flags
        assert recorder.options[flag.pytest_flag]["help"] == flag.pytest_help
