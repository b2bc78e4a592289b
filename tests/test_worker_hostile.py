"""The hostile collection (tests/fixtures/hostile): each submission gets the right status, the
verdicts its real behaviour earns where it has a working class, and changes nothing else: not
the checker's torch, not files outside its scratch copy, not the network, no process survives."""

from __future__ import annotations

import ast
import contextlib
import gc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from worker_support import (
    EVERY_SANDBOX,
    FAST,
    FILESYSTEM_SANDBOXES,
    HOSTILE,
    NETWORK_SANDBOXES,
    SANDBOXES,
    descendants,
    lay_out,
    needs_bwrap,
    needs_landlock,
    needs_unshare,
    processes_with,
    snapshot,
    verdicts,
    wait_until,
)

import conformance
from conformance import Config, Runner, resolve
from conformance.inference import Declarations
from conformance.model.results import Status
from conformance.numerics.threads import one_thread
from conformance.subject.boundary import Inputs
from conformance.subject.in_process import InProcessSubject
from conformance.worker import IsolatedSubject, LoadError, WorkerError, WorkerStatus
from conformance.worker import sandbox as sandbox_module

DECLARED = Declarations(call="self", mask="keep_int:broadcast", causal="never",
                        width_arg="d_model", heads_arg="num_heads",
                        weights="q_proj,k_proj,v_proj,out_proj")
"""Everything declared: interface inference would run the hostile forward at load time."""
CONFIG = Config(batch=2, q_len=5, kv_len=5, d_model=8, num_heads=2)


@pytest.fixture(scope="module", autouse=True)
def nothing_survives():
    before = set(descendants())
    with one_thread():
        yield
    gc.collect()
    left = [pid for pid in descendants() if pid not in before]
    assert left == [], f"processes left behind: {left}"


def gate(directory, spec, sandbox="none", limits=FAST, checks=("gate", "contract")):
    """Load, run a few checks, close; (results, subject)."""
    with IsolatedSubject(directory, spec, limits=limits, sandbox=sandbox) as subject:
        results = Runner("quick").run(subject, devices=["cpu"], checks=list(checks))
    return results, subject


GATED = {
    "sys_exit": ("sys_exit_in_forward", "attention.py::declared", "none", FAST),
    "loop": ("infinite_loop", "attention.py::declared", "none", FAST.scaled(request_seconds=1.0)),
    **{f"cpu-{sandbox}": ("infinite_loop", "attention.py::declared", sandbox,
                          FAST.scaled(cpu_seconds=3, request_seconds=60))
       for sandbox in ("none", "unshare") if sandbox in SANDBOXES},
    "sleep": ("sleep_in_init", "attention.py::declared", "none",
              FAST.scaled(request_seconds=1.0)),
    "lifetime": ("sleep_in_init", "attention.py::declared", "none",
                 FAST.scaled(request_seconds=60, lifetime_seconds=6)),
    **{f"segfault-{sandbox}": ("segfault", "attention.py::declared", sandbox, FAST)
       for sandbox in ("none", "bwrap", "landlock") if sandbox in SANDBOXES},
    "flood": ("print_flood", "flood_forward.py::declared", "none", FAST),
    "garbage": ("forged_reply", "attention.py::garbage", "none", FAST),
    "forged": ("forged_reply", "attention.py::forged", "none", FAST),
}
"""Submissions whose hostility shows at the gate: (directory, spec, sandbox, limits)."""

LOADED = {
    "exit": ("exit_at_import", "attention.py::MultiHeadAttention", FAST),
    "sys_exit": ("sys_exit_in_forward", "attention.py::ExitingAttention", FAST),
    "loop": ("infinite_loop", "attention.py::LoopingAttention", FAST.scaled(load_seconds=1.5)),
}
"""Submissions whose hostility shows while loading (undeclared: inference runs forward)."""


@pytest.fixture(scope="module")
def gated():
    """Every GATED submission's gate and contract verdicts and its subject, run three at a time
    (the workers' start-ups and time limits overlap: the module takes a third of the time)."""
    def run(key):
        name, spec, sandbox, limits = GATED[key]
        start = time.monotonic()
        results, subject = gate(HOSTILE / name, spec, sandbox, limits)
        return results, subject, time.monotonic() - start

    with ThreadPoolExecutor(3) as pool:
        return dict(zip(GATED, pool.map(run, GATED), strict=True))


@pytest.fixture(scope="module")
def load_errors():
    def load(key):
        name, spec, limits = LOADED[key]
        start = time.monotonic()
        try:
            IsolatedSubject(HOSTILE / name, spec, limits=limits, sandbox="none").close()
        except LoadError as error:
            return error, time.monotonic() - start
        return None, time.monotonic() - start

    with ThreadPoolExecutor(3) as pool:
        return dict(zip(LOADED, pool.map(load, LOADED), strict=True))


def test_exit_at_import_is_exited_with_names(load_errors):
    error, _ = load_errors["exit"]
    assert error.status is WorkerStatus.EXITED
    assert "the worker exited with status 0 during load" in str(error)
    assert error.defined_names == ("MultiHeadAttention",)


def test_sys_exit_in_forward(gated, load_errors):
    error, _ = load_errors["sys_exit"]  # inference calls forward while loading
    assert error.status is WorkerStatus.EXITED
    assert str(error) == "loading attention.py::ExitingAttention called sys.exit(3)"
    (gate_result, contract), subject, _ = gated["sys_exit"]
    assert gate_result.status.value == "failed"
    assert gate_result.reason == "basic call (float32, no mask): forward called sys.exit(3)"
    assert contract.status.value == "skipped" and subject.restarts == 0


def test_infinite_loop_times_out_once(gated, load_errors):
    results, subject, seconds = gated["loop"]
    assert results[0].reason == "basic call (float32, no mask): forward did not return within 1 s"
    assert [(check, e.status) for check, e in subject.failures] == [("gate", WorkerStatus.TIMEOUT)]
    assert seconds < 15  # one time limit, not one per example
    error, _ = load_errors["loop"]  # undeclared: inference hangs at load time
    assert error.status is WorkerStatus.TIMEOUT
    assert "load did not return within 1.5 s" in str(error)


@pytest.mark.parametrize("sandbox", ["none", pytest.param("unshare", marks=needs_unshare)])
def test_infinite_loop_uses_up_its_cpu_seconds(gated, sandbox):
    # Starting (importing torch) takes about 1 CPU second of the 3; the loop burns the rest. The
    # worker gets SIGXCPU; under unshare (a PID namespace's init ignores it) the hard limit's
    # SIGKILL; under bubblewrap SIGXCPU, reported as 128 + 24 (as a segfault is, below).
    results, subject, _ = gated[f"cpu-{sandbox}"]
    assert results[0].reason == ("basic call (float32, no mask): the worker used up its 3 CPU "
                                 "seconds during forward")
    assert subject.failures[0][1].status is WorkerStatus.CPU_LIMIT


def test_sleep_in_init_times_out_and_the_lifetime_ends(gated):
    results, subject, _ = gated["sleep"]
    assert results[0].reason == ("basic call (float32, no mask): constructing it did not return "
                                 "within 1 s")
    assert subject.failures[0][1].status is WorkerStatus.TIMEOUT
    results, subject, _ = gated["lifetime"]
    assert results[0].reason == ("basic call (float32, no mask): the worker's lifetime of 6 s ran "
                                 "out during constructing it")
    assert subject.failures[0][1].status is WorkerStatus.TIMEOUT


def test_memory_hog_runs_out_of_memory_under_the_limit():
    with IsolatedSubject(HOSTILE / "memory_hog", "attention.py::declared", limits=FAST,
                         sandbox="none") as subject:
        (result,) = Runner("quick").run(subject, devices=["cpu"], checks=["gate"])
        instance = subject.instantiate(CONFIG, 0)
        with pytest.raises(WorkerError) as raised:
            instance.forward(Inputs.self_attention(torch.randn(2, 5, 8)))
        assert raised.value.status is WorkerStatus.OUT_OF_MEMORY and not raised.value.fatal
        assert instance.read_weights().w_q.shape == (2, 4, 8)  # the worker lives on
    # 1 GiB succeeded, 2 GiB did not: the limit (3 GiB for the worker + 0.5 GiB) stopped it, not
    # this machine (24 GiB, and the tensors are never written).
    assert result.reason == (
        "basic call (float32, no mask): forward ran out of memory: it asked for 2.0 GiB more, "
        "under the worker's 3.5 GiB address-space limit (RuntimeError)")


def test_monkeypatching_torch_in_the_worker_changes_no_verdict():
    allclose, equal, sub = torch.allclose, torch.equal, torch.Tensor.__sub__
    with IsolatedSubject(HOSTILE / "monkeypatch", "attention.py::MultiHeadAttention",
                         limits=FAST, sandbox="none") as subject:
        isolated = Runner("quick").run(subject, devices=["cpu"])
    assert (torch.allclose, torch.equal, torch.Tensor.__sub__) == (allclose, equal, sub)
    assert not torch.allclose(torch.zeros(1), torch.ones(1))
    # The same class, imported here without the patches.
    (impl,) = resolve(f"{HOSTILE / 'monkeypatch' / 'model.py'}::MultiHeadAttention")
    expected = Runner("quick").run(InProcessSubject(impl), devices=["cpu"])
    assert verdicts_without_name(isolated) == verdicts_without_name(expected)
    failed = {r.check for r in isolated if r.status.value == "failed"}
    assert {"scale", "reference"} <= failed  # divides by sqrt(d_model): caught all the same


def verdicts_without_name(results):
    rows = verdicts(results)
    for row in rows:
        row.pop("implementation")
    return rows


def test_a_lying_tensor_subclass_gets_the_verdicts_of_its_numbers():
    checks = ["gate", "padding", "fully_masked", "row_stochastic", "head_split", "reference"]
    with IsolatedSubject(HOSTILE / "tensor_subclass", "attention.py::MultiHeadAttention",
                         declared=DECLARED, limits=FAST, sandbox="none") as subject:
        isolated = Runner("quick").run(subject, devices=["cpu"], checks=checks)
    path = HOSTILE / "tensor_subclass" / "attention.py"
    (honest,) = resolve(f"{path}::DoubledAttention", DECLARED)
    expected = Runner("quick").run(InProcessSubject(honest), devices=["cpu"], checks=checks)
    assert verdicts_without_name(isolated) == verdicts_without_name(expected)
    assert {r.check for r in isolated if r.status.value == "failed"} == {
        "fully_masked", "row_stochastic", "head_split", "reference"}
    # In-process, the subclass's comparisons lie and some of those failures disappear: this is
    # what the isolation buys.
    (lying,) = resolve(f"{path}::MultiHeadAttention", DECLARED)
    fooled = Runner("quick").run(InProcessSubject(lying), devices=["cpu"], checks=checks)
    assert {r.check for r in fooled if r.status.value == "failed"} < {
        r.check for r in isolated if r.status.value == "failed"}


def _stat(path: str) -> tuple[int, int] | None:
    with contextlib.suppress(OSError):
        info = os.stat(path)
        return info.st_ino, info.st_mtime_ns
    return None


@pytest.mark.parametrize("sandbox", ["none", *FILESYSTEM_SANDBOXES])
def test_fake_result_files_stay_in_the_scratch_copy(tmp_path, sandbox):
    submission = lay_out(tmp_path, "writes_files", "correct_single")
    # Its "../../result.json" from the scratch copy (TMPDIR/attention-worker-*/submission).
    fakes = ["/tmp/attention_result_fake.json", os.path.join(tempfile.gettempdir(), "result.json")]
    had = {fake: _stat(fake) for fake in fakes}
    before = snapshot(tmp_path)
    tmp_before = set(os.listdir("/tmp"))
    with IsolatedSubject(submission, "attention.py::MultiHeadAttention", sandbox=sandbox,
                         limits=FAST.scaled(file_bytes=1 << 20)) as subject:
        (result,) = Runner("quick").run(subject, devices=["cpu"], checks=["gate"])
        scratch = subject._worker.scratch
        assert (scratch / "result.json").exists()  # it wrote into its own copy
        environment = subject.output
    assert result.status.value == "passed"  # planting files is no attention bug
    (line,) = [line for line in environment.splitlines() if line.startswith("ENV ")]
    names = set(ast.literal_eval(line.removeprefix("ENV ")))
    # Scrubbed: nothing of the checker's (bubblewrap adds PWD; LD_LIBRARY_PATH passes if set).
    assert {"HOME", "PATH", "TMPDIR", "LANG", "OMP_NUM_THREADS"} <= names <= {
        "HOME", "LANG", "LC_ALL", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
        "PATH", "TMPDIR", "PWD", "LD_LIBRARY_PATH"}
    assert "STDIN b''" in environment  # stdin is closed (/dev/null)
    assert "BIG refused: File too large" in environment  # 2 MiB against a 1 MiB file limit
    assert snapshot(tmp_path) == before  # its directory, the parent, the siblings, the rubric
    assert not scratch.exists()  # the scratch copy is gone
    after = {fake: _stat(fake) for fake in fakes}
    for fake in fakes:  # without a filesystem sandbox nothing stops a write to /tmp: documented
        if had[fake] is None and after[fake] is not None:
            os.unlink(fake)
    if sandbox != "none":  # bwrap: its /tmp was private; landlock: /tmp is not writable
        assert after == had
        assert not [n for n in set(os.listdir("/tmp")) - tmp_before if "result" in n]


@pytest.fixture
def autograder():
    """``/autograder/results`` as Gradescope has it (made here when absent, then removed)."""
    made = not os.path.exists("/autograder") and os.geteuid() == 0
    if made:
        os.makedirs("/autograder/results")
    try:
        yield Path("/autograder")
    finally:
        if made:
            shutil.rmtree("/autograder")


@pytest.mark.parametrize("sandbox", FILESYSTEM_SANDBOXES)
def test_nothing_outside_is_readable_or_writable_and_no_read_hangs(tmp_path, sandbox, autograder):
    submission = lay_out(tmp_path, "reads_secrets", "correct_single")
    # The rubric beside the submissions, a sibling (where it was and in the repository), secrets
    # of the host, and /proc/kmsg: an open that blocks a root reader until the kernel logs.
    targets = [tmp_path / "rubric.toml", tmp_path / "submissions" / "correct_single" /
               "attention.py", HOSTILE / "correct_single" / "attention.py", "/root/.bashrc",
               "/etc/shadow", "/proc/kmsg"]
    if sandbox == "landlock":  # bubblewrap's /proc shows its own uid's keys: none
        targets += ["/proc/keys", "/proc/1/environ"]
    (submission / "targets.txt").write_text("\n".join(str(t) for t in targets))
    marker = uuid.uuid4().hex
    package = Path(conformance.__file__).parent
    writes = [package / f"planted-{marker}.txt", Path(torch.__file__).parent / f"planted-{marker}",
              tmp_path / f"planted-{marker}", f"/planted-{marker}", f"/tmp/planted-{marker}",
              autograder / "results" / f"results-{marker}.json", f"../planted-{marker}"]
    (submission / "writes.txt").write_text("\n".join(str(w) for w in writes))
    limits = FAST.scaled(load_seconds=30)
    start = time.monotonic()
    with IsolatedSubject(submission, "attention.py::MultiHeadAttention", limits=limits,
                         sandbox=sandbox) as subject:
        loading = time.monotonic() - start - subject._worker.startup_seconds
        output, scratch = subject.output, subject._worker.scratch
    leaked = [str(write) for write in writes if os.path.isabs(write) and os.path.exists(write)]
    for path in leaked:  # (only if the sandbox failed)
        os.unlink(path)
    assert leaked == []
    assert loading < limits.load_seconds / 3, output  # every read failed at once
    assert "RUBRIC-SECRET-4711" not in output and "READ " not in output
    for target in targets:
        assert f"DENIED {target}: PermissionError" in output or \
            f"DENIED {target}: FileNotFoundError" in output, (target, output)
    installation = writes[:2]  # the suite's package and torch's: read-only wherever they live
    for write in writes:
        # Under bubblewrap, /tmp (tmp_path too) is a tmpfs of its own: writable, and thrown away
        # (but for an installation under /tmp: a checkout cloned there is bound read-only).
        private = (sandbox == "bwrap" and str(write).startswith("/tmp/")
                   and write not in installation)
        assert f"{'WROTE' if private else 'UNWRITABLE'} {write}" in output, output
    assert "correct_single" not in output.replace(str(targets[1]), "").replace(
        str(targets[2]), "")  # no listing shows the sibling
    # The folder above its copy holds only the copy, in both tiers (the same grade for a
    # submission that lists "..").
    assert f"LIST {scratch.parent}: ['submission']" in output


@pytest.mark.parametrize("sandbox", EVERY_SANDBOX)
def test_detached_and_forked_processes_do_not_survive(tmp_path, sandbox):
    submission = lay_out(tmp_path, "detached_process")
    marker = f"attention-worker-test-{uuid.uuid4().hex}"
    (submission / "marker.txt").write_text(marker)
    subject = IsolatedSubject(submission, "attention.py::MultiHeadAttention", limits=FAST,
                              sandbox=sandbox)
    try:
        assert wait_until(lambda: len(processes_with(marker)) == 9), processes_with(marker)
        daemon_sessions = {os.getsid(pid) for pid in processes_with(marker)}
        assert len(daemon_sessions) > 1  # some escaped the worker's session
    finally:
        subject.close()
    assert wait_until(lambda: processes_with(marker) == [], 2.0), processes_with(marker)


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="a worker of its own uid needs a root checker")
def test_the_fan_out_meets_the_process_limit(tmp_path):
    submission = lay_out(tmp_path, "detached_process")
    marker = f"attention-worker-test-{uuid.uuid4().hex}"
    (submission / "marker.txt").write_text(marker)
    with pytest.raises(LoadError) as raised:  # the worker's own tasks, the daemon, then no more
        IsolatedSubject(submission, "attention.py::MultiHeadAttention", sandbox="bwrap",
                        limits=FAST.scaled(processes=6))
    assert raised.value.status is WorkerStatus.IMPORT_ERROR
    assert str(raised.value) == ("importing attention.py raised BlockingIOError: [Errno 11] "
                                 "Resource temporarily unavailable")
    assert wait_until(lambda: processes_with(marker) == [], 2.0)


@pytest.mark.parametrize("sandbox", ["none", *FILESYSTEM_SANDBOXES])
def test_a_checker_killed_outright_takes_the_whole_tree_with_it(tmp_path, sandbox):
    """Started (bubblewrap) or forked by the zygote (the others), the worker's tree goes when
    the checker is killed without running any cleanup code."""
    submission = lay_out(tmp_path, "detached_process")
    marker = f"attention-worker-test-{uuid.uuid4().hex}"
    (submission / "marker.txt").write_text(marker)
    checker = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from conformance.worker import IsolatedSubject\n"
         "subject = IsolatedSubject(sys.argv[1], 'attention.py::MultiHeadAttention', "
         "sandbox=sys.argv[2])\n"
         "print(subject._worker.scratch, flush=True)\n"
         "time.sleep(120)\n", str(submission), sandbox],
        stdout=subprocess.PIPE, text=True)
    try:
        scratch = Path(checker.stdout.readline().strip())
        assert scratch.is_dir() and wait_until(lambda: len(processes_with(marker)) == 9), \
            processes_with(marker)
    finally:
        checker.kill()  # no cleanup code runs: the supervisor sees its control pipe close
        checker.wait()
        checker.stdout.close()
    assert wait_until(lambda: processes_with(marker) == [], 5.0), processes_with(marker)
    # The supervisor (its command line holds the scratch path) is gone, and the scratch copy.
    assert wait_until(lambda: processes_with(str(scratch)) == [] and not scratch.exists(), 5.0)


@pytest.mark.parametrize("sandbox, namespaces", [
    *(pytest.param(param.values[0], True, marks=param.marks, id=param.values[0])
      for param in NETWORK_SANDBOXES),
    pytest.param("landlock", False, marks=needs_landlock, id="landlock-without-namespaces")])
def test_a_loopback_connection_is_refused(tmp_path, sandbox, namespaces, monkeypatch):
    if not namespaces:  # as where no namespace can be made: Landlock and seccomp alone
        monkeypatch.setattr(sandbox_module, "_namespaces", lambda: frozenset())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    accepted = []

    def accept():
        with contextlib.suppress(OSError):  # the timeout: nobody connected
            accepted.append(listener.accept())

    submission = lay_out(tmp_path, "loopback_socket")
    (submission / "port.txt").write_text(str(listener.getsockname()[1]))
    try:
        thread = threading.Thread(target=accept)
        thread.start()
        with IsolatedSubject(submission, "attention.py::MultiHeadAttention", limits=FAST,
                             sandbox=sandbox) as subject:
            output = subject.output
            protections = subject.protections
        thread.join()
    finally:
        listener.close()
    assert accepted == [] and "NO CONNECTION" in output and "CONNECTED" not in output
    assert ("network namespace" in protections) == namespaces


@pytest.mark.parametrize("sandbox", ["none", *FILESYSTEM_SANDBOXES])
def test_segfault_is_crashed_with_the_signal(gated, sandbox):
    results, subject, _ = gated[f"segfault-{sandbox}"]
    assert results[0].reason == ("basic call (float32, no mask): the worker was killed by signal "
                                 "11 (segfault) during forward")
    assert subject.failures[0][1].status is WorkerStatus.CRASHED
    assert "Fatal Python error: Segmentation fault" in subject.output  # faulthandler's trace


def test_print_floods_are_dropped_past_the_cap_and_never_stop_the_worker(gated):
    """50 MB of prints (in forward, and straight to fd 1 while importing) cost no points: the
    first bytes are kept for the teacher, the rest is counted and dropped, the checks go on."""
    (gate_result, contract), _, _ = gated["flood"]
    assert gate_result.status is Status.PASSED
    assert contract.status is Status.WARNED
    assert contract.reason.startswith("forward printed ") and "xxx" not in contract.reason
    start = time.monotonic()
    with IsolatedSubject(HOSTILE / "print_flood", "flood_import.py::MultiHeadAttention",
                         limits=FAST.scaled(output_keep=1000), sandbox="none") as subject:
        assert subject.name  # loaded, inferred and checkable
        kept, _, note = subject.output.partition("\n[... ")
    assert time.monotonic() - start < 60
    assert kept == "y" * 1000 and note == f"{50 * 2**20 - 1000} more bytes printed, dropped]"


@pytest.mark.parametrize("key, evidence", [
    ("garbage", "malformed reply to forward: not a frame (starts with b'PASS')"),
    ("forged", "a reply that does not answer forward"),
])
def test_forged_replies_are_protocol_errors(gated, key, evidence):
    results, subject, _ = gated[key]
    assert results[0].status.value == "failed" and results[0].reason.endswith(evidence)
    assert subject.failures[0][1].status is WorkerStatus.PROTOCOL_ERROR
