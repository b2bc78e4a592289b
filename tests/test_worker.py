"""The isolated worker on correct submissions: the same verdicts as in-process, side by side,
load failures with their status, restarts, fail-fast within a check, per-request time limits,
protections, and no process left behind."""

from __future__ import annotations

import gc
import multiprocessing
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
    EVERY_SANDBOX,
    FAST,
    FILESYSTEM_SANDBOXES,
    HOSTILE,
    SANDBOXES,
    descendants,
    verdicts,
)

from conformance import Config, Runner, resolve
from conformance.inference import Declarations
from conformance.model.remedies import texts
from conformance.numerics.threads import one_thread
from conformance.subject.boundary import ImplementationError, Inputs
from conformance.subject.in_process import InProcessSubject
from conformance.worker import (
    IsolatedSubject,
    LoadError,
    SandboxUnavailable,
    WorkerError,
    WorkerStartError,
    WorkerStatus,
    warm_start,
)
from conformance.worker import sandbox as sandbox_module

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


@pytest.fixture(scope="module")
def plain_single():
    """The correct submission in the default sandbox (plain rlimits, own session, subreaper)."""
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox="none") as subject:
        yield subject


PLAIN_PROTECTIONS = {"own session", "stdin closed", "clean environment", "scratch copy",
                     "rlimit cpu", "rlimit address space", "rlimit file size", "no core dumps",
                     "no new privileges", "whole process tree killed (subreaper)"}


def test_correct_submission_gets_the_in_process_verdicts(plain_single, in_process_single):
    isolated = Runner("quick").run(plain_single, devices=["cpu"])
    assert plain_single.failures == [] and plain_single.restarts == 0
    assert verdicts(isolated) == verdicts(in_process_single)
    assert {r.status.value for r in isolated} == {"passed", "skipped"}
    assert set(plain_single.protections) >= PLAIN_PROTECTIONS
    assert not {"pid namespace", "network namespace", "host filesystem hidden",
                "read-only system", "private /tmp"} & set(plain_single.protections)
    assert plain_single.expected_failures == {} and plain_single.declaration.weight_layout
    assert plain_single._worker.forked  # by the zygote: a warm start


def _forked_in_a_child_process() -> tuple[set[int], bool]:
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox="none") as subject:
        return warm_start.zygote_pids(), subject._worker.forked


def test_a_forked_checker_gets_a_zygote_of_its_own(plain_single):
    """A checker forked after its parent has a zygote (a multiprocessing worker) starts its own
    rather than share the parent's socket; the parent's goes on forking."""
    parents = warm_start.zygote_pids()
    assert parents
    with multiprocessing.get_context("fork").Pool(1) as pool:
        childs, forked = pool.apply(_forked_in_a_child_process)
    assert forked and childs and not childs & parents
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox="none") as again:
        assert again._worker.forked and warm_start.zygote_pids() == parents


def test_a_started_worker_gets_the_verdicts_of_a_forked_one(plain_single, monkeypatch):
    """Warm start off (the zygote's fork is what the other tests get): the same verdicts and
    protections."""
    checks = ["gate", "contract", "padding", "reference", "determinism"]
    forked = Runner("quick").run(plain_single, devices=["cpu"], checks=checks)
    monkeypatch.setenv("ATTENTION_CONFORMANCE_WARM_START", "0")
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox="none") as started:
        assert not started._worker.forked
        assert verdicts(Runner("quick").run(started, devices=["cpu"], checks=checks)) == \
            verdicts(forked)
        assert set(started.protections) == set(plain_single.protections)


MISBEHAVES = """
import ctypes, os, signal, time

from conformance import Capabilities, Implementation, SeparateProjections


class Misbehaving(MultiHeadAttention):
    def forward(self, x, mask=None):
        if x.shape[0] == 1:
            ctypes.string_at(0)  # a segfault
        while x.shape[0] == 2:
            pass
        # Fatal, but to a PID namespace's init, which ignores what it has no handler for.
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        return super().forward(x, mask)


declared = Implementation(
    "misbehaves", lambda c: Misbehaving(c.d_model, c.num_heads), Capabilities(call="self"),
    SeparateProjections("q_proj", "k_proj", "v_proj", "out_proj"))
"""
FORKABLE = [sandbox for sandbox in ("none", "unshare", "landlock") if sandbox in SANDBOXES]
"""The tiers whose workers the zygote forks (bubblewrap's are always started)."""


def _misbehaviour(submission: Path, sandbox: str) -> dict:
    """What a worker on ``submission`` in ``sandbox`` is and does: its protections, whether it
    is its PID namespace's init, and how a crash, a hang and a SIGTERM to itself end."""
    with IsolatedSubject(submission, "attention.py::declared", sandbox=sandbox,
                         limits=FAST.scaled(max_restarts=3),
                         timeout=lambda op, config: 1.0 if op == "forward" else 30.0) as subject:
        seen = {"protections": set(subject.protections),
                "namespace init": subject._worker.ready.pid == 1}
        for batch, what in ((1, "crash"), (2, "hang"), (3, "sigterm")):
            subject.begin_check(what)  # a new worker for each, started the same way
            instance = subject.instantiate(CONFIG, 0)
            try:
                seen[what] = tuple(instance.forward(Inputs.self_attention(
                    torch.randn(batch, 5, 8))).shape)
            except WorkerError as error:
                ended = subject._worker.exit or {}
                seen[what] = (error.status, str(error), ended.get("code"), ended.get("signal"))
    return seen


def test_a_forked_and_a_started_worker_come_through_one_launcher_alike(tmp_path, monkeypatch):
    """Forked by the zygote or started cold (warm start off), a worker of each tier the zygote
    forks is launched by the one launcher, has the same protections (the same namespaces: the
    supervisor's code enters them either way) and ends the same way when it crashes, hangs, or
    sends itself SIGTERM (fatal to a plain worker, ignored by a PID namespace's init: the
    supervisor's own handler is not the worker's, either way)."""
    import conformance.worker.launcher as launcher

    (tmp_path / "attention.py").write_text((SINGLE / "attention.py").read_text() + MISBEHAVES)
    launched = []
    real_start = launcher.start

    def start(launch, **pipes):
        started = real_start(launch, **pipes)
        launched.append((launch.sandbox, started.forked))
        return started

    monkeypatch.setattr(launcher, "start", start)
    seen = {}
    for warm in ("1", "0"):
        monkeypatch.setenv(warm_start.SWITCH, warm)
        with ThreadPoolExecutor(len(FORKABLE)) as pool:  # the tiers' workers overlap
            seen[warm] = dict(zip(FORKABLE, pool.map(
                lambda sandbox: _misbehaviour(tmp_path, sandbox), FORKABLE), strict=True))
    # Three workers each (one loads and crashes, one hangs, one is sent SIGTERM), forked, then
    # started.
    assert sorted(launched) == sorted((sandbox, forked) for sandbox in FORKABLE
                                      for forked in (True, False) for _ in range(3))
    assert seen["1"] == seen["0"]
    for sandbox, seen_there in seen["1"].items():
        namespaces = sandbox != "none"
        assert seen_there["namespace init"] == namespaces
        assert ({"pid namespace", "network namespace", "ipc namespace"}
                <= seen_there["protections"]) == namespaces
        assert seen_there["crash"][:2] == (
            WorkerStatus.CRASHED, "the worker was killed by signal 11 (segfault) during forward")
        assert seen_there["hang"][:2] == (WorkerStatus.TIMEOUT,
                                          "forward did not return within 1 s")
        assert seen_there["sigterm"] == ((3, 5, 8) if namespaces else (
            WorkerStatus.CRASHED, "the worker was killed by signal 15 (SIGTERM) during forward",
            None, 15))


@pytest.mark.parametrize("sandbox", FILESYSTEM_SANDBOXES)
def test_correct_submission_gets_the_in_process_verdicts_in_a_filesystem_sandbox(
        sandbox, in_process_single):
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox=sandbox) as subject:
        isolated = Runner("quick").run(subject, devices=["cpu"])
        protections, output = set(subject.protections), subject.output
        forked = subject._worker.forked
    assert forked == (sandbox == "landlock")  # bubblewrap's workers are started, not forked
    assert verdicts(isolated) == verdicts(in_process_single)
    assert output == ""  # nothing it was refused made torch complain (cpuinfo, say)
    assert protections >= PLAIN_PROTECTIONS | {f"filesystem: {sandbox}", "pid namespace",
                                               "network namespace", "read-only system"}
    if os.geteuid() == 0:
        assert {"unprivileged uid", "rlimit processes"} <= protections
    if sandbox == "landlock":
        assert {"host filesystem unreadable", "writable: scratch only"} <= protections


@pytest.mark.parametrize("sandbox", EVERY_SANDBOX)
def test_the_submission_imports_what_the_worker_had_not_imported_yet(tmp_path, sandbox):
    # A root checker's worker runs as a uid of its own: the interpreter's files must stay
    # reachable (this machine's Python lives under /root, 0700), in every sandbox.
    (tmp_path / "attention.py").write_text(
        "import sys\n"
        "FRESH = [m for m in ('wave', 'xml.dom.minidom', 'email.mime.text') if m not in sys.modules]\n"
        "import wave, xml.dom.minidom, email.mime.text\n"
        "print('IMPORTED', FRESH)\n" + (SINGLE / "attention.py").read_text())
    with IsolatedSubject(tmp_path, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox=sandbox) as subject:
        output, uid = subject.output, subject._worker.ready.uid
    assert "IMPORTED ['wave', 'xml.dom.minidom', 'email.mime.text']" in output, output
    if os.geteuid() == 0:
        assert uid >= sandbox_module.FIRST_WORKER_UID


def test_grading_without_a_filesystem_sandbox_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(sandbox_module, "available", lambda: ("unshare", "none"))
    with pytest.raises(SandboxUnavailable) as refused:
        IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", sandbox="filesystem")
    assert str(refused.value) == sandbox_module.NO_FILESYSTEM_SANDBOX
    assert "install bubblewrap (apt-get install bubblewrap)" in str(refused.value)
    with pytest.raises(SandboxUnavailable, match="sandbox 'landlock' does not work"):
        IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", sandbox="landlock")
    assert sandbox_module.unsandboxed() == "unshare"


def test_a_package_over_several_files_gets_the_in_process_verdicts(monkeypatch):
    sandbox = SANDBOXES[0]  # the strongest here: bubblewrap where it works
    checks = ["gate", "contract", "padding", "head_split", "reference", "scale", "autograd"]
    spec = "mha.attention:MultiHeadAttention"
    declared = Declarations(mask="keep_int:broadcast", causal="never")
    with IsolatedSubject(PACKAGE, spec, limits=FAST, sandbox=sandbox,
                         declared=declared) as subject:
        assert subject.name == "attention:MultiHeadAttention"
        assert subject.defined_names == ("MultiHeadAttention",)
        assert any("(declared)" in note for note in texts(subject.notes))  # declarations crossed
        isolated = Runner("quick").run(subject, devices=["cpu"], checks=checks)
        protections = set(subject.protections)
    monkeypatch.syspath_prepend(str(PACKAGE))
    try:
        (impl,) = resolve(spec, declared)
        expected = Runner("quick").run(InProcessSubject(impl), devices=["cpu"], checks=checks)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] in ("mha", "helpers")]:
            del sys.modules[name]
    assert verdicts(isolated) == verdicts(expected)
    assert protections >= PLAIN_PROTECTIONS
    if sandbox == "bwrap":
        assert {"pid namespace", "network namespace", "ipc namespace", "read-only system",
                "host filesystem hidden", "private /tmp"} <= protections
        if os.geteuid() == 0:
            assert {"unprivileged uid", "rlimit processes"} <= protections


def test_two_workers_side_by_side_agree_with_one_at_a_time(plain_single, in_process_single):
    checks = ["gate", "padding", "reference", "dropout", "determinism"]
    expected = [r for r in verdicts(in_process_single) if r["check"] in checks]
    with IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", limits=FAST,
                         sandbox=SANDBOXES[0]) as other:
        runners = (Runner("quick"), Runner("quick"))
        interleaved: tuple[list, list] = ([], [])
        for name in checks:  # both workers alive, their requests interleaved check by check
            for runner, subject, out in zip(runners, (plain_single, other), interleaved,
                                            strict=True):
                out.append(runner.run_check(subject, name, "cpu"))
        assert verdicts(interleaved[0]) == expected == verdicts(interleaved[1])

        # And truly concurrent: two threads calling their own worker, same bits as one at a time.
        x = torch.randn(CONFIG.batch, CONFIG.q_len, CONFIG.d_model)
        inputs = Inputs.self_attention(x, torch.rand(2, 5) > 0.3)
        alone = plain_single.instantiate(CONFIG, 7).forward(inputs)
        outputs: dict[int, list[torch.Tensor]] = {0: [], 1: []}

        def hammer(index, subject):
            instance = subject.instantiate(CONFIG, 7)
            outputs[index] = [instance.forward(inputs) for _ in range(50)]

        threads = [threading.Thread(target=hammer, args=(i, s))
                   for i, s in enumerate((plain_single, other))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(outputs[0]) == len(outputs[1]) == 50
        assert all(torch.equal(out, alone) for out in outputs[0] + outputs[1])


def test_released_instances_ride_on_the_next_request(plain_single):
    plain_single.state()
    for _ in range(5):  # each one dropped: its release travels with the next request
        plain_single.instantiate(CONFIG, 0)
    gc.collect()
    assert len(plain_single._released) == 1
    assert plain_single.state().instances == 0 and plain_single._released == []
    kept = plain_single.instantiate(CONFIG, 0)
    assert plain_single.state().instances == 1
    assert plain_single.state().max_rss_bytes > 100 << 20  # torch is loaded
    kept.release()  # or at once
    assert plain_single.state().instances == 0
    with pytest.raises(WorkerError, match="no instance"):  # the worker's own error, as a status
        kept.read_weights()


@pytest.fixture
def submission(tmp_path):
    """A fresh submission directory to write bad files into."""
    directory = tmp_path / "submission"
    directory.mkdir()
    return directory


def test_load_failures_have_a_status_and_the_names_defined(submission, monkeypatch):
    shutil.copy(Path(__file__).parent / "fixtures" / "syntax_error.py", submission / "broken.py")
    (submission / "needs.py").write_text("import natten\n\nclass Attention:\n    pass\n")
    (submission / "forgot.py").write_text("import numpyy_not_installed\n\nclass Attention:\n    pass\n")
    (submission / "raises.py").write_text("def helper():\n    pass\n\nraise RuntimeError('no')\n")
    (submission / "plain.py").write_text("VALUE = 3\n\nclass MultiHeadAttention:\n    pass\n")
    (submission / "attention.py").write_text((SINGLE / "attention.py").read_text() + """
from conformance import Capabilities, Implementation

wrong = Implementation("wrong", lambda c: MultiHeadAttention(c.d_model, c.num_heads),
                       Capabilities(call="self", heads="two"))
""")
    cases = {
        "broken.py::Attention": (WorkerStatus.SYNTAX_ERROR, "syntax error in broken.py"),
        "needs.py::Attention": (WorkerStatus.MISSING_PACKAGE,
                                "needs package 'natten', which is not installed here"),
        "forgot.py::Attention": (WorkerStatus.IMPORT_ERROR,
                                 "numpyy_not_installed.py not submitted"),
        "raises.py::helper": (WorkerStatus.IMPORT_ERROR, "RuntimeError: no"),
        "plain.py::VALUE": (WorkerStatus.INTERFACE_MISMATCH, "not an nn.Module"),
        "attention.py::MultiHeadAttentoin": (WorkerStatus.NOT_FOUND, "has no attribute"),
        "missing.py::Attention": (WorkerStatus.NOT_FOUND, "no file missing.py in the submission"),
        "missing_package.attention:Attention": (WorkerStatus.NOT_FOUND, "No module named"),
        "attention.py::wrong": (WorkerStatus.PROTOCOL_ERROR,
                                "capabilities.heads: expected an integer, got 'two'"),
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
    # Start-up is timed too, started or forked (a fork of torch's zygote takes milliseconds
    # more than that); nothing is left behind.
    for warm, seconds in (("0", 0.05), ("1", 0.001)):
        monkeypatch.setenv("ATTENTION_CONFORMANCE_WARM_START", warm)
        with pytest.raises(WorkerStartError) as raised:  # the machine's problem, not the code's
            IsolatedSubject(submission, "attention.py::MultiHeadAttention", sandbox="none",
                            limits=FAST.scaled(start_seconds=seconds))
        assert raised.value.status is WorkerStatus.TIMEOUT
        assert str(raised.value).endswith(f"the worker did not start within {seconds:g} s")
    with pytest.raises(ValueError, match="relative, inside the submission"):
        IsolatedSubject(submission, "../other/attention.py::MultiHeadAttention")
    with pytest.raises(ValueError, match="relative, inside the submission"):
        IsolatedSubject(submission, "/etc/attention.py::MultiHeadAttention")


def test_a_crash_restarts_the_worker_for_the_next_instance_within_bounds():
    inputs = Inputs.self_attention(torch.randn(2, 5, 8))
    with IsolatedSubject(HOSTILE / "segfault", "attention.py::declared", sandbox="none",
                         limits=FAST.scaled(max_restarts=1)) as subject:
        instance = subject.instantiate(CONFIG, 0)
        first_worker = subject._worker
        with pytest.raises(WorkerError) as crashed:
            instance.forward(inputs)
        assert crashed.value.status is WorkerStatus.CRASHED and crashed.value.fatal
        assert str(crashed.value) == ("the worker was killed by signal 11 (segfault) during "
                                      "forward")
        with pytest.raises(WorkerError, match="signal 11"):  # its instances are gone with it
            instance.read_weights()
        again = subject.instantiate(CONFIG, 0)  # a fresh worker, transparently
        assert subject.restarts == 1 and subject._worker is not first_worker
        assert again.read_weights().w_q.shape == (2, 4, 8)
        with pytest.raises(WorkerError, match="signal 11"):
            again.forward(inputs)
        with pytest.raises(WorkerError) as gave_up:
            subject.instantiate(CONFIG, 0)
        assert gave_up.value.status is WorkerStatus.RESTART_LIMIT
        assert str(gave_up.value).startswith("the worker died 2 times; not started again")
        assert [e.status for _, e in subject.failures] == [
            WorkerStatus.CRASHED, WorkerStatus.CRASHED, WorkerStatus.RESTART_LIMIT]


def test_after_a_timeout_the_check_fails_fast_and_the_next_check_restarts():
    asked = []

    def policy(op, config):  # per-request limits: a later CLI scales them to the case size
        asked.append((op, config))
        return 0.5 if op == "forward" else 5.0

    with IsolatedSubject(HOSTILE / "infinite_loop", "attention.py::declared", sandbox="none",
                         limits=FAST, timeout=policy) as subject:
        inputs = Inputs.self_attention(torch.randn(2, 5, 8))
        subject.begin_check("padding")
        start = time.monotonic()
        with pytest.raises(WorkerError) as hung:
            subject.instantiate(CONFIG, 0).forward(inputs)
        assert hung.value.status is WorkerStatus.TIMEOUT
        assert str(hung.value) == "forward did not return within 0.5 s"
        assert 0.5 <= time.monotonic() - start < 2.0
        assert asked == [("build", CONFIG), ("forward", CONFIG)]
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


def test_a_construction_rides_with_the_first_request_and_keeps_its_own_error(tmp_path):
    """``instantiate`` sends the construction without waiting: a constructor's error is raised
    by the instance's first request (and by every later one, and by ``settle``), each request
    keeps its own time limit counted from the reply before it, and nothing is left behind."""
    source = (SINGLE / "attention.py").read_text().replace(
        "        super().__init__()\n",
        "        super().__init__()\n        import time\n        time.sleep(SLEEP)\n"
        "        if num_heads == 4:\n            raise ValueError('four heads refused')\n")
    source = source.replace("        b, n, _ = x.shape", "        time.sleep(SLEEP)\n"
                            "        b, n, _ = x.shape")
    (tmp_path / "attention.py").write_text("import time\nSLEEP = 0.0\n" + source + """

from conformance import Capabilities, Implementation, SeparateProjections

declared = Implementation(
    "sleeps", lambda c: MultiHeadAttention(c.d_model, c.num_heads), Capabilities(call="self"),
    SeparateProjections("q_proj", "k_proj", "v_proj", "out_proj"))
""")
    inputs = Inputs.self_attention(torch.randn(2, 5, 8))
    with IsolatedSubject(tmp_path, "attention.py::declared", limits=FAST,
                         sandbox="none") as subject:
        refused = subject.instantiate(Config(2, 5, 5, 8, 4), 0)  # returns: nothing waited for
        with pytest.raises(ImplementationError, match="constructing it raised ValueError: four "
                                                      "heads refused") as first:
            refused.forward(inputs)
        with pytest.raises(ImplementationError) as again:
            refused.read_weights()
        assert again.value is first.value
        with pytest.raises(ImplementationError):
            refused.settle()
        unused = subject.instantiate(Config(2, 5, 5, 8, 4), 0)
        unused.release()  # its construction failed: nothing to free, nothing raised
        built = subject.instantiate(CONFIG, 0)
        assert built.forward(inputs).shape == (2, 5, 8)
        assert subject.state().instances == 1 and subject.incidents == []

    # Construction and forward each take 1.5 s, sent together under a 2.5 s limit per request:
    # each within its own limit (3 s from the first request's sending).
    (tmp_path / "attention.py").write_text((tmp_path / "attention.py").read_text().replace(
        "SLEEP = 0.0", "SLEEP = 1.5"))
    with IsolatedSubject(tmp_path, "attention.py::declared", sandbox="none",
                         limits=FAST, timeout=lambda op, config: 2.5) as subject:
        start = time.monotonic()
        assert subject.instantiate(CONFIG, 0).forward(inputs).shape == (2, 5, 8)
        assert time.monotonic() - start >= 3.0 and subject.failures == []


def test_a_feature_that_hangs_at_the_gate_takes_no_other_feature_down(tmp_path):
    source = (SINGLE / "attention.py").read_text().replace(
        "        b, n, _ = x.shape", "        while x.dtype == torch.float16:\n            pass\n"
        "        b, n, _ = x.shape")
    (tmp_path / "attention.py").write_text(source + """

from conformance import (Capabilities, Dtypes, Implementation, MaskConvention, MaskKind,
                         MaskLayout, SeparateProjections)

declared = Implementation(
    "hangs-in-float16", lambda c: MultiHeadAttention(c.d_model, c.num_heads),
    Capabilities(call="self", mask=MaskConvention(MaskKind.KEEP_INT, MaskLayout.BROADCAST),
                 floats=Dtypes((torch.float32, torch.float16, torch.float64))),
    SeparateProjections("q_proj", "k_proj", "v_proj", "out_proj"))
""")
    with IsolatedSubject(tmp_path, "attention.py::declared", sandbox="none",
                         limits=FAST.scaled(request_seconds=1.0)) as subject:
        gate, low_precision, reference = Runner("quick").run(
            subject, devices=["cpu"], checks=["gate", "low_precision", "reference"])
        assert subject.restarts == 1
    assert gate.status.value == "passed"
    assert gate.observations == ["declared dtype float16: forward did not return within 1 s; "
                                 "the other checks run without it"]
    assert low_precision.status.value == "failed" and "did not return" in low_precision.reason
    assert reference.status.value == "passed"  # float64 and the mask, tried after it, work


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
        # A print breaks no promise of attention: a warning, which does not quote the print.
        assert contract.status.value == "warning" and "to stdout" in contract.reason
        assert "shape" not in contract.reason


@pytest.mark.skipif("unshare" in SANDBOXES and "bwrap" in SANDBOXES,
                    reason="every sandbox works here")
def test_an_unavailable_sandbox_is_refused_in_one_line():
    missing = "bwrap" if "bwrap" not in SANDBOXES else "unshare"
    with pytest.raises(SandboxUnavailable, match=f"sandbox '{missing}' does not work"):
        IsolatedSubject(SINGLE, "attention.py::MultiHeadAttention", sandbox=missing)


def test_an_accelerator_the_worker_cannot_reach_is_skipped_with_the_reason(monkeypatch):
    """On a machine with a device the isolated worker does not open (Apple's MPS: only the CPU
    and CUDA are admitted, see worker/gpu.py), an isolated target's verdicts there are skipped,
    saying why and what to do, never failed; its CPU verdicts are unchanged."""
    from conformance.run import isolated
    from conformance.run.isolated import Isolated
    from conformance.run.many import check_many

    monkeypatch.setattr(isolated, "available_devices", lambda: ["cpu", "mps"])
    spec = f"{SINGLE / 'attention.py'}::MultiHeadAttention"
    results = check_many([(spec, Isolated())], devices=["cpu", "mps"], checks=["gate", "padding"])
    by_device = {(r.device, r.check): r for r in results}
    assert by_device["cpu", "gate"].status.value == "passed"
    assert by_device["cpu", "padding"].status.value == "passed"
    for check in ("gate", "padding"):
        skipped = by_device["mps", check]
        assert skipped.status.value == "skipped"
        assert skipped.reason.startswith("the isolated worker can't use mps")
        assert "in process (not isolated)" in skipped.reason


def test_a_worker_that_cannot_start_is_this_machines_problem_in_one_line(monkeypatch):
    """A worker that dies before anything of the submission ran (here: its interpreter can't find
    the module it is told to run) is never the implementation's failure: the command line's
    one line (exit 2), with what the worker printed."""
    from conformance.run.isolated import BadInput, Isolated
    from conformance.run.many import check_many

    real = warm_start.suite_command
    monkeypatch.setattr(warm_start, "suite_command",
                        lambda module, *args: real("conformance.worker.no_such_module", *args))
    monkeypatch.setenv(warm_start.SWITCH, "0")  # started, not forked from a zygote
    spec = f"{SINGLE / 'attention.py'}::MultiHeadAttention"
    with pytest.raises(BadInput) as refused:
        check_many([(spec, Isolated())], devices=["cpu"], checks=["gate"])
    message = str(refused.value)
    assert "the worker process could not start here, before anything of the submission ran" \
        in message
    assert "No module named conformance.worker.no_such_module" in message


def test_a_users_own_calls_feed_the_time_limit_after_a_hang():
    """``check --isolate``'s limits learn from the calls themselves (constructions and forwards,
    pipelined or not): once a call has hung, later calls get AFTER_A_HANG times the median call
    seen, no less than the floor, instead of the configured limit."""
    from conformance.worker.local import AFTER_A_HANG_FLOOR, isolated

    subject = isolated(f"{SINGLE / 'attention.py'}::MultiHeadAttention", call_seconds=10.0)
    with subject:
        limits = subject._timeout
        instance = subject.instantiate(CONFIG, 0)
        for _ in range(3):
            instance.forward(Inputs.self_attention(torch.randn(2, 5, 8)))
        assert limits("forward", CONFIG) == 10.0
        limits.record(10.0, timed_out=True)  # as a hung call is recorded
        assert limits("forward", CONFIG) == AFTER_A_HANG_FLOOR


def test_after_a_hang_a_request_on_cuda_gets_the_compiles_seen_not_the_whole_allowance():
    """A GPU worker's request on CUDA may take the compile allowance (300 s) while nothing has
    hung; once a call has hung, COMPILE_MARGIN times the longest call that ended (a first call's
    compile among them), so that a kernel that hangs does not cost the whole allowance at every
    request of every check. The limit is the subject's to set, so it is seen without a GPU: no
    request here goes to CUDA."""
    from conformance.worker.local import COMPILE_MARGIN, CallLimits, isolated

    on_cuda = Config(batch=2, q_len=5, kv_len=5, d_model=8, num_heads=2, device="cuda")
    subject = isolated(f"{SINGLE / 'attention.py'}::MultiHeadAttention", call_seconds=10.0,
                       accelerators=True)
    with subject:
        allowance = subject.limits.compile_seconds
        assert subject.timeout("forward", on_cuda) == allowance
        subject._timeout.record(20.0, timed_out=False)  # a first call that compiled for 20 s
        assert subject.timeout("forward", on_cuda) == allowance  # nothing has hung yet
        subject._timeout.record(60.0, timed_out=True)
        assert subject.timeout("forward", on_cuda) == COMPILE_MARGIN * 20.0
        assert subject.timeout("forward", CONFIG) == 10.0  # on the CPU, no compile allowance
    hung_at_once = CallLimits(10.0)
    hung_at_once.record(10.0, timed_out=True)  # no call ended: how long a compile takes is unknown
    assert hung_at_once.compile_allowance(300.0) == 300.0
    slow = CallLimits(10.0)
    slow.record(200.0, timed_out=False)
    slow.record(10.0, timed_out=True)
    assert slow.compile_allowance(300.0) == 300.0  # never more than the whole allowance


def test_a_spec_naming_several_loads_them_all_once_and_each_other_worker_its_own(tmp_path,
                                                                                 monkeypatch):
    """Where a spec names several implementations (a model's kinds of layer, a list), the first
    worker is asked for the first (a list's are all loaded; a model's other kinds are named, not
    inferred); each other implementation gets a worker of its own that is asked to load that one
    alone, sent at once, and declares what that load says."""
    from conformance.worker import local, submission_load

    (tmp_path / "attention.py").write_text((SINGLE / "attention.py").read_text() + """

from conformance import Capabilities, Implementation, SeparateProjections

LAYOUT = SeparateProjections("q_proj", "k_proj", "v_proj", "out_proj")
declared = [Implementation(name, lambda c: MultiHeadAttention(c.d_model, c.num_heads),
                           Capabilities(call="self"), LAYOUT) for name in ("first", "second")]
""")
    asked = []
    launch = submission_load.launch
    monkeypatch.setattr(submission_load, "launch",
                        lambda *args: asked.append(args[-1]) or launch(*args))
    subjects = local.open_all(f"{tmp_path / 'attention.py'}::declared")
    try:
        assert [s.name for s in subjects] == ["first", "second"]
        assert asked == [local.IsolatedSubject.FIRST, "second"]
        assert "declaration" not in vars(subjects[1])  # its load is read where first needed
        assert subjects[1].capabilities == subjects[0].capabilities
        assert subjects[1].declaration.name == "second"
        inputs = Inputs.self_attention(torch.randn(2, 5, 8))
        for each in subjects:
            assert each.instantiate(CONFIG, 0).forward(inputs).shape == (2, 5, 8)
    finally:
        for each in subjects:
            each.close()


def test_a_kind_whose_own_worker_fails_to_load_it_is_said_as_a_first_load_is(monkeypatch):
    """A model's later kind is loaded in its own worker while the first is checked: where that
    load fails, a load problem (not inferred) is the input's one line, as the first's is, and a
    worker that crashed while loading fails that kind's gate alone, the rest blocked."""
    import conformance.run.isolated as isolated
    from conformance import Status
    from conformance.worker import local

    class NotLoaded:
        name = "model.py::model:decoder.layers.0.self_attn"

        def __init__(self, status):
            self.status = status

        def loaded(self):
            raise LoadError(self.status, "its worker says why", fatal=False)

        def close(self):
            pass

    for status, raised in ((WorkerStatus.INTERFACE_MISMATCH, True),
                           (WorkerStatus.CRASHED, False)):
        monkeypatch.setattr(local, "open_all", lambda *args, s=status, **options: [NotLoaded(s)])
        interfaces: dict = {}
        if raised:
            with pytest.raises(isolated.BadInput) as bad:
                isolated.isolated_results(Runner("quick"), "model.py::model", isolated.Isolated(),
                                          None, ["cpu"], ["gate", "padding"], interfaces)
            assert str(bad.value) == "model.py::model: its worker says why"
            continue
        results = isolated.isolated_results(Runner("quick"), "model.py::model",
                                            isolated.Isolated(), None, ["cpu"],
                                            ["gate", "padding"], interfaces)
        assert [(r.check, r.status) for r in results] == [("gate", Status.FAILED),
                                                          ("padding", Status.SKIPPED)]
        assert results[0].reason.startswith("crashed: loading it in the isolated worker")
        assert interfaces == {NotLoaded.name: ("not loaded", ())}
