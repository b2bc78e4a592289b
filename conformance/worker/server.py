"""The worker: the only process that imports the untrusted submission.

It confines itself (``--landlock-read``/``--landlock-write``: the ``landlock`` tier, see
``confine.py``) and drops privileges where told to, after importing torch and the suite and before
anything of the submission runs, then answers requests one at a time on fd 3 (requests) and
fd 4 (replies): ``load`` resolves the target with the suite's own ``registry.resolve`` (undeclared
classes are inferred here, running the submission's code here), ``build`` makes a
:class:`~conformance.subject.in_process.ModuleInstance`, and the instance requests call it exactly as an
in-process run would, so masks are encoded, inputs copied and prints recorded by the same code.
Whatever the submission does to this process (patching torch, replacing functions, printing,
exiting) can only change what this process answers; the checker judges the answers.
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import faulthandler
import io
import os
import re
import resource
import sys
from pathlib import Path
from typing import Any

import torch

import conformance.worker.codec as codec
import conformance.worker.confine as confine
import conformance.worker.gpu as gpu
import conformance.worker.reachable as reachable
from conformance.errors import one_line
from conformance.inference.plan import InferenceError
from conformance.loading.registry import MissingPackage, ResolveError, load_code, resolve
from conformance.model.core import CoreObservation
from conformance.model.declarations import DeclarationError
from conformance.model.remedies import Remedy, remedy_of
from conformance.model.spec import Config, Implementation
from conformance.model.target_spec import TargetForm, TargetSpec
from conformance.subject import in_flight
from conformance.subject.boundary import CapabilityError, ImplementationError
from conformance.subject.in_process import ModuleInstance
from conformance.worker.errors import WorkerStatus
from conformance.worker.pristine import Pristine
from conformance.worker.protocol import (
    REQUESTS,
    BuildRequest,
    Declaration,
    Failure,
    ForwardRequest,
    GradientsRequest,
    InstanceRequest,
    LoadReply,
    LoadRequest,
    ObserveRequest,
    Ready,
    WorkerState,
    WriteWeightsRequest,
)
from conformance.worker.wire import BlockingChannel, Closed, encode_frame

PR_SET_NO_NEW_PRIVS = 38
_DEF = re.compile(r"^(?:class|def|async\s+def)\s+([A-Za-z_]\w*)", re.MULTILINE)


class CappedText(io.TextIOBase):
    """A text sink that keeps the first ``keep`` characters and counts the rest."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep
        self.total = 0
        self._parts: list[str] = []
        self._kept = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        text = str(text)
        self.total += len(text)
        room = self.keep - self._kept
        if room > 0:
            self._parts.append(text[:room])
            self._kept += min(room, len(text))
        return len(text)

    def getvalue(self) -> str:
        return "".join(self._parts)


class WorkerInstance(ModuleInstance):
    """A ModuleInstance whose recorded prints are capped: a flood costs no memory, and printing,
    however much, never stops the worker (what is past the cap is counted and dropped)."""

    def __init__(self, implementation: Implementation, config: Config, seed: int,
                 keep: int) -> None:
        super().__init__(implementation, config, seed)
        printed = CappedText(keep)
        printed.write(self._printed.getvalue())
        self._printed = printed

    @property
    def printed_total(self) -> int:
        return self._printed.total


def defined_names(scratch: Path, spec: str) -> tuple[str, ...]:
    """Top-level classes and functions of the target module, read from its source (a file
    that does not parse is scanned line by line)."""
    target = TargetSpec.parse(spec)
    if target.file is not None:
        candidates = [scratch / target.file]
    else:
        parts = target.location.split(".")
        candidates = [scratch.joinpath(*parts).with_suffix(".py"),
                      scratch.joinpath(*parts, "__init__.py")]
    for path in candidates:
        try:
            source = path.read_text(errors="replace")
        except OSError:
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return tuple(dict.fromkeys(_DEF.findall(source)))
        return tuple(node.name for node in tree.body
                     if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
    return ()


def _load_status(error: ResolveError, spec: str) -> WorkerStatus:
    """Which load failure a ResolveError from ``registry.resolve`` is, from its cause."""
    cause = error.__cause__
    if isinstance(error, MissingPackage):
        return WorkerStatus.MISSING_PACKAGE
    if isinstance(cause, SyntaxError):
        return WorkerStatus.SYNTAX_ERROR
    target = TargetSpec.parse(spec)
    if isinstance(cause, ModuleNotFoundError) and cause.name and \
            target.form is TargetForm.MODULE and target.location.startswith(cause.name):
        return WorkerStatus.NOT_FOUND  # the named module itself is missing, not a dependency
    if isinstance(cause, (InferenceError, DeclarationError, ValueError, TypeError)):
        return WorkerStatus.INTERFACE_MISMATCH
    if cause is not None:
        return WorkerStatus.IMPORT_ERROR
    text = str(error)
    if text.startswith("no file ") or " has no attribute " in text:
        return WorkerStatus.NOT_FOUND
    return WorkerStatus.INTERFACE_MISMATCH


def _out_of_memory(error: BaseException) -> bool:
    cause = error.__cause__ if isinstance(error, ImplementationError) else error
    if isinstance(cause, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(cause, RuntimeError) and "can't allocate memory" in str(cause)


def _memory_message(what: str, error: BaseException) -> str:
    """``forward ran out of memory: it asked for 2.0 GiB more, under the worker's 3.5 GiB
    address-space limit (RuntimeError)``."""
    cause = error.__cause__ if isinstance(error, ImplementationError) and error.__cause__ else error
    asked = re.search(r"tried to allocate (\d+) bytes", str(cause))
    limit, kind = resource.getrlimit(resource.RLIMIT_AS)[0], "address-space"
    if limit == resource.RLIM_INFINITY:  # a GPU worker's is on its data (gpu.py)
        limit, kind = resource.getrlimit(resource.RLIMIT_DATA)[0], "data"
    text = f"{what} ran out of memory"
    if asked:
        text += f": it asked for {int(asked.group(1)) / 2**30:.1f} GiB more"
    if limit != resource.RLIM_INFINITY:
        text += f", under the worker's {limit / 2**30:.1f} GiB {kind} limit"
    return f"{text} ({type(cause).__name__})"


class Server:
    def __init__(self, channel: BlockingChannel, scratch: Path, output_keep: int,
                 gpu_memory_bytes: int = 0) -> None:
        self.channel = channel
        self.scratch = scratch
        self.output_keep = output_keep
        self.gpu_memory_bytes = gpu_memory_bytes
        self.implementations: dict[str, Implementation] = {}
        self.instances: dict[int, WorkerInstance] = {}
        # Before any of the submission runs: what the suite's own code here relies on.
        self.pristine = Pristine()

    # Requests.

    def names(self, request: LoadRequest) -> tuple[str, ...]:
        """The target module's classes and functions, before anything of it runs."""
        return defined_names(self.scratch, request.spec)

    def load(self, request: LoadRequest) -> LoadReply:
        names = defined_names(self.scratch, request.spec)
        if str(self.scratch) not in sys.path:
            sys.path.insert(0, str(self.scratch))
        try:
            try:
                load_code(request.spec)
            finally:
                # Inference (in resolve) compares outputs here: with torch as it was.
                self.pristine.restore()
            others: list[str] = []
            found = resolve(request.spec, request.declared, named=request.name, others=others)
        except ResolveError as error:
            raise _LoadFailure(_load_status(error, request.spec), str(error), names,
                               remedy_of(error)) from None
        except SystemExit as error:
            raise _LoadFailure(WorkerStatus.EXITED,
                               f"loading {request.spec} called sys.exit({error.code!r})",
                               names) from None
        except ImplementationError as error:
            raise _LoadFailure(WorkerStatus.INTERFACE_MISMATCH, str(error), names) from None
        declarations = []
        for impl in found:
            self.implementations[impl.name] = impl
            layout = impl.weight_layout.describe() if impl.weight_layout is not None else None
            declarations.append(Declaration(
                name=impl.name, capabilities=impl.capabilities, weight_layout=layout,
                notes=tuple(impl.notes), expected_failures=dict(impl.expected_failures),
                description=impl.description))
        reply = LoadReply(tuple(declarations), names, tuple(others))
        try:
            codec.encode(reply, [])
        except codec.CodecError as error:
            raise _LoadFailure(WorkerStatus.INTERFACE_MISMATCH,
                               f"its declaration cannot cross to the checker: {error}",
                               names) from None
        return reply

    def build(self, request: BuildRequest) -> int:
        implementation = self.implementations.get(request.implementation)
        if implementation is None:
            raise KeyError(f"no implementation {request.implementation!r} was loaded")
        if request.number in self.instances:
            raise KeyError(f"instance {request.number} exists already")
        if request.random_state is not None:
            torch.default_generator.manual_seed(request.random_state)
        gpu.share_memory(request.config.device, self.gpu_memory_bytes)
        instance = WorkerInstance(implementation, request.config, request.seed, self.output_keep)
        self.instances[request.number] = instance
        return request.number

    def _instance(self, number: int) -> WorkerInstance:
        try:
            return self.instances[number]
        except KeyError:
            raise KeyError(f"no instance {number}") from None

    def forward(self, request: ForwardRequest) -> torch.Tensor:
        instance = self._instance(request.instance)
        return instance.forward(request.inputs, training=request.training, seed=request.seed,
                                autograd=request.autograd)

    def gradients(self, request: GradientsRequest):
        instance = self._instance(request.instance)
        return instance.gradients(request.inputs, request.cotangent)

    def observe(self, request: ObserveRequest) -> CoreObservation:
        return self._instance(request.instance).observe(request.inputs)

    def read_weights(self, request: InstanceRequest):
        return self._instance(request.instance).read_weights()

    def write_weights(self, request: WriteWeightsRequest) -> None:
        self._instance(request.instance).write_weights(request.weights)

    def stdout(self, request: InstanceRequest) -> str:
        return self._instance(request.instance).stdout

    def input_writes(self, request: InstanceRequest) -> tuple[str, ...]:
        return tuple(self._instance(request.instance).input_writes)

    def release(self, request: InstanceRequest) -> None:
        self.instances.pop(request.instance, None)

    def state(self, request: None) -> WorkerState:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        peak = 0
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmPeak:"):
                    peak = int(line.split()[1]) * 1024
        return WorkerState(len(self.instances), usage.ru_maxrss * 1024, peak)

    # The loop.

    def serve(self) -> None:
        self.channel.send({"ready": codec.encode(Ready(os.getpid(), os.getuid(),
                                                        torch.__version__), [])})
        while True:
            try:
                frame = self.channel.receive()
            except Closed:
                return
            self.channel.write(self.handle(frame.header, frame.tensors))

    def handle(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> list[memoryview]:
        """The reply frame to one request (a failure reply when anything goes wrong, including
        turning the result into bytes)."""
        number = header.get("id")
        op = header.get("op")
        for released in header.get("release", ()):
            self.instances.pop(released, None)
        what = {"build": "constructing it", "load": "loading it", "names": "reading its source"
                }.get(op, op)
        try:
            if op not in REQUESTS:
                raise KeyError(f"unknown request {op!r}")
            body_type, _ = REQUESTS[op]
            body = codec.decode(header.get("body"), body_type, tensors, op)
            try:
                result = getattr(self, op)(body)
            finally:
                self.pristine.restore()  # before the reply is turned into bytes
            out: list[torch.Tensor] = []
            return encode_frame({"id": number, "ok": True, "body": codec.encode(result, out)}, out)
        except _LoadFailure as failure:
            reply = Failure("status", failure.message, failure.status, failure.names,
                            failure.remedy)
        except ImplementationError as error:
            if _out_of_memory(error):
                reply = Failure("status", _memory_message(what, error), WorkerStatus.OUT_OF_MEMORY)
            else:
                reply = Failure("implementation", str(error))
        except CapabilityError as error:
            reply = Failure("capability", str(error))
        except SystemExit as error:
            reply = Failure("status", f"{what} called sys.exit({error.code!r})",
                            WorkerStatus.EXITED)
        except MemoryError as error:
            reply = Failure("status", _memory_message(what, error), WorkerStatus.OUT_OF_MEMORY)
        except BaseException as error:
            # Anything else is this process's own code failing: perhaps because the submission
            # patched what it relies on. The checker sees a status, never a traceback object.
            reply = Failure("status", f"the worker failed during {what}: {one_line(error)}",
                            WorkerStatus.WORKER_ERROR)
        return encode_frame({"id": number, "ok": False, "failure": codec.encode(reply, [])}, [])


class _LoadFailure(Exception):
    def __init__(self, status: WorkerStatus, message: str, names: tuple[str, ...],
                 remedy: Remedy | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.names, self.remedy = status, message, names, remedy


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """Become ``uid``/``gid`` with no supplementary groups (all capabilities go with root), and
    forbid regaining privileges through setuid programs."""
    if gid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.worker")
    parser.add_argument("--request-fd", type=int, default=3)
    parser.add_argument("--reply-fd", type=int, default=4)
    parser.add_argument("--header-limit", type=int, default=4 << 20)
    parser.add_argument("--message-limit", type=int, default=512 << 20)
    parser.add_argument("--output-keep", type=int, default=1 << 20)
    parser.add_argument("--uid", type=int)
    parser.add_argument("--gid", type=int)
    parser.add_argument("--landlock-read", action="append", default=[], metavar="PATH")
    parser.add_argument("--landlock-write", action="append", default=[], metavar="PATH")
    parser.add_argument("--landlock-device", action="append", default=[], metavar="PATH")
    parser.add_argument("--gpu-memory-bytes", type=int, default=0)
    parser.add_argument("--in-flight", type=Path, metavar="PATH",
                        help="record each forward call started here (subject/in_flight.py)")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # workers share the cores with the checker and each other
    sys.stdout = open(1, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    faulthandler.enable(file=sys.stderr)  # a segfault's traceback goes to the captured output
    if args.uid is not None:
        reachable.keep_imports_reachable()  # while still root: it opens what the uid can't pass
    if args.landlock_read or args.landlock_write:
        # As root still: the rules name places only root can open (the installation under /root).
        confine.restrict(args.landlock_read, args.landlock_write, args.landlock_device)
    drop_privileges(args.uid, args.gid)
    if args.in_flight is not None:  # as the worker's own uid, before any submission runs
        in_flight.record_to(args.in_flight)
    channel = BlockingChannel(args.request_fd, args.reply_fd, args.header_limit,
                              args.message_limit)
    Server(channel, Path.cwd(), args.output_keep, args.gpu_memory_bytes).serve()
    return 0
