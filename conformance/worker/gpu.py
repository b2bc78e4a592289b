"""What a worker that computes on the machine's NVIDIA GPU is given, and what it is still kept to.

Measured on an H100 (torch 2.11, an earlier session): CUDA could not start in a worker under its
address-space limit (the driver reserves far more address space than any limit that means
something: "out of memory") nor under its Landlock rules (the device files were not in them: "OS
call failed"). A worker whose :class:`~conformance.worker.limits.WorkerLimits` has ``accelerators`` set
gets instead:

- ``RLIMIT_DATA`` in place of ``RLIMIT_AS``: the driver's reservations are address space it never
  writes (``PROT_NONE``), which ``RLIMIT_DATA`` does not count, while every private writable
  mapping (the heap, torch's CPU tensors, thread stacks) still does; :data:`DRIVER_DATA` comes on
  top, for the driver's and CUDA libraries' own host memory;
- the NVIDIA device files (:data:`DEVICE_FILES`) readable, writable and open to ``ioctl`` (Landlock
  ABI 5's device-ioctl right), bound under bubblewrap; the driver's own ``/proc`` and ``/sys``
  entries (:data:`DRIVER_READ`) read-only; the driver's libraries are under ``/usr``, read-only
  already; still no sockets (the driver falls back without its persistence daemon's socket);
- a share of the GPU's memory (``torch.cuda.set_per_process_memory_fraction``), set when it first
  builds on a CUDA device, so that one submission can't take the whole card from the others;
- requests on a CUDA device that may compile (a Triton kernel's first call, ``torch.compile``)
  their own, longer limit (``WorkerLimits.compile_seconds``), said in the run's protections.

A worker without ``accelerators`` gets none of this: no device file, the address-space limit.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from conformance.model.spec import Config
from conformance.worker.limits import GiB, WorkerLimits

DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
                "/dev/nvidia[0-9]*", "/dev/nvidia-caps")
"""The NVIDIA driver's device files (patterns): the control device, unified memory, one per GPU,
the MIG capabilities' folder."""

DRIVER_READ = ("/proc/driver/nvidia", "/proc/devices", "/sys/bus/pci", "/sys/devices",
               "/sys/module/nvidia", "/sys/module/nvidia_uvm")
"""What the driver reads to find its GPUs (read-only): its ``/proc`` entry, the device majors,
the PCI tree."""

DRIVER_DATA = 4 * GiB
"""Private writable memory (``RLIMIT_DATA``) a GPU worker may map on top of what a CPU worker
may: the CUDA driver's and libraries' host-side state (cuBLAS, cuDNN, a context, pinned staging
buffers). Not measured on a GPU yet: a margin over the few hundred MB a context is documented to
take; the acceptance script (``benchmarks/gpu_acceptance.sh``) runs isolated CUDA workers under
it."""

PASSED_ENVIRONMENT = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
"""Variables of the checker's environment a GPU worker keeps: a grader pinned to one GPU pins
its workers to it."""


def device_files(root: str = "/") -> list[str]:
    """The NVIDIA device files present on this machine (``root``: where ``/dev`` is, for tests)."""
    found: list[str] = []
    for pattern in DEVICE_FILES:
        found += sorted(glob.glob(os.path.join(root, pattern.lstrip("/"))))
    return found


def environment(source: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The part of ``source`` a GPU worker keeps (:data:`PASSED_ENVIRONMENT`)."""
    return {name: source[name] for name in PASSED_ENVIRONMENT if name in source}


def landlock_args(devices: Sequence[str]) -> list[str]:
    """The worker's confinement arguments that admit ``devices`` and the driver's entries."""
    return ([arg for path in devices for arg in ("--landlock-device", path)]
            + [arg for path in DRIVER_READ for arg in ("--landlock-read", path)])


def bwrap_args(devices: Sequence[str]) -> list[str]:
    """bubblewrap's arguments that put ``devices`` and the driver's ``/sys`` into the sandbox
    (its ``/proc`` is the kernel's own, the driver's entry included)."""
    args: list[str] = []
    for path in devices:
        args += ["--dev-bind-try", path, path]
    return [*args, "--ro-bind-try", "/sys", "/sys"]


def data_limit(limits: WorkerLimits, worker_needs: int) -> int:
    """``RLIMIT_DATA`` of a GPU worker: what the worker needs, the implementation's memory and
    :data:`DRIVER_DATA`."""
    return worker_needs + limits.memory_bytes + DRIVER_DATA


def request_seconds(seconds: float, limits: WorkerLimits, config: Config | None,
                    allowance: float | None = None) -> float:
    """The limit of one request: ``seconds``, but no less than the compile allowance for a
    request on a CUDA device of a GPU worker (its first call may compile a kernel):
    ``limits.compile_seconds``, or ``allowance`` where the caller has seen how long this
    implementation's calls take (after a hang: ``local.CallLimits.compile_allowance``)."""
    if limits.accelerators and config is not None and config.device.startswith("cuda"):
        return max(seconds, limits.compile_seconds if allowance is None else allowance)
    return seconds


def protections(limits: WorkerLimits, devices: Sequence[str]) -> list[str]:
    """What a GPU worker's run header says about it."""
    return [f"gpu: {len(devices)} nvidia device file(s) admitted",
            f"rlimit data (not address space: the driver reserves it) + {DRIVER_DATA // GiB} GiB",
            f"gpu memory <= {limits.gpu_memory_bytes / GiB:g} GiB",
            f"requests on cuda may take {limits.compile_seconds:g} s (a kernel's compile)"]


_shared: set[str] = set()


def share_memory(device: str, memory_bytes: int) -> None:
    """In the worker: hold its CUDA allocations on ``device`` to ``memory_bytes`` (once per
    device; the first CUDA build starts the driver anyway)."""
    if not device.startswith("cuda") or device in _shared or memory_bytes <= 0:
        return
    import torch

    index = int(device.partition(":")[2] or 0)
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, memory_bytes / total), index)
    _shared.add(device)
