"""The boundary between the invariants and an implementation under test.

The invariants see only :class:`Subject` (what an implementation declares, and a way to build it)
and :class:`Instance` (one built implementation: run it forward, take input gradients, read and
write its projections in the canonical form). Everything that crosses is a tensor or plain data,
so an implementation can run in this process
(:class:`~conformance.subject.in_process.InProcessSubject`) or, for untrusted code, behind the same
interface in another process.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

import torch

from conformance.errors import ConformanceError
from conformance.model.core import CoreObservation
from conformance.model.mask_forms import MaskConvention
from conformance.model.spec import Capabilities, Config
from conformance.model.weights import HeadWeights

NOT_A_TENSOR = "not a tensor"
NOT_A_PLAIN_TENSOR = "not a plain tensor"
"""How a forward that returned something other than one tensor (a tuple; with ``returns =
"tensor"`` declared, a Tensor subclass) is described: the grading front-end recognises a declared
interface broken by it."""


class ImplementationError(ConformanceError):
    """The implementation raised, or returned something that is not a tensor."""

    fatal: bool = False
    """The implementation's process ended or was killed (a hang, a crash): not something the
    call's arguments explain (an isolated subject's errors set it)."""


class CapabilityError(ConformanceError):
    """A check asked for something the implementation does not declare (a suite bug)."""


@dataclass(frozen=True)
class Inputs:
    """One call's inputs: ``query`` (B, Lq, D), ``key``/``value`` (B, Lk, D), ``keep`` (B, Lk).

    For self-attention ``query``, ``key`` and ``value`` are the same tensor ``x``. Everything
    here is a tensor or plain data; the modern forms are asked for the same way: ``position``
    (token positions, through the declared position argument), ``cache`` (continue the
    instance's KV cache) and ``segments`` (packed sequences).
    """

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    keep: torch.Tensor | None = None
    causal: bool = False
    mask_convention: MaskConvention | None = None
    """Encode ``keep`` in this declared alternative format instead of the primary one."""
    options: tuple[tuple[str, object], ...] = ()
    """Extra keyword arguments for forward (a declared path such as ``need_weights=True``)."""
    position: int = 0
    """The first query token's position: passed through the declared position argument (the
    tokens are at ``position .. position + Lq - 1``); for a cached call, the number of tokens
    the cache already holds."""
    cache: bool = False
    """Run through the declared KV cache: at ``position`` 0 a fresh cache (prefill), otherwise
    the cache this instance's earlier cached calls filled, which holds exactly ``position``
    tokens. The cache stays beside the implementation; only this flag crosses."""
    segments: tuple[int, ...] | None = None
    """Packed variable-length sequences: the tokens of each batch element are sequences of
    these lengths (summing to Lq), passed in the declared packed form (cu_seqlens, or a
    block-diagonal mask)."""

    @classmethod
    def self_attention(cls, x: torch.Tensor, keep: torch.Tensor | None = None,
                       causal: bool = False) -> Inputs:
        return cls(query=x, key=x, value=x, keep=keep, causal=causal)

    @property
    def is_self(self) -> bool:
        return self.query is self.key and self.key is self.value

    @property
    def shares_kv(self) -> bool:
        """Keys and values from one tensor, queries from another (the ``cross`` call)."""
        return self.key is self.value and self.query is not self.key

    def with_mask(self, keep: torch.Tensor | None) -> Inputs:
        return replace(self, keep=keep)

    def with_tensors(self, query: torch.Tensor, key: torch.Tensor | None = None,
                     value: torch.Tensor | None = None) -> Inputs:
        """The same call with other tensors (self-attention: one tensor ``query``; keys and
        values from one tensor: ``key``, which stays the values' too)."""
        if self.is_self:
            return replace(self, query=query, key=query, value=query)
        if self.shares_kv:
            return replace(self, query=query, key=key, value=key)
        return replace(self, query=query, key=key, value=value)


@dataclass(frozen=True)
class Gradients:
    """What one backward pass gave: the output, and the gradient of ``sum(output * cotangent)``
    with respect to each input (``"x"`` for self-attention, ``"query"`` and ``"key"`` (the
    context) for cross-attention, ``"key"`` alone for queries of the module's own, else
    ``"query"``, ``"key"``, ``"value"``; zeros where the
    output does not depend on it) and each parameter (``None`` where autograd gave none)."""

    output: torch.Tensor
    inputs: dict[str, torch.Tensor]
    parameters: dict[str, torch.Tensor | None]
    unused: tuple[str, ...] = ()
    """Parameters without a gradient whose submodule the forward never called and that no
    projection of the weight layout holds (a wrapped layer's feed-forward weights, say): no
    detachment, they are just not part of it."""


class Instance(ABC):
    """One implementation built for one :class:`Config`."""

    config: Config

    def settle(self) -> None:  # noqa: B027 (built already unless a subject says otherwise)
        """Wait until it is built: a constructor's error is raised here at the latest. A subject
        may send the construction ahead without waiting for it (an isolated one does); its
        error is then raised by the instance's first call, or here."""

    @abstractmethod
    def forward(self, inputs: Inputs, *, training: bool = False, seed: int | None = None,
                autograd: bool = False) -> torch.Tensor:
        """The implementation's output for ``inputs``, detached.

        ``training`` selects train mode (dropout active); ``seed`` fixes its randomness;
        ``autograd`` runs with autograd enabled instead of under ``torch.no_grad()`` (some
        implementations take another code path then).
        """

    @abstractmethod
    def gradients(self, inputs: Inputs, cotangent: torch.Tensor) -> Gradients:
        """One backward pass of ``sum(output * cotangent)`` in eval mode."""

    def observe(self, inputs: Inputs) -> CoreObservation:
        """One eval-mode forward of ``inputs`` with its attention core observed: what each
        softmax attention (or SDPA call) inside was given and computed (see
        :mod:`conformance.model.core`), and the output."""
        raise CapabilityError(f"{type(self).__name__} can't observe a forward's core")

    @abstractmethod
    def read_weights(self) -> HeadWeights:
        """Current projections in the canonical per-head form."""

    @abstractmethod
    def write_weights(self, weights: HeadWeights) -> None:
        """Replace the projections with ``weights`` (canonical form)."""

    @property
    @abstractmethod
    def stdout(self) -> str:
        """Everything the implementation printed so far."""

    @property
    @abstractmethod
    def input_writes(self) -> list[str]:
        """Inputs the implementation modified in place so far ("query", "key", "value", "x").

        The implementation works on copies, so such writes never reach the caller's tensors.
        """


CHECK_RANDOM_STATE = 0
"""The seed torch's CPU generator takes as each check begins, where the implementation runs: a
forward that draws without a seed of its own (dropout left on in eval mode) then draws the same
whichever checks ran before, in whichever process (one check alone, or shared out over forks);
instances are built and seeded forwards run under seeds of their own."""


class Subject(ABC):
    """An implementation under test as the invariants see it."""

    name: str
    capabilities: Capabilities
    expected_failures: Mapping[str, str]
    expected_warnings: Mapping[str, str] = MappingProxyType({})
    """Checks known to warn; under ``strict`` they are expected failures."""
    notes: tuple = ()
    """What inference said of it (empty where everything was declared)."""

    @abstractmethod
    def instantiate(self, config: Config, seed: int) -> Instance:
        """Build the implementation for ``config``; ``seed`` fixes its parameter initialisation.
        A constructor's error is raised here or by the instance's first call (see
        :meth:`Instance.settle`)."""

    @abstractmethod
    def describe(self) -> str:
        """One line: what it declares, for report headers."""

    def begin_check(self, name: str) -> None:
        """Called by the Runner before each check (and the gate) runs: the random state of the
        process that calls the implementation starts afresh (see :data:`CHECK_RANDOM_STATE`); a
        subject behind a process boundary also uses it to fail fast within a check after a
        fatal failure."""
        torch.default_generator.manual_seed(CHECK_RANDOM_STATE)

    def twin(self) -> Subject | None:
        """A subject answering as this one does, for a process forked from this one to run some
        of the checks in (:mod:`conformance.run.shared`); None where there is none (the checks
        then run here, one after another). Its own state starts afresh: nothing a check does
        through one is seen through the other."""
        return None

    def ready(self) -> bool:
        """Whether this twin can answer (called in the forked process, before its first check):
        a twin whose implementation declared otherwise when loaded again is not."""
        return True

    def let_go(self) -> None:  # noqa: B027 (nothing to let go unless a subject says so)
        """Nothing more is asked of it in this process: a fork took this twin (``run.shared``),
        or its run ended and it is closed next. What answers for it may begin to stop now (when
        the fork ends, for a twin), so that stops overlap; :meth:`close` still waits for it."""

    def close(self) -> None:  # noqa: B027 (nothing to stop unless a subject says otherwise)
        """Stop what answers for it (a worker process)."""
