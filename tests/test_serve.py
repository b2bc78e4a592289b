"""``attention-conformance serve``: a check handed to the warm server says and exits exactly what it
says and exits run cold; what the server must not run (another installation's settings) runs
cold; Ctrl-C reaches the served check; no server, or a socket folder others may enter, means the
command runs in its own process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conformance.frontends.served as served
from conformance.frontends.serve import refusal

ROOT = Path(__file__).resolve().parents[1]
CORRECT = "tests/fixtures/user_styles.py::FusedQKV"
BROKEN_MODULE = '''
import torch
from torch import nn


class Unscaled(nn.Module):
    """Attention that forgets 1/sqrt(head_dim)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        weights = (q @ k.transpose(-2, -1)).softmax(-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, n, d))
'''
SLOW_MODULE = '''
import time
import torch
from torch import nn


class Slow(nn.Module):
    """Correct attention, a second per call."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.inner = nn.MultiheadAttention(d_model, num_heads, batch_first=True)

    def forward(self, x):
        time.sleep(1.0)
        return self.inner(x, x, x, need_weights=False)[0]
'''
CHECKS = ["--check", "gate", "--check", "padding", "--check", "scale"]


def _environment(runtime: Path, **changes: str) -> dict[str, str]:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), **changes}
    env.pop(served.SWITCH, None)
    return env


def _check(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance", "check", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _without_times(text: str) -> str:
    return re.sub(r"\d+(\.\d+)? s\b", "T s", text)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server listening in a private runtime folder of its own; its log, read when needed."""
    runtime = tmp_path_factory.mktemp("runtime")
    runtime.chmod(0o700)
    log = runtime.parent / "serve.log"
    env = _environment(runtime)
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "conformance", "serve"], cwd=ROOT,
                                   env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while "serving at" not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)
    yield env, log
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 0
    assert not list((runtime / "attention-conformance").glob("*.sock"))  # it removed its socket


def _served(log: Path, spec: str, count: int = 1) -> bool:
    """Whether the server's log says ``spec`` ended ``count`` times (it says so within a second)."""
    deadline = time.monotonic() + 10
    while log.read_text().count(f"{spec}") < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_served_check_says_and_exits_what_a_cold_one_does(server, tmp_path):
    env, log = server
    (tmp_path / "unscaled.py").write_text(BROKEN_MODULE)
    broken = f"{tmp_path / 'unscaled.py'}::Unscaled"
    for spec, code in ((CORRECT, 0), (broken, 1)):
        warm = _check(env, spec, *CHECKS)
        cold = _check({**env, served.SWITCH: "0"}, spec, *CHECKS)
        assert (warm.returncode, cold.returncode) == (code, code), warm.stderr
        assert _without_times(warm.stdout) == _without_times(cold.stdout)
        assert sorted(_without_times(warm.stderr).splitlines()) == \
            sorted(_without_times(cold.stderr).splitlines())
        assert _served(log, spec), log.read_text()
    assert f"check {broken} {' '.join(CHECKS)}: exit 1" in log.read_text()


def test_a_check_under_other_import_settings_runs_cold(server):
    env, log = server
    other = _check({**env, "ATTENTION_CONFORMANCE_WARM_START": "0"}, CORRECT, "--check", "gate")
    assert other.returncode == 0 and "OK" in other.stdout
    assert "refused: started under other settings (ATTENTION_CONFORMANCE_WARM_START)" in \
        log.read_text()


def test_ctrl_c_reaches_the_served_check(server, tmp_path):
    env, log = server
    (tmp_path / "slow.py").write_text(SLOW_MODULE)
    slow = f"{tmp_path / 'slow.py'}::Slow"
    # As a terminal's foreground command has it: a shell's background job (the tests run by a
    # script in the background, say) inherits Ctrl-C ignored, and Python then leaves it so.
    client = subprocess.Popen([sys.executable, "-m", "conformance", "check", slow], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    time.sleep(3)  # well into loading it (inference calls it: seconds)
    assert client.poll() is None and _served(log, "serving at")
    client.send_signal(signal.SIGINT)
    assert client.wait(timeout=60) == 130, client.communicate()
    assert time.monotonic() < deadline
    assert _served(log, f"check {slow}: exit 130"), log.read_text()


def _lines_after_a_ctrl_c(monkeypatch, *answers: dict) -> list[tuple[int, int]]:
    """The server's lines, with a Ctrl-C before the first; the signals the client sends."""
    pending: list = [KeyboardInterrupt(), *answers]

    def next_line(self):
        item = pending.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(served._Lines, "next", next_line)
    monkeypatch.setattr(served.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


def test_ctrl_c_before_the_server_says_whose_the_copy_is_still_reaches_it(monkeypatch):
    """A Ctrl-C while the server is starting the copy is passed on once its pid is known: the copy
    never goes on alone, printing to this terminal; where the server refused, nothing ran and
    the Ctrl-C is this command's."""
    sent = _lines_after_a_ctrl_c(monkeypatch, {"pid": 4242}, {"exit": 130})
    assert served._wait(None) == 130 and sent == [(4242, signal.SIGINT)]
    sent = _lines_after_a_ctrl_c(monkeypatch, {"refused": "started under other settings"})
    with pytest.raises(KeyboardInterrupt):
        served._wait(None)
    assert sent == []
    # A second Ctrl-C while the server still says nothing ends the wait here.
    sent = _lines_after_a_ctrl_c(monkeypatch, KeyboardInterrupt(), {"pid": 4242})
    with pytest.raises(KeyboardInterrupt):
        served._wait(None)
    assert sent == []


WARM_MODULE = '''
import sys

ALREADY = "markdown" in sys.modules  # imported ahead by the zygote this worker was forked from?
import markdown  # noqa: E402,F401
import torch
from torch import nn


class NeedsItWarm(nn.Module):
    """Correct attention that refuses to be built where its installed import was not there
    before it: the proof that the worker had it from the zygote."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        if not ALREADY:
            raise RuntimeError("markdown was not imported ahead")
        self.inner = nn.MultiheadAttention(d_model, num_heads, batch_first=True)

    def forward(self, x):
        return self.inner(x, x, x, need_weights=False)[0]
'''


def test_a_files_installed_imports_are_imported_ahead_by_the_zygote(server, tmp_path):
    """The server reads the file's imports (never runs it) and has its zygote import the
    installed ones, so every worker has them: the module sees markdown before its own import
    when served, not when run cold."""
    env, log = server
    (tmp_path / "warm.py").write_text(WARM_MODULE)
    spec = f"{tmp_path / 'warm.py'}::NeedsItWarm"
    warm = _check(env, spec, "--check", "gate")
    assert warm.returncode == 0, (warm.stdout, log.read_text())
    assert "imported ahead, for every worker: markdown" in log.read_text()
    cold = _check({**env, served.SWITCH: "0"}, spec, "--check", "gate")
    assert cold.returncode != 0 and "markdown was not imported ahead" in cold.stdout + cold.stderr


THREAD_AT_IMPORT = """import threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
"""
ANSWER_AN_IMPORT = """import json, socket, sys
sys.path.insert(0, sys.argv[1])
from conformance.worker import zygote
ours, theirs = socket.socketpair()
print(zygote._threads())
assert zygote._answer(theirs, json.dumps({"import": ["starts_a_thread", "not_there"]}).encode(),
                      [], [theirs])
print(ours.recv(4096).decode())
"""


def test_the_zygote_says_how_many_threads_it_runs_after_importing_ahead(tmp_path):
    """A package that starts a thread when imported leaves the zygote unable to fork safely: its
    answer counts the threads (and names only what imported), for the checker to stop it."""
    (tmp_path / "starts_a_thread.py").write_text(THREAD_AT_IMPORT)
    done = subprocess.run([sys.executable, "-c", ANSWER_AN_IMPORT, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, answer = done.stdout.strip().splitlines()
    assert json.loads(answer) == {"imported": ["starts_a_thread"], "threads": int(before) + 1}


def test_a_zygote_running_threads_after_importing_ahead_is_stopped_and_replaced(monkeypatch):
    """The checker's side: such a zygote is stopped and forgotten (nothing was imported ahead),
    and the next worker wanted gets a new one."""
    from conformance.worker import warm_start

    class Threaded:
        key, closed = "threaded", False

        def wait_ready(self):
            return True

        def ask(self, request, fds=(), seconds=None):
            assert request == {"import": ["markdown"]}
            return {"imported": ["markdown"], "threads": 2}

        def close(self):
            self.closed = True

    zygote = Threaded()
    monkeypatch.setattr(warm_start, "_zygotes", {zygote.key: zygote})
    monkeypatch.setattr(warm_start, "_zygote", lambda env: zygote)
    assert warm_start.preload(["markdown"]) == []
    assert zygote.closed and warm_start._zygotes == {}


def test_only_installed_packages_are_imported_ahead(tmp_path):
    from conformance.frontends.imports_ahead import installed_imports

    (tmp_path / "mine.py").write_text("x = 1\n")
    (tmp_path / "user.py").write_text("import markdown.extensions\nimport mine\nimport json\n"
                                      "from . import sibling\nfrom torch import nn\n")
    found = installed_imports(["check", "user.py::Attention", "--check", "gate"], str(tmp_path))
    assert "markdown.extensions" in found and "torch" in found
    assert not {"mine", "json", "sibling"} & set(found)  # the user's own, the stdlib, relative


def test_no_server_or_an_open_folder_means_the_command_runs_here(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv(served.SWITCH, raising=False)
    tmp_path.chmod(0o700)
    assert served.hand_over(["check", "x.py"]) is None  # no socket: not a moment lost
    folder = served.socket_path().parent
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    assert not served._private(folder)
    assert served.hand_over(["check", "x.py"]) is None  # others may enter it: never connected
    assert served.hand_over(["check", "--watch", "x.py"]) is None
    assert served.hand_over(["grade", "class"]) is None


def test_what_a_server_refuses():
    mine = {"key": served.installation_key(), "argv": ["check", "x.py"], "env": dict(os.environ)}
    assert refusal(mine) is None
    assert refusal({**mine, "key": "elsewhere"}) == "another installation's command"
    assert refusal({**mine, "argv": ["grade", "class"]}) == "'grade' is not served"
    changed = {**mine, "env": {**os.environ, "TORCH_LOGS": "+dynamo"}}
    assert refusal(changed) == "started under other settings (TORCH_LOGS)"


def test_a_server_refuses_once_the_suites_code_changed_under_it(monkeypatch):
    """Same installation, same path, other code (an upgrade in place, an edit): the server runs
    what it imported at its start, so it refuses, and the check runs cold on the code it has."""
    from conformance.frontends import serve

    mine = {"key": served.installation_key(), "argv": ["check", "x.py"], "env": dict(os.environ)}
    count, latest = serve.suite_sources()
    assert count > 100 and latest > 0
    monkeypatch.setattr(serve, "_SOURCES_AT_START", (count, latest))
    assert refusal(mine) is None
    monkeypatch.setattr(serve, "_SOURCES_AT_START", (count, latest - 1))
    assert refusal(mine) == "the suite's code changed since this server started (restart it)"


def test_the_server_finds_which_sandboxes_work_before_it_serves(monkeypatch):
    """Which sandboxes work here is three probes, each a process (70 ms), cached per process: the
    server runs them once before it listens, so its forks (every served check) inherit them."""
    from conformance.frontends import serve
    from conformance.worker import sandbox

    probes = (sandbox._bwrap, sandbox._landlock, sandbox._namespaces)
    for probe in probes:
        probe.cache_clear()
    found = []

    def listen():
        found.append([probe.cache_info().currsize for probe in probes])
        raise serve.ServeError("stopped here by the test")

    monkeypatch.setattr(serve, "_listen", listen)
    monkeypatch.setattr(serve, "_SOURCES_AT_START", None)
    assert serve.run() == 2
    assert found == [[1, 1, 1]]


def test_the_tests_commands_are_never_handed_to_a_developers_server():
    """The project's conftest turns serving off for every command a test starts (the tests of
    serving lift it for the servers they start): a developer's running ``serve`` would otherwise
    take them, and what they check of the command's own process tree would be the server's."""
    assert os.environ.get(served.SWITCH) == "0"
    assert served.hand_over(["check", "x.py"]) is None
