"""The checker's side of one worker process: start it, send requests, tell how it failed, stop it.

The supervisor (``supervisor.py``) starts the worker under the limits and owns its process tree;
``launcher.py`` starts the supervisor, forked by this process's zygote or started cold, and hands
back one handle whichever it was (this module never asks which). Requests and
replies travel on two pipes; the worker's stdout and stderr share a third, drained while waiting
for replies (the first ``WorkerLimits.output_keep`` bytes are kept, the rest counted and dropped:
printing never stops a worker); the supervisor reports on its status pipe how the worker ended.
Every wait has a deadline; a worker that misses one or sends a malformed frame is killed with its
whole tree and the call in flight raises :class:`WorkerError` with the evidence.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

import conformance.worker.codec as codec
import conformance.worker.launcher as launcher
import conformance.worker.warm_start as warm_start
from conformance.subject import in_flight
from conformance.worker.errors import WorkerError, WorkerStartError, WorkerStatus, how_it_ended
from conformance.worker.launcher import SupervisorHandle, close_quietly
from conformance.worker.limits import WorkerLimits
from conformance.worker.protocol import Ready
from conformance.worker.sandbox import Launch, SandboxKind, plan
from conformance.worker.scratch import chown_tree, copy_submission, remove_tree
from conformance.worker.wire import CheckerChannel, Closed, Deadline, Frame, ProtocolError


@dataclass(eq=False)
class Pending:
    """A request sent to a worker, its reply not read yet (``frame`` once it is)."""

    number: int
    timeout: float
    what: str
    sent: float = field(default_factory=time.monotonic)
    frame: Frame | None = None
    seconds: float | None = None
    """Once answered: how long the worker took (from the reply before it, or its sending)."""


class WorkerProcess:
    """One running worker on a scratch copy of ``submission``, or, ``in_place``, on the folder
    itself (a user's own code checked for containment only: hangs, crashes, exits; no copy, so
    the sandbox can't be bubblewrap, whose unprivileged uid would need the files chowned).

    ``request`` sends one request and returns the reply frame, or raises WorkerError (the status
    and evidence); after a fatal one, ``dead`` holds it and every later request raises it.
    """

    def __init__(self, submission: Path, *, limits: WorkerLimits, sandbox: SandboxKind = "auto",
                 in_place: bool = False) -> None:
        self.limits = limits
        self.dead: WorkerError | None = None
        self.output = bytearray()
        self.output_total = 0
        self.exit: dict[str, Any] | None = None
        self._scratch_root = Path(tempfile.mkdtemp(prefix="attention-worker-"))
        self._next_id = 0
        self._in_flight: list[Pending] = []
        self._last_reply = 0.0
        self._fds: list[int] = []
        self._supervisor: SupervisorHandle | None = None
        self.forked = False
        """Whether the worker was forked by the zygote (a warm start), not started (nothing
        else here depends on it)."""
        self._finalizer = weakref.finalize(self, WorkerProcess._cleanup, self._fds,
                                           [None], self._scratch_root)
        scratch = self._scratch_root / "submission"
        if in_place:
            scratch = Path(submission).resolve()
            if not scratch.is_dir() or sandbox == "bwrap":
                self.close()
                raise ValueError("in_place needs a folder and a sandbox other than bwrap")
        else:
            try:
                copy_submission(Path(submission), scratch, limits.submission_bytes)
            except (OSError, ValueError) as error:
                self.close()
                raise WorkerError(WorkerStatus.NOT_FOUND,
                                  f"cannot copy the submission {submission}: {error}") from None
        # Where the worker records the call under way: its writable folder, never a user's own.
        self._in_flight_file = (self._scratch_root if in_place else scratch) / in_flight.FILE_NAME
        worker_args = ["--header-limit", str(limits.header_bytes),
                       "--message-limit", str(limits.message_bytes),
                       "--output-keep", str(limits.output_keep),
                       "--in-flight", str(self._in_flight_file)]
        self.scratch = scratch
        try:
            self.launch: Launch = plan(scratch, limits, sandbox, worker_args,
                                       home=self._scratch_root if in_place else None)
            if self.launch.uid is not None:
                os.chmod(self._scratch_root, 0o755)
                chown_tree(scratch, self.launch.uid)
            self.protections = self.launch.protections
            self._start()
        except WorkerError as error:  # nothing of the submission ran: not the implementation's
            self.close()
            raise WorkerStartError(error.status, str(error), self.printed()) from None
        except BaseException:
            self.close()
            raise

    # Starting.

    def _start(self) -> None:
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        output_r, output_w = os.pipe()
        self.started = time.monotonic()
        try:
            self._supervisor, self.forked = launcher.start(
                self.launch, remove=self._scratch_root, output=output_w, request=request_r,
                reply=reply_w)
        finally:
            close_quietly(request_r, reply_w, output_w)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, WorkerProcess._cleanup,
                                           [request_w, reply_r, output_r], [self._supervisor],
                                           self._scratch_root)
        self._fds = [request_w, reply_r, output_r]
        self._output_fd = output_r
        os.set_blocking(output_r, False)
        self._status_fd = self._supervisor.stdout.fileno()
        os.set_blocking(self._status_fd, False)
        self._status_buffer = b""
        self.channel = CheckerChannel(reply_r, request_w, self.limits.header_bytes,
                                      self.limits.message_bytes, output_r, self._pump)
        deadline = self.started + self.limits.start_seconds
        started = self._status_line(deadline)
        if started is None and time.monotonic() >= deadline:
            self._fail(WorkerStatus.TIMEOUT,
                       f"the worker did not start within {self.limits.start_seconds:g} s")
        if started is None or started.get("event") != "started":
            self._fail(WorkerStatus.CRASHED, "the worker's supervisor did not start")
        self.pid = started["pid"]
        if started.get("subreaper"):
            self.protections = (*self.protections, "whole process tree killed (subreaper)")
        try:
            frame = self.channel.receive(deadline)
            self.ready: Ready = codec.decode(frame.header.get("ready"), Ready, frame.tensors,
                                             "ready")
            self.startup_seconds = time.monotonic() - self.started
            """From spawning the supervisor to the worker's first frame (torch imported)."""
        except Deadline:
            self._fail(WorkerStatus.TIMEOUT,
                       f"the worker did not start within {self.limits.start_seconds:g} s")
        except Closed:
            self._died("start-up")
        except (ProtocolError, codec.CodecError) as error:
            self._fail(WorkerStatus.PROTOCOL_ERROR, f"the worker started with a malformed frame: "
                       f"{error}")

    # Waiting.

    def _pump(self) -> None:
        """Drain printed output (keeping the first bytes)."""
        while True:
            try:
                chunk = os.read(self._output_fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        """Keep printed bytes up to ``output_keep``; count the rest, which is dropped."""
        self.output_total += len(chunk)
        room = self.limits.output_keep - len(self.output)
        if room > 0:
            self.output += chunk[:room]

    def _status_line(self, deadline: float) -> dict[str, Any] | None:
        """The supervisor's next JSON line, or None at EOF or the deadline (what the worker
        prints is pumped meanwhile)."""
        def receive(left: float) -> bytes | None:
            try:
                return os.read(self._status_fd, 4096) or None
            except BlockingIOError:
                select.select([self._status_fd], [], [], min(left, 0.05))
                self._pump()
                return b""

        found, self._status_buffer = warm_start.json_line(self._status_buffer, receive, deadline)
        return found

    # Failing.

    def _fail(self, status: WorkerStatus, message: str) -> None:
        """Kill the worker's tree, remember why, and raise."""
        self.dead = WorkerError(status, message, fatal=True)
        self.stop()
        raise self.dead

    def _died(self, what: str) -> None:
        """The reply pipe closed: read from the supervisor how the worker ended, and raise."""
        exit_line = None
        deadline = time.monotonic() + 5.0
        while exit_line is None and time.monotonic() < deadline:
            line = self._status_line(deadline)
            if line is None:
                break
            if line.get("event") == "exit":
                exit_line = line
        self.exit = exit_line
        self._fail(*how_it_ended(exit_line, bwrap=self.launch.sandbox == "bwrap",
                                 cpu_seconds=self.limits.cpu_seconds, what=what))

    # Requests.

    def submit(self, op: str, body: Any, tensors: Sequence[torch.Tensor], *, timeout: float,
               what: str, release: Sequence[int] = ()) -> Pending:
        """Send one request without waiting for its reply (:meth:`reply` reads it).

        The worker answers requests one at a time, in order, so a request sent while others
        are in flight starts when they end: its ``timeout`` counts from the reply before it.
        """
        if self.dead is not None:
            raise self.dead.again()
        self._next_id += 1
        pending = Pending(self._next_id, timeout, what)
        header = {"id": self._next_id, "op": op, "body": body, "release": list(release)}
        # The pipe drains as the worker reads: behind requests in flight, only once they end.
        ahead = sum(earlier.timeout for earlier in self._in_flight)
        deadline = min(time.monotonic() + ahead + timeout, self._lifetime_end)
        try:
            self.channel.send(header, tensors, deadline)
        except Deadline:
            self._timed_out(what, timeout, deadline)
        except Closed:
            self._died(what)
        self._in_flight.append(pending)
        return pending

    def reply(self, pending: Pending) -> Frame:
        """The reply frame to ``pending`` (``ok`` true or false), reading the replies before it
        first (kept for theirs); raises WorkerError when the worker is dead, dies, misses the
        deadline, floods or sends garbage."""
        while pending.frame is None:
            if self.dead is not None:
                raise self.dead.again()
            head = self._in_flight[0]
            # The worker starts a request when it has answered the one before.
            deadline = min(max(head.sent, self._last_reply) + head.timeout, self._lifetime_end)
            try:
                frame = self.channel.receive(deadline)
            except Deadline:
                self._timed_out(head.what, head.timeout, deadline)
            except Closed:
                self._died(head.what)
            except ProtocolError as error:
                self._fail(WorkerStatus.PROTOCOL_ERROR,
                           f"the worker sent a malformed reply to {head.what}: {error}")
            if frame.header.get("id") != head.number or not isinstance(frame.header.get("ok"),
                                                                       bool):
                self._fail(WorkerStatus.PROTOCOL_ERROR,
                           f"the worker sent a reply that does not answer {head.what}")
            self._in_flight.pop(0)
            now = time.monotonic()
            head.seconds = now - max(head.sent, self._last_reply)
            self._last_reply, head.frame = now, frame
        return pending.frame

    @property
    def _lifetime_end(self) -> float:
        return self.started + self.limits.lifetime_seconds

    def _timed_out(self, what: str, timeout: float, deadline: float) -> NoReturn:
        if deadline >= self._lifetime_end:
            self._fail(WorkerStatus.TIMEOUT, f"the worker's lifetime of "
                       f"{self.limits.lifetime_seconds:g} s ran out during {what}")
        # A forward request is the call itself (its check holds the case); any other request
        # (a load's inference, a build) says which of its calls never returned.
        call = in_flight.read(self._in_flight_file) if what != "forward" else ""
        self._fail(WorkerStatus.TIMEOUT, f"{what} did not return within {timeout:g} s"
                   + (f": {call}, never returned" if call else ""))

    # Stopping.

    def let_go(self) -> None:
        """Close this process's end of the control pipe: the worker stops once no process holds
        it (a fork of this one may still). :meth:`stop` starts here, then waits for how it ended."""
        if self._supervisor is not None and self._supervisor.stdin is not None:
            with contextlib.suppress(OSError):
                self._supervisor.stdin.close()

    def stop(self) -> None:
        """Kill the whole tree (the supervisor does it when its control pipe closes) and wait."""
        supervisor = self._supervisor
        if supervisor is None or supervisor.returncode is not None:
            return
        self.let_go()
        deadline = time.monotonic() + 10.0
        while self.exit is None:
            line = self._status_line(deadline)
            if line is None:
                break
            if line.get("event") == "exit":
                self.exit = line
        try:
            supervisor.wait(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
        except subprocess.TimeoutExpired:
            # The supervisor is stuck (it never should be): kill it and the worker's session.
            supervisor.kill()
            supervisor.wait()
            with contextlib.suppress(OSError, AttributeError):
                os.killpg(self.pid, signal.SIGKILL)
        self._drain()
        if self.dead is None:
            self.dead = WorkerError(WorkerStatus.EXITED, "the worker was stopped", fatal=True)

    def _drain(self) -> None:
        """Keep what is left in the output pipe (the tree is dead, so it ends soon)."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                if not select.select([self._output_fd], [], [], 0.05)[0]:
                    continue
                chunk = os.read(self._output_fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                return
            if not chunk:
                return
            self._take(chunk)

    def close(self) -> None:
        """Stop the worker, close the pipes, delete the scratch directory."""
        self.stop()
        self._finalizer()

    @staticmethod
    def _cleanup(fds: list[int], supervisors: list[SupervisorHandle | None],
                 scratch_root: Path) -> None:
        for supervisor in supervisors:
            if supervisor is not None and supervisor.poll() is None:
                try:
                    supervisor.stdin.close()
                    supervisor.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    supervisor.kill()
            if supervisor is not None and supervisor.stdout is not None:
                supervisor.stdout.close()
        close_quietly(*fds)
        remove_tree(scratch_root)

    def printed(self) -> str:
        """What the worker printed outside calls (import time, fd-level writes), capped."""
        if self._finalizer.alive and self._fds:
            # What it printed before its last reply is in the pipe, maybe not read yet (the
            # pipe is pumped while waiting for a reply, and the reply may come first).
            with contextlib.suppress(OSError):
                self._pump()
        text = self.output.decode("utf-8", errors="replace")
        if self.output_total > len(self.output):
            text += f"\n[... {self.output_total - len(self.output)} more bytes printed, dropped]"
        return text
