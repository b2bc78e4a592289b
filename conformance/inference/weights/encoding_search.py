"""Which relative position encoding a module applies, by behaviour.

Position-free attention does not care where a token sits: without a mask and without
causality, permuting the tokens permutes the output rows; with causality, the last row is the
same whatever the order of the tokens before it. A module that breaks this encodes positions.
The hypotheses for it are then tried in the weight search (:mod:`conformance.inference.
weights.weight_search`): RoPE with the frequencies the module keeps in a buffer (``inv_freq``,
``freqs_cis``, a cos/sin cache), with a theta its constructor states, or the usual thetas and
rotary fractions, on half-split or interleaved pairs; ALiBi with the paper's slopes. The one
that reproduces the module's own output is the module's encoding.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator

import torch
from torch import nn

from conformance.model.forms import AlibiBias, PositionEncoding, Rotary
from conformance.numerics.tolerance import abs_error
from conformance.subject.boundary import Inputs, Instance

THETAS = (10000.0, 500000.0, 1000000.0, 100000.0, 50000.0, 1000.0)
"""The RoPE bases in use (Llama 2, Llama 3, Qwen2 / Mistral, and a few others)."""

FRACTIONS = (1.0, 0.5, 0.25, 0.4)
"""Rotary fractions in use (full; GPT-J/NeoX-style partial rotation)."""

THETA_NAMES = ("rope_theta", "theta", "base", "rotary_base", "rope_base", "rotary_emb_base",
               "rope_freq_base")
"""Constructor arguments that state RoPE's theta."""

FRACTION_NAMES = ("partial_rotary_factor", "rotary_pct", "rotary_fraction")


def position_dependent(instance: Instance, inputs: Inputs, causal: bool,
                       threshold: float) -> bool:
    """Whether the output depends on where tokens sit (see the module docstring): moving the
    tokens changes the rows that must not change by more than ``threshold`` relative."""
    length = inputs.query.shape[1]
    if length < 3:
        return False
    generator = torch.Generator().manual_seed(5)
    if causal:
        order = torch.cat([torch.randperm(length - 1, generator=generator),
                           torch.tensor([length - 1])])
    else:
        order = torch.randperm(length, generator=generator)
    if bool((order == torch.arange(length)).all()):
        order = order.roll(1) if not causal else torch.cat([order[:-1].roll(1), order[-1:]])
    before = instance.forward(inputs)
    if inputs.is_self:
        moved = inputs.with_tensors(inputs.query[:, order])
    else:
        moved = inputs.with_tensors(inputs.query[:, order], inputs.key[:, order],
                                    inputs.value[:, order])
    after = instance.forward(moved)
    expected = before[:, order]
    rows = slice(length - 1, length) if causal else slice(None)
    scale = max(1.0, float(before.abs().max()))
    return float(abs_error(after[:, rows], expected[:, rows]).max()) > threshold * scale


def setting_arguments(cls: type) -> tuple[str | None, str | None]:
    """The constructor's (theta, fraction) arguments, where it has arguments of those names
    with a number as default."""
    try:
        parameters = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return None, None
    theta = fraction = None
    for name, parameter in parameters.items():
        default = parameter.default
        if not isinstance(default, (int, float)) or isinstance(default, bool):
            continue
        if name in THETA_NAMES and default > 1:
            theta = name
        elif name in FRACTION_NAMES and 0 < default <= 1:
            fraction = name
    return theta, fraction


def stated(cls: type) -> tuple[float | None, float | None]:
    """(theta, fraction) that the constructor's defaults state, where it has such arguments."""
    names = setting_arguments(cls)
    if names == (None, None):
        return None, None
    parameters = inspect.signature(cls.__init__).parameters
    theta, fraction = (None if name is None else float(parameters[name].default)
                       for name in names)
    return theta, fraction


def _buffered_frequencies(module: nn.Module) -> list[torch.Tensor]:
    """Frequency vectors a module keeps: ``inv_freq``-like buffers (positive, decreasing from
    1), the angles of a complex ``freqs_cis`` at position 1, a cos cache's arccos at position
    1."""
    found = []
    for _, buffer in module.named_buffers():
        values = buffer.detach().cpu()
        if values.is_complex() and values.dim() == 2 and values.shape[0] > 1:
            found.append(values[1].angle().to(torch.float64))
        elif values.is_floating_point() and values.dim() == 1 and 1 <= values.numel() <= 512:
            v = values.to(torch.float64)
            if bool((v > 0).all()) and math.isclose(float(v[0]), 1.0, rel_tol=1e-6) and bool(
                    (v[1:] <= v[:-1]).all()):
                found.append(v)
    return found


def _rule(frequencies: torch.Tensor, head_dim: int) -> list[Rotary]:
    """Rotaries whose frequencies are ``frequencies`` at ``head_dim``: the rule theta^(-2i/r)
    with theta from the second frequency, the rotated dims as a fraction and as a fixed count;
    and the frequencies as they are (a scaled RoPE's are no geometric sequence)."""
    pairs = frequencies.numel()
    dims = 2 * pairs
    if dims > head_dim or pairs < 1:
        return []
    rules = []
    theta = float(frequencies[1]) ** (-pairs) if pairs > 1 and float(frequencies[1]) > 0 else 0
    if math.isfinite(theta) and theta > 1:
        rules.append(Rotary(theta=theta, fraction=dims / head_dim))
        if dims != head_dim:
            rules.append(Rotary(theta=theta, dims=dims))
    rules.append(Rotary(table=((head_dim, tuple(frequencies.tolist())),)))
    return rules


def rotary_hypotheses(module: nn.Module, cls: type, head_dim: int) -> list[Rotary]:
    """RoPE hypotheses, most likely first: the module's buffered frequencies, its stated theta
    and fraction, then the usual thetas and fractions; each on both pairings; then all of them
    turned the other way (a sign-flipped ``rotate_half``)."""
    bases: list[Rotary] = []
    for frequencies in _buffered_frequencies(module):
        bases += _rule(frequencies, head_dim)
    theta, fraction = stated(cls)
    if theta is not None or fraction is not None:
        bases.append(Rotary(theta=theta or 10000.0, fraction=fraction or 1.0))
    bases += [Rotary(theta=t, fraction=f) for f in FRACTIONS for t in THETAS]
    seen, ordered = set(), []
    for turned in (False, True):  # every published RoPE first, then each the other way round
        for base in bases:
            for pairing in ("half", "interleaved"):
                rotary = Rotary(pairing=pairing, theta=round(base.theta, 6),
                                fraction=base.fraction, dims=base.dims, table=base.table,
                                reversed=turned)
                key = (rotary.pairing, turned, tuple(rotary.frequencies(head_dim).tolist()))
                if key not in seen and rotary.rotated_dims(head_dim) > 0:
                    seen.add(key)
                    ordered.append(rotary)
    return ordered


def fit_theta(error_at, low: float = 1.5, high: float = 1e8) -> tuple[float, float]:
    """(theta, error) minimising ``error_at(theta)``: a log-spaced scan, then golden-section
    search around the best point (the error of a RoPE hypothesis is smooth in log theta near
    the module's own theta)."""
    logs = torch.linspace(math.log(low), math.log(high), 33).tolist()
    errors = [error_at(math.exp(x)) for x in logs]
    best = min(range(len(logs)), key=errors.__getitem__)
    a, b = logs[max(best - 1, 0)], logs[min(best + 1, len(logs) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = error_at(math.exp(c)), error_at(math.exp(d))
    for _ in range(40):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = error_at(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = error_at(math.exp(d))
    x = c if fc < fd else d
    return math.exp(x), min(fc, fd)


def hypotheses(module: nn.Module, cls: type, head_dim: int, *, dependent: bool,
               causal: bool, tiled: bool = False) -> Iterator[PositionEncoding | None]:
    """The encodings to try: none for a position-free module; otherwise RoPE's hypotheses, then
    ALiBi's (with its slopes in the module's head order where the query heads are read
    relabelled, ``tiled``)."""
    if not dependent:
        yield None
        return
    for rotary in rotary_hypotheses(module, cls, head_dim):
        yield PositionEncoding(rotary=rotary)
    for scaled in (False, True):  # the paper's, then added before the logits' scaling (Falcon)
        yield PositionEncoding(alibi=AlibiBias(tiled=tiled, scaled=scaled))
        if not causal:
            yield PositionEncoding(alibi=AlibiBias(symmetric=True, tiled=tiled, scaled=scaled))
