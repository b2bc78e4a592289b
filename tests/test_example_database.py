"""Failures first, the hypothesis way: in interactive use a failing example is kept in
hypothesis' example database and tried first by the next run; grading, CI and the Python API
keep none, so their verdicts never depend on an earlier run."""

from __future__ import annotations

from hypothesis.database import InMemoryExampleDatabase

from conformance import Implementation, Runner
from conformance.frontends.cli import main
from conformance.generation.profiles import example_database
from conformance.subject.in_process import InProcessSubject
from tests.fixtures.user_impls import _CAPS, _WEIGHTS, PlainAttention

SEEN: list[int] = []
"""The batch size of every call the padding check makes, in order."""


class FirstMaskForAll(PlainAttention):
    """Applies the first sequence's mask to the whole batch (``mask[:1]``): invisible with one
    sequence, a leak with two whose padding differs."""

    def forward(self, x, mask=None):
        SEEN.append(x.shape[0])
        return super().forward(x, None if mask is None else mask[:1])


IMPL = Implementation("first-mask-for-all", lambda c: FirstMaskForAll(c.d_model, c.num_heads),
                      capabilities=_CAPS, weight_layout=_WEIGHTS)


def _padding(database) -> tuple[str, list[int]]:
    """The padding verdict and the batch sizes its search called the module with."""
    runner = Runner("quick", database=database)
    subject = InProcessSubject(IMPL)
    runner.gate(subject, "cpu")
    SEEN.clear()
    result = runner.run_check(subject, "padding", "cpu")
    return result.status.value, list(SEEN)


def test_a_failing_example_is_kept_and_tried_first_next_time():
    database = InMemoryExampleDatabase()
    status, calls = _padding(database)
    assert status == "failed" and calls[0] == 1  # the search starts from one sequence
    assert len(database.data) >= 1  # the shrunk failure is kept
    again, replayed = _padding(database)
    assert again == "failed"
    assert replayed[0] == 2  # the kept example (two sequences) is the first one tried
    assert len(replayed) < len(calls)
    # Without a database, the same run starts from the start again.
    assert _padding(None) == (status, calls)


def test_the_database_is_local_and_never_under_ci(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CI", raising=False)
    assert example_database(interactive=False) is None
    assert str(example_database(interactive=True).path) == ".hypothesis/examples"
    monkeypatch.setenv("CI", "true")
    assert example_database(interactive=True) is None


def test_the_command_line_keeps_failures_where_asked_and_only_there(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CI", raising=False)
    args = ["check", "mutant-mask-inverted", "--check", "padding", "--no-progress"]
    main(args)  # not a terminal, quick profile: nothing kept
    assert not (tmp_path / ".hypothesis").exists()
    main([*args, "--example-database"])
    assert any((tmp_path / ".hypothesis" / "examples").iterdir())
