"""The resource limits an isolated worker runs under.

Wall-clock limits are enforced by the checker (it stops waiting and kills the worker's whole
process tree); CPU seconds, address space, file size, process count and core dumps by
``setrlimit`` in the worker before it starts. Printed output is never a reason to stop a worker:
the checker keeps the first ``output_keep`` bytes and counts and drops the rest (a debugging print
in a hot loop costs nothing but the time it takes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MiB = 1 << 20
GiB = 1 << 30

TORCH_ADDRESS_SPACE = 3 * GiB
"""Address space the worker itself needs before the implementation allocates anything.

Measured here (Linux x86-64, torch 2.13 CPU, Python 3.11, ``IsolatedSubject.state()``): the
worker maps 0.62 GB after ``import torch``, the suite and loading a submission (shared libraries,
glibc malloc arenas, thread stacks: address space, mostly never touched; 0.24 GB resident). Its
peak over the whole quick catalogue on the textbook attention is 1.12 GB (0.49 GB resident), over
the thorough one 2.3 GB (1.07 GB resident: larger generated cases). 3 GiB covers the quick
profile with a margin; ``WorkerLimits.memory_bytes`` comes on top, for the implementation and
larger cases.
"""


@dataclass(frozen=True)
class WorkerLimits:
    """Limits for one worker process (and everything it starts).

    Attributes:
        start_seconds: wall-clock for the interpreter and torch to start.
        load_seconds: wall-clock for importing the submission and inferring its interface.
        request_seconds: wall-clock for one request (build, forward, gradients, ...) unless the
            caller gives its own (see ``IsolatedSubject(timeout=...)``).
        lifetime_seconds: wall-clock for the worker's whole life; a request never waits past it.
        cpu_seconds: CPU time for the worker's whole life (``RLIMIT_CPU``).
        memory_bytes: address space for the implementation, on top of what the worker itself
            needs (:data:`TORCH_ADDRESS_SPACE`) (``RLIMIT_AS``).
        file_bytes: largest file it may write (``RLIMIT_FSIZE``).
        processes: processes and threads it may run at once (``RLIMIT_NPROC``; only enforceable
            for a worker that does not run as root).
        open_files: file descriptors (``RLIMIT_NOFILE``).
        output_keep: bytes of printed output kept for the caller (the first ones; the rest is
            counted and dropped).
        message_bytes: largest message accepted from the worker (tensors included).
        header_bytes: largest JSON header accepted from the worker.
        submission_bytes: largest submission copied into the scratch directory.
        max_restarts: how many times a dead worker is started again for one subject.
        accelerators: whether the worker may compute on the machine's NVIDIA GPU (its device
            files admitted, ``RLIMIT_DATA`` in place of ``RLIMIT_AS``: see ``gpu.py``).
        gpu_memory_bytes: GPU memory the worker may allocate on each device it uses.
        compile_seconds: the least a request on a CUDA device is allowed (a Triton kernel's or
            ``torch.compile``'s first call compiles, in seconds, and is no hang).
    """

    start_seconds: float = 60.0
    load_seconds: float = 60.0
    request_seconds: float = 30.0
    lifetime_seconds: float = 1800.0
    cpu_seconds: int = 1800
    memory_bytes: int = 4 * GiB
    file_bytes: int = 64 * MiB
    processes: int = 64
    open_files: int = 256
    output_keep: int = 1 * MiB
    message_bytes: int = 512 * MiB
    header_bytes: int = 4 * MiB
    submission_bytes: int = 64 * MiB
    max_restarts: int = 4
    accelerators: bool = False
    gpu_memory_bytes: int = 16 * GiB
    compile_seconds: float = 300.0

    def scaled(self, **changes: float | int) -> WorkerLimits:
        """A copy with some limits changed (``dataclasses.replace``)."""
        return replace(self, **changes)


Limits = WorkerLimits
"""The name :class:`WorkerLimits` was public under (``conformance.worker.Limits``), kept importable."""
