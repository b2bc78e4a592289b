"""Run untrusted attention code in a sandboxed worker process, behind the suite's boundary.

:class:`IsolatedSubject` is a :class:`~conformance.subject.boundary.Subject` whose implementation lives in
a worker process (``python -m conformance.worker``) started on a scratch copy of a submission,
under :class:`WorkerLimits` (``Limits``, its former name, still imports), in the strongest sandbox
this machine allows (:func:`available_sandboxes`).
The catalogue runs on it unchanged and computes every verdict in the checker; the worker's
failures come back as :class:`WorkerError` with a :class:`WorkerStatus` and one line of evidence.

    from conformance import Runner
    from conformance.worker import IsolatedSubject, WorkerLimits

    with IsolatedSubject("submissions/alice", "attention.py::MultiHeadAttention",
                         expected_failures={}) as subject:
        results = Runner("quick").run(subject)
        print(subject.protections, subject.output)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Imported on first use (PEP 562): the worker's stdlib-only modules (the zygote's client, the
# launch plan) load without torch, so the CLI can start the zygote before it imports torch.
_EXPORTS = {
    "conformance.worker.codec": ("CodecError", "decode", "encode"),
    "conformance.worker.errors": ("LoadError", "WorkerError", "WorkerStartError", "WorkerStatus"),
    "conformance.worker.limits": ("TORCH_ADDRESS_SPACE", "Limits", "WorkerLimits"),
    "conformance.worker.protocol": ("Declaration",),
    "conformance.worker.sandbox": ("SandboxKind", "SandboxUnavailable"),
    "conformance.worker.instance": ("IsolatedInstance",),
    "conformance.worker.subject": ("IsolatedSubject", "TimeoutPolicy"),
}

__all__ = [
    "TORCH_ADDRESS_SPACE",
    "CodecError",
    "Declaration",
    "IsolatedInstance",
    "IsolatedSubject",
    "Limits",
    "LoadError",
    "SandboxKind",
    "SandboxUnavailable",
    "TimeoutPolicy",
    "WorkerError",
    "WorkerLimits",
    "WorkerStartError",
    "WorkerStatus",
    "available_sandboxes",
    "decode",
    "encode",
]


def __getattr__(name: str) -> object:
    from conformance._exports import export

    return export("conformance.worker", globals(), name, _EXPORTS,
                  renamed={"available_sandboxes": ("conformance.worker.sandbox", "available")})


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from conformance.worker.codec import CodecError, decode, encode
    from conformance.worker.errors import LoadError, WorkerError, WorkerStartError, WorkerStatus
    from conformance.worker.instance import IsolatedInstance
    from conformance.worker.limits import TORCH_ADDRESS_SPACE, Limits, WorkerLimits
    from conformance.worker.protocol import Declaration
    from conformance.worker.sandbox import SandboxKind, SandboxUnavailable
    from conformance.worker.sandbox import available as available_sandboxes
    from conformance.worker.subject import IsolatedSubject, TimeoutPolicy
