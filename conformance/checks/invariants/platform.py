"""Findings the platform's own kernel explains: a NaN row carried into its neighbour by a
half-precision matmul with a known defect on this machine (see
:mod:`conformance.numerics.platform_defects`) is a warning about the platform, never a failure of
the implementation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from conformance.checks.invariants.base import CheckContext
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.numerics.platform_defects import PLATFORM_NOTE, matmul_spreads_nan
from conformance.subject.boundary import ImplementationError


def platform_or(context: CheckContext, case: Case, violation: Violation,
                recheck: Callable[[Case], object]) -> Violation:
    """``violation`` as a warning when the platform's own kernel explains it, else unchanged.

    It does when the case runs in a half-precision dtype whose matmul, on this machine,
    carries a NaN row into its neighbour (see :mod:`conformance.numerics.platform_defects`),
    the output had a NaN to carry, and ``recheck`` (the same property) passes on the same case in
    float32.
    """
    if violation.summary.startswith(PLATFORM_NOTE):
        return violation  # already said (a check that rechecks through this again)
    dtype = case.config.dtype
    if (dtype not in (torch.float16, torch.bfloat16)
            or not matmul_spreads_nan(dtype, torch.device(case.device).type)
            or torch.float32 not in context.capabilities.floats.supported):
        return violation
    try:
        output = context.build(case).forward(case.inputs(context.capabilities.call))
        if not bool(torch.isnan(output).any()):
            return violation  # no NaN for the kernel to carry: not its doing
        recheck(replace(case, dtype="float32"))
    except (Violation, ImplementationError):
        return violation
    return Violation(
        f"{PLATFORM_NOTE}, in {case.dtype} only: {violation.summary}; the same case in "
        "float32 is clean", details=violation.details, severity="warn",
        hint=f"NaN rows (fully masked rows under the nan policy, or a bug's NaN) reach other "
             f"rows through torch's {case.dtype} matmul, which on this CPU carries a NaN row "
             f"into its neighbour (a kernel defect); finite outputs avoid it")
