"""The gate: the basic call, checked first so a broken one is reported once.

Property: the implementation constructs for a small configuration, and its forward returns a
tensor of shape (batch, q_len, d_model) in the input's dtype and on its device (first declared
dtype, no mask, q_len == kv_len, batch == length too).

The gate also tries every declared feature once (each dtype, with and without the mask;
kv_len != q_len; optional causality; weight access). A feature that breaks is dropped for the
other checks and reported once, by the check that owns it: ``contract`` for the declared
conventions, ``low_precision`` for float16 / bfloat16. And it measures the precision float64
runs really compute at (:mod:`conformance.checks.precision`), which sets the tolerances they are
judged with.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from conformance.checks.invariants.base import CheckContext
from conformance.checks.invariants.verify import (
    expect_finite_rows,
    expect_output,
    reference_applies,
)
from conformance.checks.invariants.violation import Violation
from conformance.checks.precision import Precision, classify, reference_gap, rounding_noise
from conformance.generation.base_case import base_case
from conformance.generation.cases import Case, dtype_name, own_queries
from conformance.generation.constraints import Constraint, discover
from conformance.generation.strategies import fixed_features
from conformance.model.spec import Capabilities
from conformance.subject.boundary import ImplementationError
from conformance.subject.output_shape import output_problem

LOW_PRECISION = (torch.float16, torch.bfloat16)

GAP_LENGTH = 33
"""Length of the longer case the gap to the reference is measured on: where a position table
is built in float32, its rounding grows with the position, and generated lengths reach 33."""


@dataclass
class GateOutcome:
    """What the gate found.

    ``blocking``: why the basic call fails (every other check is then skipped).
    ``broken``: declared features that failed, ``{feature: problem}``; features are "mask",
    "cross_attention", "causal", "weights" and dtype names.
    ``effective``: the capabilities the other checks may rely on.
    """

    effective: Capabilities
    blocking: str | None = None
    hint: str | None = None
    """The likely bug the basic call's failure shows (a recognisable malformed output)."""
    broken: dict[str, str] = field(default_factory=dict)
    precision: Precision | None = None
    """What float64 runs compute at, where float64 is declared and works."""
    constraint: Constraint | None = None
    """The configurations its constructor accepts, where it rejects some (found here)."""
    shortest: tuple[int, str] | None = None
    """Where the basic call raises at one token (cuDNN's SDPA refuses a single key) and runs
    at a longer length: (the shortest length it runs at, why the shorter one failed); the other
    checks' cases are that long or longer."""
    backward_here: bool = False
    """A kernel probed forward only (on the CPU, where inference runs) whose backward runs on
    this device (FlexAttention has none on a CPU and one on CUDA): the gradient checks run."""
    refused: dict[str, str] = field(default_factory=dict)
    """Dtypes nobody declared whose basic call (or, where the first dtype takes the mask, whose
    masked call) raises where another's runs: ``{dtype: why}``; the other checks run without
    them."""

    @property
    def blocked(self) -> bool:
        return self.blocking is not None


class CallProblem(NamedTuple):
    """Why one call did not give attention's output: the words; what the output looks like,
    where it is a recognisable malformed one; whether the call raised (the implementation
    refused it) rather than returning something wrong."""

    words: str
    looks_like: str | None
    raised: bool


def call_problem(context: CheckContext, case: Case, *,
                 finite: bool = False) -> CallProblem | None:
    """Build and call once; None where that works, else the problem (a malformed output, the
    per-head output or the weights, named as such: see
    :mod:`conformance.subject.output_shape`). ``finite``: some row with a key to attend to must
    be finite: an output with none is nothing any check could read (one with NaN in some rows
    only, a causal mask that hides a row's own key, is the checks' to diagnose)."""
    try:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        output = instance.forward(inputs)
        expect_output(output, case, inputs)
        if finite:
            rows = context.rows(case)
            if not bool(torch.isfinite(output.detach()).all(-1).cpu()[rows].any()):
                expect_finite_rows(output, rows)
    except ImplementationError as error:
        return CallProblem(str(error), None, raised=True)
    except Violation as violation:
        return CallProblem(str(violation), violation.hint, raised=False)
    return None


def try_call(context: CheckContext, case: Case) -> str | None:
    """Build and call once; the problem in words, or None."""
    problem = call_problem(context, case)
    return None if problem is None else problem.words


def _weights_problem(context: CheckContext, case: Case) -> str | None:
    try:
        instance = context.build(case)
        weights = instance.read_weights()
        expected = (case.num_heads, case.head_dim, case.d_model)
        expected_kv = (case.config.kv_heads, case.head_dim, case.d_model)
        if tuple(weights.w_q.shape) != expected or tuple(weights.w_k.shape) != expected_kv:
            return (f"weights read as w_q {tuple(weights.w_q.shape)}, w_k "
                    f"{tuple(weights.w_k.shape)}, expected (heads, head_dim, d_in) = {expected} "
                    f"and {expected_kv}")
        inputs = case.inputs(context.capabilities.call)
        before = instance.forward(inputs)
        instance.write_weights(weights)
        after = instance.forward(inputs)
        if not torch.allclose(before, after, rtol=0.0, atol=0.0, equal_nan=True):
            return "writing the weights it read back changed the output"
    except ImplementationError as error:
        return str(error)
    return None


class Gate:
    """Constructs; the basic forward returns the right shape, dtype and device."""

    name = "gate"
    applies = "every implementation, first: its failure blocks the other checks"
    title = "constructs; the basic forward returns the right shape, dtype and device"

    def evaluate(self, context: CheckContext) -> GateOutcome:
        caps = context.capabilities
        device = context.device
        outcome = GateOutcome(effective=caps)
        outcome.refused = self._refused(context)
        if outcome.refused:
            caps = replace(caps, floats=replace(caps.floats, supported=tuple(
                d for d in caps.floats.supported if dtype_name(d) not in outcome.refused)))
            outcome.effective = caps
            context = replace(context, capabilities=caps)
        first, *others = caps.floats.supported
        if caps.shapes is None:
            try:
                outcome.constraint = discover(
                    lambda h, d: self._builds(context, h, d), heads=caps.heads)
            except ImplementationError as error:
                outcome.blocking = f"basic call ({dtype_name(first)}, no mask): {error}"
                return outcome
            except ValueError:
                # No generated configuration runs: the basic call's own failure says why.
                problem = try_call(context, base_case(caps, first, device))
                outcome.blocking = (f"basic call ({dtype_name(first)}, no mask): {problem}" if
                                    problem else "no generated configuration builds (1 to 8 "
                                    "heads, head_dim 1 to 16)")
                return outcome
            if outcome.constraint is not None:
                caps = replace(caps, shapes=outcome.constraint.pairs)
                outcome.effective = caps
                context = replace(context, capabilities=caps)
        if caps.length is None and caps.min_len is None:
            outcome.shortest = self._shortest(context, first)
            if outcome.shortest is not None:
                caps = replace(caps, min_len=outcome.shortest[0])
                outcome.effective = caps
                context = replace(context, capabilities=caps)
        if caps.forward_only and self._backward_runs(context, base_case(caps, first, device)):
            outcome.backward_here = True
            caps = replace(caps, forward_only=False)
            outcome.effective = caps
            context = replace(context, capabilities=caps)
        found = call_problem(context, base_case(caps, first, device), finite=True)
        if found is None:
            found = call_problem(context, base_case(caps, first, device, batch=3, q_len=3,
                                                    kv_len=3), finite=True)
        if found is not None:
            outcome.hint = found.looks_like
            outcome.blocking = f"basic call ({dtype_name(first)}, no mask): {found.words}"
            return outcome

        broken = outcome.broken
        if caps.mask is not None:
            problem = try_call(context, base_case(caps, first, device, kept=(3, 5)))
            if problem is not None:
                broken["mask"] = f"declared mask ({caps.mask.describe()}): {problem}"
        kept_dtypes = [first]
        for dtype in others:
            problem = try_call(context, base_case(caps, dtype, device))
            if problem is None and caps.mask is not None and "mask" not in broken:
                masked = call_problem(context, base_case(caps, dtype, device, kept=(3, 5)))
                if masked is not None and masked.raised and dtype in caps.floats.probed:
                    # Nobody declared it, and it raises only with the mask the first dtype
                    # takes (GPT-2's upcast path adds a float32 mask): a refusal, said.
                    outcome.refused[dtype_name(dtype)] = f"with a mask: {masked.words}"
                    continue
                problem = None if masked is None else masked.words
            if problem is None:
                kept_dtypes.append(dtype)
            else:
                origin = "assumed" if dtype in caps.floats.assumed else "declared"
                broken[dtype_name(dtype)] = f"{origin} dtype {dtype_name(dtype)}: {problem}"
        if caps.cross_attention:
            problem = try_call(context, base_case(caps, first, device, kv_len=3))
            if problem is not None:
                broken["cross_attention"] = (
                    f"declared cross-attention (kv_len 3 != q_len 5): {problem}")
        if caps.causality.kind == "optional":
            problem = try_call(context, base_case(caps, first, device, causal=True))
            if problem is not None:
                broken["causal"] = f"declared {caps.causality.argument}=True: {problem}"
        if caps.weights:
            problem = _weights_problem(context, base_case(caps, first, device))
            if problem is not None:
                broken["weights"] = f"declared weight access: {problem}"

        outcome.effective = replace(
            caps, floats=replace(caps.floats, supported=tuple(kept_dtypes)),
            mask=None if "mask" in broken else caps.mask,
            cross_attention=caps.cross_attention and "cross_attention" not in broken,
            causality=replace(caps.causality, kind="never") if "causal" in broken else caps.causality,
            weights=caps.weights and "weights" not in broken)
        if torch.float64 in kept_dtypes:
            outcome.precision = self._precision(context, outcome.effective)
        return outcome

    @staticmethod
    def _refused(context: CheckContext) -> dict[str, str]:
        """The probed dtypes (nobody declared them) whose basic call raises where another
        dtype's runs: ``{dtype: why}``, the dtypes it refuses. Where none runs, none is refused:
        the basic call's failure is then the gate's. A call that returns (the wrong dtype, a
        wrong shape) is no refusal: the implementation accepted those inputs."""
        caps = context.capabilities
        if not caps.floats.probed:
            return {}
        problems = {dtype: call_problem(context, base_case(caps, dtype, context.device))
                    for dtype in caps.floats.supported if dtype in caps.floats.probed}
        refused = {dtype_name(dtype): problem.words for dtype, problem in problems.items()
                   if problem is not None and problem.raised}
        if len(refused) == len(problems):
            return {}
        return refused

    @staticmethod
    def _backward_runs(context: CheckContext, case: Case) -> bool:
        """Whether one backward pass runs on this device and reaches the inputs (a kernel
        probed forward only may have a backward here); any failure says no."""
        try:
            instance = context.build(case)
            inputs = case.inputs(context.capabilities.call)
            shape = (case.batch, case.q_len, case.d_model)
            gradients = instance.gradients(inputs, case.tensor(*shape, stream=71))
        except (ImplementationError, Violation):
            return False
        return any(bool(g.detach().abs().sum() > 0) for g in gradients.inputs.values())

    @staticmethod
    def _shortest(context: CheckContext, dtype: torch.dtype) -> tuple[int, str] | None:
        """Where the basic call raises at one token and runs at some length up to the basic
        call's own: (that length, why one token failed). None where one token returns anything
        (a wrong output is the checks' to judge, not a refusal), hangs or crashes (no refusal
        either), or no length up to the basic call's runs (the basic call then says why)."""
        caps = context.capabilities
        one = base_case(caps, dtype, context.device, q_len=1, kv_len=1)
        try:
            context.build(one).forward(one.inputs(caps.call))
            return None
        except ImplementationError as error:
            if error.fatal:  # a hang or a crash is no refusal: the checks report it
                return None
            words = str(error)
        for length in range(2, caps.length_near(5) + 1):
            longer = call_problem(context, base_case(caps, dtype, context.device, q_len=length,
                                                     kv_len=length))
            if longer is None:
                return length, words
            if not longer.raised:
                return None
        return None

    @staticmethod
    def _builds(context: CheckContext, heads: int, head_dim: int) -> bool:
        """Whether ``heads`` heads of ``head_dim`` construct, run once, and read their weights
        in the declared layout with the right shapes (a layout that changes form at some head
        count limits the configurations as much as a constructor that refuses them)."""
        caps = context.capabilities
        length = caps.length_near(3)
        case = own_queries(Case(batch=2, q_len=length, kv_len=length, num_heads=heads,
                                head_dim=head_dim,
                                dtype=dtype_name(caps.floats.supported[0]), device=context.device,
                                **fixed_features(caps)), caps)
        try:
            instance = context.subject.instantiate(case.config, 0)
            inputs = case.inputs(caps.call)
            output = instance.forward(inputs)
            problem = output_problem(output, tuple(inputs.query.shape), heads=heads)
            if problem is not None and problem.looks_like is not None:
                return True  # a malformed output, not a limit: the basic call reports it
            if tuple(output.shape[:2]) != tuple(inputs.query.shape[:2]):
                return False
            if caps.weights:
                weights = instance.read_weights()
                if tuple(weights.w_q.shape[:2]) != (heads, head_dim):
                    return False
        except ImplementationError as error:
            if error.fatal:  # a hang or a crash is no constraint on the shapes: stop looking
                raise
            return False
        return True

    @staticmethod
    def _precision(context: CheckContext, caps: Capabilities) -> Precision | None:
        """The largest rounding noise of float64 calls (two seeds, with the mask where one is
        declared) and, where the reference applies, their largest gap to it (on a longer case
        too: a position table's rounding grows with the position), classified; None when the
        calls fail (the checks report that)."""
        noises, gaps = [], []
        compared = reference_applies(caps)
        causal = caps.causality.kind == "always"  # the case says what the implementation does
        for seed in (0, 1):
            for kept in ((None, (3, 5)) if caps.mask is not None else (None,)):
                case = base_case(caps, torch.float64, context.device, seed=seed, kept=kept,
                                 causal=causal)
                try:
                    instance = context.build(case)
                    inputs = case.inputs(caps.call)
                    noises.append(rounding_noise(instance, inputs, case))
                    if compared:
                        gaps.append(Gate._gap(context, instance, inputs, case))
                except ImplementationError:
                    return None
        if compared:
            length = caps.length_near(GAP_LENGTH)
            case = base_case(caps, torch.float64, context.device, seed=2, q_len=length,
                             kv_len=length, causal=causal)
            try:
                gaps.append(Gate._gap(context, context.build(case), case.inputs(caps.call), case))
            except ImplementationError:
                return None
        return classify(max(noises), caps.float32_parts, max(gaps) if gaps else None)

    @staticmethod
    def _gap(context: CheckContext, instance, inputs, case: Case) -> float:
        output = instance.forward(inputs)
        return reference_gap(output, instance.read_weights(), inputs, case, context.rows(case),
                             context.capabilities.position.encoding)
