"""``IsolatedInstance``: one implementation built in a worker, every method one request.

Its requests go through the subject that built it (:class:`Requests`, which
:class:`~conformance.worker.subject.IsolatedSubject` is): that is where failures become errors,
statuses and incidents, and where the worker's lifetime is managed.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from conformance.model.core import CoreObservation
from conformance.model.spec import Config
from conformance.model.weights import HeadWeights
from conformance.subject.boundary import (
    CapabilityError,
    Gradients,
    ImplementationError,
    Inputs,
    Instance,
)
from conformance.worker.process import Pending, WorkerProcess
from conformance.worker.protocol import (
    ForwardRequest,
    GradientsRequest,
    InstanceRequest,
    ObserveRequest,
    WriteWeightsRequest,
)


class Requests(Protocol):
    """What an instance asks of the subject that built it."""

    def submit(self, worker: WorkerProcess, op: str, request: Any,
               tensors: Sequence[torch.Tensor], config: Config | None, what: str) -> Pending:
        """Send a request without waiting for its reply."""

    def collect(self, worker: WorkerProcess, pending: Pending, op: str) -> Any:
        """The decoded reply to ``pending``, or its failure raised."""

    def release(self, worker: WorkerProcess, number: int) -> None:
        """Free instance ``number`` with the next request (from a finalizer: no request)."""


class IsolatedInstance(Instance):
    """One implementation built in a worker; every method is one request.

    Its construction is in flight until the first request (or :meth:`settle`) reads how it
    went; a construction that failed raises its error then, and on every later request."""

    def __init__(self, subject: Requests, worker: WorkerProcess, number: int,
                 config: Config, construction: Pending) -> None:
        self.config = config
        self._subject = subject
        self._worker = worker
        self._number = number
        self._construction: Pending | None = construction
        self._deferred: list[tuple[str, Pending]] = []
        """Requests whose reply carries nothing but success (writing weights), read with the
        next request's: their round trip costs no wait of its own."""
        self._broken: BaseException | None = None
        self._finalizer = weakref.finalize(self, subject.release, worker, number)

    def settle(self) -> None:
        """Wait for the construction and for the weights written since (their replies): an error
        of either is raised here."""
        if self._broken is not None:
            raise self._broken
        if self._construction is not None:
            construction, self._construction = self._construction, None
            try:
                self._subject.collect(self._worker, construction, "build")
            except (ImplementationError, CapabilityError) as error:  # WorkerError included
                self._broken = error
                raise
        while self._deferred:  # their failure is the next request's, raised before its reply
            op, pending = self._deferred.pop(0)
            self._subject.collect(self._worker, pending, op)

    def release(self) -> None:
        """Free it in the worker now (otherwise that happens with the next request after it is
        garbage collected); a construction that failed left nothing to free."""
        if self._finalizer.detach() is None or self._worker.dead is not None:
            return
        with contextlib.suppress(ImplementationError, CapabilityError):
            self.settle()
        if self._broken is None:
            self._call("release", InstanceRequest(self._number))

    def _call(self, op: str, request: Any, tensors: Sequence[torch.Tensor] = (),
              what: str | None = None) -> Any:
        if self._broken is not None:
            raise self._broken
        # Sent behind the construction (the worker answers in order): one wait for both.
        pending = self._subject.submit(self._worker, op, request, tensors, self.config,
                                       what or op)
        self.settle()
        return self._subject.collect(self._worker, pending, op)

    def forward(self, inputs: Inputs, *, training: bool = False, seed: int | None = None,
                autograd: bool = False) -> torch.Tensor:
        return self._call("forward", ForwardRequest(self._number, inputs, training, seed,
                                                    autograd))

    def gradients(self, inputs: Inputs, cotangent: torch.Tensor) -> Gradients:
        return self._call("gradients", GradientsRequest(self._number, inputs, cotangent),
                          what="forward and backward")

    def observe(self, inputs: Inputs) -> CoreObservation:
        return self._call("observe", ObserveRequest(self._number, inputs),
                          what="observing its attention core")

    def read_weights(self) -> HeadWeights:
        return self._call("read_weights", InstanceRequest(self._number), what="reading weights")

    def write_weights(self, weights: HeadWeights) -> None:
        """Sent now, its reply read with the next request's (a failure is raised there)."""
        if self._broken is not None:
            raise self._broken
        pending = self._subject.submit(self._worker, "write_weights",
                                       WriteWeightsRequest(self._number, weights), (),
                                       self.config, "writing weights")
        self._deferred.append(("write_weights", pending))

    @property
    def stdout(self) -> str:
        return self._call("stdout", InstanceRequest(self._number))

    @property
    def input_writes(self) -> list[str]:
        return list(self._call("input_writes", InstanceRequest(self._number)))
