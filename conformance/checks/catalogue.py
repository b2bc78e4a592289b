"""The catalogue: the gate and the checks after it, in report order, as data.

:mod:`conformance.run.runner` runs them; everything that only needs their names reads
:data:`conformance.model.check_names.CHECK_NAMES`, which this module holds them to.
"""

from __future__ import annotations

from conformance.checks.invariants.alibi import Alibi
from conformance.checks.invariants.autograd import Autograd
from conformance.checks.invariants.base import Check
from conformance.checks.invariants.batch_independence import BatchIndependence
from conformance.checks.invariants.causal import Causal
from conformance.checks.invariants.chunked import Chunked
from conformance.checks.invariants.configuration import Configuration
from conformance.checks.invariants.contract import Contract
from conformance.checks.invariants.determinism import Determinism
from conformance.checks.invariants.dropout import Dropout
from conformance.checks.invariants.fully_masked import FullyMasked
from conformance.checks.invariants.gate import Gate
from conformance.checks.invariants.head_split import HeadSplit
from conformance.checks.invariants.kernel import KernelCheck
from conformance.checks.invariants.kv_cache import KVCacheDecoding
from conformance.checks.invariants.kv_groups import KVGroups
from conformance.checks.invariants.low_precision import LowPrecision
from conformance.checks.invariants.mask_formats import MaskFormats
from conformance.checks.invariants.packed import Packed
from conformance.checks.invariants.padding import Padding
from conformance.checks.invariants.path_agreement import PathAgreement
from conformance.checks.invariants.permutation import Permutation
from conformance.checks.invariants.position_shift import PositionShift
from conformance.checks.invariants.reference_agreement import ReferenceAgreement
from conformance.checks.invariants.row_stochastic import RowStochastic
from conformance.checks.invariants.scale import Scale
from conformance.checks.invariants.sliding_window import SlidingWindow
from conformance.checks.invariants.stability import Stability
from conformance.model.check_names import CHECK_NAMES

GATE = Gate()
CATALOGUE: tuple[Check, ...] = (
    Contract(), Padding(), FullyMasked(), RowStochastic(), HeadSplit(), Causal(),
    ReferenceAgreement(), Scale(), MaskFormats(), Permutation(), BatchIndependence(),
    Stability(), LowPrecision(), Dropout(), Autograd(), Determinism(), PathAgreement(),
    # The modern forms, each skipped (at no cost) by an implementation that doesn't declare it.
    KVGroups(), PositionShift(), Alibi(), SlidingWindow(), Chunked(), KVCacheDecoding(), Packed(),
    Configuration(), KernelCheck(),
)
"""The checks after the gate, in report order."""

if (GATE.name, *(c.name for c in CATALOGUE)) != CHECK_NAMES:
    raise ImportError("conformance.model.check_names.CHECK_NAMES must list the catalogue's checks, "
                      "the gate first, in order")


def by_name(name: str) -> Check:
    """The check called ``name`` (not the gate)."""
    for check in CATALOGUE:
        if check.name == name:
            return check
    raise ValueError(f"unknown check {name!r}: choose from {', '.join(CHECK_NAMES)}")
