"""Effective precision: the precision a float64 run of an implementation really computes at.

Implementations that compute part of attention in float32 whatever the input dtype (the
HuggingFace pattern ``softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)``, used across
Llama, Mistral, Qwen, ...) are correct, but their float64 results carry float32-level error.
This is measured, never assumed, and without a reference (so it works whether or not the
weights are accessible): along a random input direction v, with ``D(h) = f(x + hv) - 2 f(x) +
f(x - hv)``, a smooth computation gives ``D(h) = h^2 v'Hv + O(h^4)``, so ``(D(2h) - 4 D(h)) / 3``
cancels the curvature and leaves only rounding: about 1e-16 |f| for a float64 computation, about
1e-7 |f| where float32 rounding enters. The two are nine orders of magnitude apart.

A part computed once at a lower precision and then cast (RoPE tables built in float32 as
buffers, ALiBi slopes in bfloat16) adds no noise that varies with the input: it is a constant
rounding, and it shows only as a gap to the float64 reference, where the weights are known. That
gap is measured too (:func:`reference_gap`): a float64 run that agrees with the reference to
1e-11 relative, far above float64's rounding and far below anything a bug in attention gives,
computes part of attention at a lower precision, and is judged with float32 tolerances.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conformance.generation.cases import Case
from conformance.model.forms import PositionEncoding
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import reference_attention
from conformance.numerics.tolerance import (
    FLOAT64_AGREEMENT,
    FLOORS,
    abs_error,
    magnitude,
    only_rows,
)
from conformance.subject.boundary import Inputs, Instance

STEP = 1e-5
"""Relative step along the direction: the curvature term it leaves after cancellation
(~STEP^4) is far below float64 rounding, while float32 rounding changes between the calls."""

FLOAT64_NOISE = 1e-11
"""Relative rounding noise above which a float64 run is not computed in float64 throughout
(float64 rounding gives ~1e-16, float32 rounding ~1e-7: this is the geometric middle)."""

FLOAT32_NOISE = 1e-4
"""Relative rounding noise up to which float32 arithmetic explains it; more is not float32's."""

FLOAT64_GAP = FLOAT64_AGREEMENT
"""Relative gap to the float64 reference above which a float64 run is not float64 throughout."""

FLOAT32_GAP = FLOORS[torch.float32]
"""Relative gap up to which lower-precision parts explain it: float32's own floor. A larger gap
would fail float32 runs too: it is no precision's, and the checks report it as the error it is."""


@dataclass(frozen=True)
class Precision:
    """What a float64 run computes at: ``judged_as`` (float64, or float32), and the measured
    relative rounding ``noise`` of its output."""

    judged_as: torch.dtype
    noise: float
    parts: tuple[str, ...] = ()
    """The torch functions seen producing float32 tensors inside a float64 forward, where the
    noise alone did not show them (a constant table, RoPE's cos/sin, adds no noise that varies
    with the input)."""
    gap: float | None = None
    """The largest relative gap of float64 runs to the float64 reference, where measured (the
    weights are known)."""

    def describe(self) -> str:
        if self.judged_as != torch.float64 and not self.parts and self.noise <= FLOAT64_NOISE:
            return (f"float64 runs agree with the float64 reference to {self.gap:.1e} relative "
                    f"(float64 arithmetic gives about 1e-15, and its rounding noise here is "
                    f"{self.noise:.1e}): a part is computed once at a lower precision and cast "
                    "(position tables or slopes built in float32, say); float64 runs are "
                    "judged with float32 tolerances, the backward check included")
        if self.parts:
            return (f"computes part of attention in float32 for float64 inputs (observed: "
                    f"{', '.join(self.parts[:4])} produce float32 tensors inside a float64 "
                    "forward); float64 runs are judged with float32 tolerances, the backward "
                    "check included")
        if self.judged_as == torch.float64:
            if self.noise > FLOAT32_NOISE:
                return (f"float64 output carries rounding noise {self.noise:.1e} relative, more "
                        "than float32 arithmetic explains: judged with float64 tolerances")
            return (f"float64 runs compute in float64 (measured rounding noise "
                    f"{self.noise:.1e} relative)")
        return (f"computes part of attention in float32 for float64 inputs (measured: its float64 "
                f"output carries rounding noise {self.noise:.1e} relative, float32's level); "
                "float64 runs are judged with float32 tolerances, the backward check included")


def _along(inputs: Inputs, direction: dict[str, torch.Tensor], t: float) -> Inputs:
    if inputs.is_self:
        return inputs.with_tensors(inputs.query + t * direction["query"])
    return inputs.with_tensors(*(getattr(inputs, name) + t * direction[name]
                                 for name in ("query", "key", "value")))


def rounding_noise(instance: Instance, inputs: Inputs, case: Case) -> float:
    """The output's relative rounding noise at ``inputs``: max |(D(2h) - 4 D(h)) / 3| / |f|
    over the rows with a key to attend to."""
    names = ("query",) if inputs.is_self else ("query", "key", "value")
    direction = {name: case.tensor(*getattr(inputs, name).shape, stream=131 + i)
                 for i, name in enumerate(names)}
    scale = max(float(getattr(inputs, name).abs().max()) for name in names)
    step = STEP * max(scale, 1.0)
    values = {t: instance.forward(_along(inputs, direction, t * step)).to(torch.float64).cpu()
              for t in (-2, -1, 0, 1, 2)}
    second = {k: values[k] - 2 * values[0] + values[-k] for k in (1, 2)}
    residual = ((second[2] - 4 * second[1]) / 3).abs()
    rows = case.attendable_rows()
    residual = torch.where(rows[:, :, None], torch.nan_to_num(residual, nan=0.0), 0.0)
    return float(residual.max()) / magnitude(values[0][rows])


def reference_gap(output: torch.Tensor, weights: HeadWeights, inputs: Inputs, case: Case,
                  rows: torch.Tensor, encoding: PositionEncoding | None) -> float:
    """max |output - reference| / max(1, |reference|) over ``rows`` (B, Lq): the relative gap of
    a float64 output to the float64 reference from its own weights."""
    expected = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                   keep=inputs.keep, causal=case.causal, window=case.window, chunk=case.chunk,
                                   encoding=encoding, start=inputs.position).output
    error = only_rows(abs_error(output, expected), rows)
    return float(error.max()) / magnitude(only_rows(expected.detach().cpu(), rows))


def classify(noise: float, parts: tuple[str, ...] = (), gap: float | None = None) -> Precision:
    """float32 when float32 rounding explains the noise and float64's can't, when parts of
    the forward were seen computing in float32 (``parts``), or when the float64 output's ``gap``
    to the reference is one a lower-precision part explains (FLOAT64_GAP < gap <= FLOAT32_GAP)."""
    if FLOAT64_NOISE < noise <= FLOAT32_NOISE:
        return Precision(torch.float32, noise, gap=gap)
    if parts and noise <= FLOAT32_NOISE:
        return Precision(torch.float32, noise, parts, gap=gap)
    if gap is not None and FLOAT64_GAP < gap <= FLOAT32_GAP and noise <= FLOAT32_NOISE:
        return Precision(torch.float32, noise, gap=gap)
    return Precision(torch.float64, noise, gap=gap)
