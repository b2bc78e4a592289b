"""One implementation's checks shared out over forks (conformance.run.shared): the verdicts, their
evidence and their order are those of one process, whatever happens to a fork."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conformance.implementations import bundled
from conformance.model.check_names import CHECK_NAMES
from conformance.model.results import CheckResult, Status
from conformance.run import shared
from conformance.run.isolated import BadInput, Isolated
from conformance.run.many import check_many
from conformance.run.runner import Runner
from conformance.subject.in_process import InProcessSubject
from tests.verdicts import counted_forks, seen
from tests.worker_support import left_behind

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = {impl.name: impl for impl in bundled()}


@pytest.fixture
def forks() -> Iterator[list[int]]:
    """The forks this process makes (each pid), so that a test knows the checks were shared."""
    with counted_forks() as made:
        yield made


def _run(impl, processes: int) -> list[CheckResult]:
    return Runner(processes=processes).run(InProcessSubject(impl), devices=["cpu"])


@pytest.mark.parametrize("name", ["mutant-mask-inverted", "mutant-dropout-in-eval"])
def test_two_processes_give_what_one_gives(name, forks):
    """One with failures found and shrunk, and one whose forward draws from torch's global
    generator (dropout left on in eval): the same evidence, in the same order. The whole
    bundled catalogue is compared in test_expected_results (a slow test; this one is in the
    quick loop)."""
    assert seen(_run(BUNDLED[name], 2)) == seen(_run(BUNDLED[name], 1))
    assert len(forks) == 1


def test_an_isolated_implementation_gets_a_twin_worker_and_leaves_nothing_behind(forks):
    """A file checked isolated: the fork checks through a second worker of its own (loaded
    while the gate ran); verdicts as with one process, and every worker gone after."""
    spec = "conformance/implementations/mutants/mask_after_softmax.py::MaskAfterSoftmax"
    os.chdir(ROOT)
    with left_behind() as left:
        one = check_many([(spec, Isolated())], devices=["cpu"], jobs=1)
        two = check_many([(spec, Isolated())], devices=["cpu"], jobs=2)
    assert seen(two) == seen(one)
    assert any(r.status.value == "failed" for r in one)
    assert len(forks) == 1
    assert left == []


def test_a_fork_that_dies_leaves_its_check_to_this_process(forks):
    """A fork killed in the middle of a check (here: the implementation exits the process it
    runs in, only in the fork) answers nothing: that check runs here again, and the verdicts
    are those of one process."""
    textbook = BUNDLED["textbook"]
    parent = os.getpid()

    def exits_in_a_fork(config):
        module = textbook.factory(config)
        forward = module.forward

        def exiting(*args, **kwargs):
            if os.getpid() != parent:
                os._exit(7)
            return forward(*args, **kwargs)

        module.forward = exiting
        return module

    impl = replace(textbook, factory=exits_in_a_fork)
    assert seen(_run(impl, 2)) == seen(_run(impl, 1))
    assert len(forks) == 1


def test_with_a_second_thread_no_fork_is_made(forks):
    """A fork copies only the calling thread: where another runs, the checks run here, one after
    another (the verdicts the same)."""
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert not shared.forkable()
        assert shared.wanted(2, CHECK_NAMES) == 0
        results = _run(BUNDLED["textbook"], 2)
    finally:
        release.set()
        other.join()
    assert shared.forkable() and forks == []
    assert seen(results) == seen(_run(BUNDLED["textbook"], 1))


def test_the_twins_loading_beside_a_module_that_fails_to_load_are_stopped():
    """The twins' workers start loading with the first: where the module does not load, they
    are stopped with it (one line for the user, nothing left running)."""
    os.chdir(ROOT)
    with left_behind() as left, pytest.raises(BadInput, match="syntax"):
        check_many([("tests/fixtures/syntax_error.py::Anything", Isolated())],
                   devices=["cpu"], jobs=2)
    assert left == []


def test_a_twin_handed_to_a_fork_stops_when_the_fork_ends():
    """Once a fork has taken a twin (``let_go``), this process holds nothing that keeps the
    twin's worker running: it stops as the fork ends, before this process closes the twin."""
    from conformance.worker import IsolatedSubject

    path = ROOT / "conformance/implementations/mutants/mask_after_softmax.py"
    with IsolatedSubject(path, "mask_after_softmax.py::MaskAfterSoftmax", twins=1) as subject:
        twin = subject.twin()
        worker = Path(f"/proc/{twin._worker.pid}")
        pid = os.fork()
        if pid == 0:
            os._exit(0 if twin.ready() else 1)
        twin.let_go()
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        deadline = time.monotonic() + 10
        while worker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not worker.exists()
        twin.close()


def test_a_subject_closed_after_its_run_is_let_go_as_its_twins_close(forks):
    """``closed_after``: the caller closes the subject next, so its worker begins to stop as the
    run ends (beside the twins' stops, not after them) and is gone before ``close``."""
    from conformance.worker import IsolatedSubject

    path = ROOT / "conformance/implementations/mutants/mask_after_softmax.py"
    with IsolatedSubject(path, "mask_after_softmax.py::MaskAfterSoftmax", twins=1) as subject:
        worker = Path(f"/proc/{subject._worker.pid}")
        results = Runner(processes=2).run(subject, devices=["cpu"], closed_after=True,
                                          checks=["gate", "padding", "scale"])
        assert [r.check for r in results] == ["gate", "padding", "scale"]
        assert len(forks) == 1
        deadline = time.monotonic() + 10
        while worker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not worker.exists()

def test_the_queue_holds_every_check_past_the_gate_longest_first(tmp_path, forks):
    """Each process takes the checks past the gate in ``SLOWEST_FIRST`` order (a long check taken
    last would leave the other process waiting), and every check is run once."""
    assert sorted(shared.SLOWEST_FIRST) == sorted(n for n in CHECK_NAMES if n != "gate")
    record = tmp_path / "taken"

    class Recording:
        progress = None

        def run_check(self, subject, name, device):
            with record.open("a") as out:
                out.write(f"{os.getpid()} {name}\n")
            return CheckResult(subject.name, name, device, Status.PASSED)

        def runs_checks(self, subject, device):
            return True

    subject = InProcessSubject(BUNDLED["textbook"])
    pairs = [("cpu", name) for name in CHECK_NAMES]
    results = shared.run(Recording(), subject, pairs, shared.twins(subject, 1))
    assert [r.check for r in results] == list(CHECK_NAMES)
    assert len(forks) == 1
    taken: dict[str, list[str]] = {}
    for line in record.read_text().splitlines():
        pid, name = line.split()
        taken.setdefault(pid, []).append(name)
    assert sorted(n for names in taken.values() for n in names) == sorted(CHECK_NAMES)
    for names in taken.values():
        past_gate = [n for n in names if n != "gate"]
        assert past_gate == sorted(past_gate, key=shared.SLOWEST_FIRST.index)

def test_each_check_starts_from_one_random_state_and_the_callers_is_given_back():
    """A forward that draws from torch's global generator (dropout left on in eval) draws the same
    in a check run alone as after the others; the caller's own generator is as it was."""
    impl = BUNDLED["mutant-dropout-in-eval"]
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    alone = Runner().run(InProcessSubject(impl), devices=["cpu"], checks=["determinism"])
    assert torch.equal(torch.get_rng_state(), before)
    after_others = [r for r in _run(impl, 1) if r.check == "determinism"]
    assert seen(alone) == seen(after_others)
