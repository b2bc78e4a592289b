"""The isolated worker on correct submissions: the same verdicts as in-process, side by side,
load failures with their status, restarts, fail-fast within a check, per-request time limits,
protections, and no process left behind."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from worker_support import (
    FAST,
    HOSTILE,
    PLAIN_AND_BWRAP,
    SANDBOXES,
    descendants,
    one_thread,
    verdicts,
)

from conformance import Config, Runner, resolve
from conformance.adapter import InProcessSubject, Inputs
from conformance.inference import Declarations
from conformance.worker import (
    IsolatedSubject,
    LoadError,
    SandboxUnavailable,
    WorkerError,
    WorkerStatus,
)

SINGLE = HOSTILE / "correct_single"
PACKAGE = HOSTILE / "correct_package"
CONFIG = Config(batch=2, q_len=5, kv_len=5, d_model=8, num_heads=2)


@pytest.fixture(scope="module", autouse=True)
def nothing_survives():
    """After every test of the module, no process started by it is left."""
    before = set(descendants())
    with one_thread():
        yield
    gc.collect()
    left = [pid for pid in descendants() if pid not in before]
    assert left == [], f"processes left behind: {left}"


@pytest.fixture(scope="module")
def in_process_single():
    (impl,) = resolve(f"{SINGLE / 'attention.py'}::MultiHeadAttention")
    return Runner("quick").run(InProcessSubject(impl), devices=["cpu"])


def test_correct_submission_gets_the_in_process_verdicts(in_process_single):
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox="none") as subject:
        isolated = Runner("quick").run(subject, devices=["cpu"])
        assert subject.failures == [] and subject.restarts == 0
    assert verdicts(isolated) == verdicts(in_process_single)
    assert {r.status.value for r in isolated} == {"passed", "skipped"}


def test_a_package_over_several_files_gets_the_in_process_verdicts(monkeypatch):
    sandbox = SANDBOXES[0]  # the strongest here: bubblewrap where it works
    checks = ["gate", "contract", "padding", "head_split", "reference", "scale", "autograd"]
    spec = "mha.attention:MultiHeadAttention"
    with IsolatedSubject(PACKAGE, spec, limits=FAST, sandbox=sandbox) as subject:
        assert subject.name == "attention:MultiHeadAttention"
        assert "MultiHeadAttention" in subject.defined_names
        isolated = Runner("quick").run(subject, devices=["cpu"], checks=checks)
    monkeypatch.syspath_prepend(str(PACKAGE))
    try:
        (impl,) = resolve(spec)
        expected = Runner("quick").run(InProcessSubject(impl), devices=["cpu"], checks=checks)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] in ("mha", "helpers")]:
            del sys.modules[name]
    assert verdicts(isolated) == verdicts(expected)


def test_two_workers_side_by_side_agree_with_one_at_a_time(in_process_single):
    checks = ["gate", "padding", "reference", "dropout", "determinism"]
    expected = [r for r in verdicts(in_process_single) if r["check"] in checks]
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox="none") as one, \
            IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                            sandbox=SANDBOXES[0]) as two:
        runners = (Runner("quick"), Runner("quick"))
        interleaved: tuple[list, list] = ([], [])
        for name in checks:  # both workers alive, their requests interleaved check by check
            for runner, subject, out in zip(runners, (one, two), interleaved, strict=True):
                out.append(runner.run_check(subject, name, "cpu"))
        assert verdicts(interleaved[0]) == expected == verdicts(interleaved[1])

        # And truly concurrent: two threads calling their own worker, same bits as one at a time.
        x = torch.randn(CONFIG.batch, CONFIG.q_len, CONFIG.d_model)
        inputs = Inputs.self_attention(x, torch.rand(2, 5) > 0.3)
        alone = one.instantiate(CONFIG, 7).forward(inputs)
        outputs: dict[int, list[torch.Tensor]] = {0: [], 1: []}

        def hammer(index, subject):
            instance = subject.instantiate(CONFIG, 7)
            outputs[index] = [instance.forward(inputs) for _ in range(50)]

        threads = [threading.Thread(target=hammer, args=(i, s)) for i, s in enumerate((one, two))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(torch.equal(out, alone) for out in outputs[0] + outputs[1])
        assert len(outputs[0]) == len(outputs[1]) == 50


@pytest.fixture
def submission(tmp_path):
    """A fresh submission directory to write bad files into."""
    directory = tmp_path / "submission"
    directory.mkdir()
    return directory


def test_load_failures_have_a_status_and_the_names_defined(submission):
    shutil.copy(Path(__file__).parent / "fixtures" / "syntax_error.py", submission / "broken.py")
    (submission / "needs.py").write_text("import numpyy_not_installed\n\nclass Attention:\n    pass\n")
    (submission / "raises.py").write_text("def helper():\n    pass\n\nraise RuntimeError('no')\n")
    (submission / "plain.py").write_text("VALUE = 3\n\nclass MultiHeadAttention:\n    pass\n")
    (submission / "attention.py").write_text((SINGLE / "attention.py").read_text())
    cases = {
        "broken.py::Attention": (WorkerStatus.SYNTAX_ERROR, "syntax error in broken.py"),
        "needs.py::Attention": (WorkerStatus.IMPORT_ERROR, "No module named 'numpyy_not_installed'"),
        "raises.py::helper": (WorkerStatus.IMPORT_ERROR, "RuntimeError: no"),
        "plain.py::VALUE": (WorkerStatus.INTERFACE_MISMATCH, "not an nn.Module"),
        "attention.py::MultiHeadAttentoin": (WorkerStatus.NOT_FOUND, "has no attribute"),
        "missing.py::Attention": (WorkerStatus.NOT_FOUND, "no file missing.py in the submission"),
        "missing_package.attention:Attention": (WorkerStatus.NOT_FOUND, "No module named"),
    }

    def load(spec):
        try:
            IsolatedSubject(submission, spec, limits=FAST, sandbox="none").close()
        except LoadError as error:
            return error
        return None

    with ThreadPoolExecutor(4) as pool:  # the worker starts overlap: the test takes less time
        errors = dict(zip(cases, pool.map(load, cases), strict=True))
    names = {}
    for spec, (status, evidence) in cases.items():
        assert isinstance(errors[spec], LoadError), spec
        assert errors[spec].status is status, spec
        assert evidence in str(errors[spec]), spec
        names[spec] = errors[spec].defined_names
    assert names["attention.py::MultiHeadAttentoin"] == ("MultiHeadAttention",)
    assert names["needs.py::Attention"] == ("Attention",)
    assert names["broken.py::Attention"] == ("broken",)  # scanned line by line: it doesn't parse
    with pytest.raises(ValueError, match="relative, inside the submission"):
        IsolatedSubject(submission, "../other/attention.py::MultiHeadAttention")
    with pytest.raises(ValueError, match="relative, inside the submission"):
        IsolatedSubject(submission, "/etc/attention.py::MultiHeadAttention")


def test_declarations_cross_and_inference_runs_in_the_worker():
    declared = Declarations(mask="keep_int:broadcast", causal="never")
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", declared=declared,
                         limits=FAST, sandbox="none") as subject:
        assert any("(declared)" in note for note in subject.notes)
        assert subject.capabilities.mask.kind.value == "keep_int"
        assert subject.describe().endswith("weights from inner.q_proj/inner.k_proj/inner.v_proj/"
                                           "inner.out_proj")
        assert subject.expected_failures == {}


def test_a_crash_restarts_the_worker_for_the_next_instance_within_bounds():
    spec = "attention.py::declared"
    with IsolatedSubject(HOSTILE / "segfault", spec, limits=FAST, sandbox="none") as subject:
        x = torch.randn(2, 5, 8)
        instance = subject.instantiate(CONFIG, 0)
        first_worker = subject._worker
        with pytest.raises(WorkerError) as crashed:
            instance.forward(Inputs.self_attention(x))
        assert crashed.value.status is WorkerStatus.CRASHED and crashed.value.fatal
        assert "killed by signal 11 (segfault) during forward" in str(crashed.value)
        with pytest.raises(WorkerError, match="signal 11"):  # its instances are gone with it
            instance.read_weights()
        again = subject.instantiate(CONFIG, 0)  # a fresh worker, transparently
        assert subject.restarts == 1 and subject._worker is not first_worker
        assert again.read_weights().w_q.shape == (2, 4, 8)
        with pytest.raises(WorkerError, match="signal 11"):
            again.forward(Inputs.self_attention(x))
        subject.instantiate(CONFIG, 0)
        assert subject.restarts == 2
        with pytest.raises(WorkerError, match="signal 11"):
            subject.instantiate(CONFIG, 0).forward(Inputs.self_attention(x))
        with pytest.raises(WorkerError) as gave_up:
            subject.instantiate(CONFIG, 0)
        assert gave_up.value.status is WorkerStatus.RESTART_LIMIT
        assert "died 3 times" in str(gave_up.value)
        assert [status for _, status in
                ((c, e.status) for c, e in subject.failures)][:3] == [WorkerStatus.CRASHED] * 3


def test_after_a_timeout_the_rest_of_the_check_fails_fast_and_the_next_check_restarts():
    with IsolatedSubject(HOSTILE / "infinite_loop", "attention.py::declared", sandbox="none",
                         limits=FAST.scaled(request_seconds=0.5)) as subject:
        inputs = Inputs.self_attention(torch.randn(2, 5, 8))
        subject.begin_check("padding")
        start = time.monotonic()
        with pytest.raises(WorkerError) as hung:
            subject.instantiate(CONFIG, 0).forward(inputs)
        assert hung.value.status is WorkerStatus.TIMEOUT
        assert str(hung.value) == "forward did not return within 0.5 s"
        assert 0.5 <= time.monotonic() - start < 2.0
        start = time.monotonic()
        for _ in range(20):  # hypothesis replaying and shrinking: each fails at once
            with pytest.raises(WorkerError, match=r"did not return within 0\.5 s"):
                subject.instantiate(CONFIG, 0)
        assert time.monotonic() - start < 0.1 and subject.restarts == 0
        subject.begin_check("reference")
        instance = subject.instantiate(CONFIG, 0)  # a new check: a new worker
        assert subject.restarts == 1
        assert instance.read_weights().w_q.shape == (2, 4, 8)
        assert subject.failures == [("padding", hung.value)]


def test_time_limits_are_adjustable_per_request():
    asked = []

    def policy(op, config):
        asked.append((op, config))
        return 0.3 if op == "forward" else 5.0

    with IsolatedSubject(HOSTILE / "infinite_loop", "attention.py::declared", sandbox="none",
                         limits=FAST, timeout=policy) as subject:
        instance = subject.instantiate(CONFIG, 3)
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"forward did not return within 0\.3 s"):
            instance.forward(Inputs.self_attention(torch.randn(2, 5, 8)))
        assert time.monotonic() - start < 1.5
    assert asked == [("build", CONFIG), ("forward", CONFIG)]


def test_released_instances_ride_on_the_next_request():
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox="none") as subject:
        for _ in range(5):  # each one dropped: its release travels with the next request
            subject.instantiate(CONFIG, 0)
        gc.collect()
        assert len(subject._released) == 1
        assert subject.state().instances == 0 and subject._released == []
        kept = subject.instantiate(CONFIG, 0)
        assert subject.state().instances == 1
        assert subject.state().max_rss_bytes > 100 << 20  # torch is loaded
        del kept


def test_printed_output_is_captured_for_the_teacher(tmp_path):
    source = (SINGLE / "attention.py").read_text()
    (tmp_path / "attention.py").write_text(
        "print('hello from import time')\n" + source.replace(
            "        b, n, _ = x.shape", "        print('shape', x.shape)\n        b, n, _ = x.shape"))
    with IsolatedSubject(tmp_path, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox="none") as subject:
        assert "hello from import time" in subject.output
        instance = subject.instantiate(CONFIG, 0)
        instance.forward(Inputs.self_attention(torch.randn(2, 5, 8)))
        assert instance.stdout == "shape torch.Size([2, 5, 8])\n"
        (contract,) = Runner("quick").run(subject, devices=["cpu"], checks=["contract"])
        assert contract.status.value == "failed" and "to stdout" in contract.reason


@pytest.mark.parametrize("sandbox", PLAIN_AND_BWRAP)
def test_protections_are_reported(sandbox):
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox=sandbox) as subject:
        protections = set(subject.protections)
        assert {"own session", "stdin closed", "clean environment", "scratch copy",
                "rlimit cpu", "rlimit address space", "rlimit file size", "no core dumps",
                "no new privileges", "whole process tree killed (subreaper)"} <= protections
        if sandbox == "bwrap":
            assert {"pid namespace", "network namespace", "host filesystem hidden",
                    "private /tmp"} <= protections
            if os.geteuid() == 0:
                assert {"unprivileged uid", "rlimit processes"} <= protections
                assert subject._worker.ready.uid == subject._worker.launch.uid != 0
        else:
            assert not protections & {"pid namespace", "host filesystem hidden"}


@pytest.mark.skipif("unshare" in SANDBOXES and "bwrap" in SANDBOXES,
                    reason="every sandbox works here")
def test_an_unavailable_sandbox_is_refused_in_one_line():
    missing = "bwrap" if "bwrap" not in SANDBOXES else "unshare"
    with pytest.raises(SandboxUnavailable, match=f"sandbox '{missing}' does not work"):
        IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", sandbox=missing)
