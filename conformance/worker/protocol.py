"""The requests the checker sends to the worker and what each one answers, as typed plain data.

A request frame's header is ``{"id": n, "op": name, "body": ..., "release": [instance ids]}``;
the reply's ``{"id": n, "ok": true, "body": ...}`` or ``{"id": n, "ok": false, "failure":
Failure}``. Bodies go through :mod:`conformance.worker.codec` against the types below, so the
checker accepts from the worker only values of the type it asked for. A load request names its
target in one of the forms :func:`check_spec` accepts; any other is refused before a worker starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from conformance.model.core import CoreObservation
from conformance.model.declarations import Declarations
from conformance.model.remedies import Note, Remedy
from conformance.model.spec import Capabilities, Config
from conformance.model.weights import HeadWeights
from conformance.subject.boundary import Gradients, Inputs
from conformance.worker.errors import WorkerStatus


@dataclass(frozen=True)
class Ready:
    """The worker's first frame: it started, imported torch, and dropped privileges."""

    pid: int
    uid: int
    torch: str


_FILE_SPEC = re.compile(r"^(?!/)(?!.*(^|/)\.\.(/|$))[\w./-]+\.py::[A-Za-z_]\w*$")
_MODULE_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


def check_spec(spec: str) -> None:
    """ValueError unless ``spec`` names a target a worker loads: a file inside the submission
    (``dir/file.py::Attr``, relative, no ``..``) or a module (``package.module:Attr``); anything
    else is refused before a worker starts."""
    if not (_FILE_SPEC.match(spec) or _MODULE_SPEC.match(spec)):
        raise ValueError(f"{spec!r}: give path/file.py::Attr (relative, inside the submission) "
                         "or package.module:Attr")


@dataclass(frozen=True)
class LoadRequest:
    spec: str
    """``path/file.py::Attr`` or ``package.module:Attr``, relative to the submission (a form
    :func:`check_spec` accepts)."""
    declared: Declarations | None = None
    name: str | None = None
    """The one implementation wanted, where ``spec`` names several (or the first, ``FIRST``):
    the others are not inferred (a model's other kinds of attention layer)."""


@dataclass(frozen=True)
class Declaration:
    """One implementation as the worker resolved it: what it declares, in plain data."""

    name: str
    capabilities: Capabilities
    weight_layout: str | None
    """The weight layout's one-line description (None: no weight access)."""
    notes: tuple[Note, ...] = ()
    expected_failures: dict[str, str] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class LoadReply:
    implementations: tuple[Declaration, ...]
    defined_names: tuple[str, ...]
    """Classes and functions the target module defines (from its source)."""
    others: tuple[str, ...] = ()
    """The names of the other implementations the spec names, not loaded here (asked for the
    ``FIRST``: a model's other kinds), each for a worker of its own to load."""


@dataclass(frozen=True)
class BuildRequest:
    implementation: str
    config: Config
    seed: int
    number: int
    """The instance's number, chosen by the checker (its next requests may be sent before this
    one's reply); the reply repeats it."""
    random_state: int | None = None
    """Where set (a check's first build), the worker's CPU generator is seeded with it first
    (:data:`~conformance.subject.boundary.CHECK_RANDOM_STATE`)."""


@dataclass(frozen=True)
class ForwardRequest:
    instance: int
    inputs: Inputs
    training: bool = False
    seed: int | None = None
    autograd: bool = False


@dataclass(frozen=True)
class ObserveRequest:
    """One forward with its attention core observed (Instance.observe)."""

    instance: int
    inputs: Inputs


@dataclass(frozen=True)
class GradientsRequest:
    instance: int
    inputs: Inputs
    cotangent: torch.Tensor


@dataclass(frozen=True)
class InstanceRequest:
    """read_weights, stdout, input_writes, release."""

    instance: int


@dataclass(frozen=True)
class WriteWeightsRequest:
    instance: int
    weights: HeadWeights


@dataclass(frozen=True)
class WorkerState:
    """What the worker holds: live instances, its peak resident memory and its peak address
    space (what the memory limit counts)."""

    instances: int
    max_rss_bytes: int
    peak_address_space_bytes: int


@dataclass(frozen=True)
class Failure:
    """Why a request failed in the worker.

    ``implementation``: the implementation raised or misbehaved (an ordinary
    ImplementationError, message as in-process); ``capability``: the request needed something
    undeclared (a suite bug); ``status``: a failure with a WorkerStatus.
    """

    kind: Literal["implementation", "capability", "status"]
    message: str
    status: WorkerStatus | None = None
    defined_names: tuple[str, ...] = ()
    remedy: Remedy | None = None
    """What to declare where it can't be loaded as it is (an interface inference can't settle)."""


REQUESTS: dict[str, tuple[type, Any]] = {
    "names": (LoadRequest, tuple[str, ...]),
    "load": (LoadRequest, LoadReply),
    "build": (BuildRequest, int),
    "forward": (ForwardRequest, torch.Tensor),
    "gradients": (GradientsRequest, Gradients),
    "observe": (ObserveRequest, CoreObservation),
    "read_weights": (InstanceRequest, HeadWeights),
    "write_weights": (WriteWeightsRequest, type(None)),
    "stdout": (InstanceRequest, str),
    "input_writes": (InstanceRequest, tuple[str, ...]),
    "release": (InstanceRequest, type(None)),
    "state": (type(None), WorkerState),
}
"""Every operation: (request body type, reply body type)."""
