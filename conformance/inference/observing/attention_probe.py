"""Measure an implementation's attention matrix from the outside, through its own forward.

With canonical weights we make the output equal the attention weights: the query and key
projections read a random "content" channel of the input, the value projection reads a one-hot
"position" channel (key ``j`` carries ``e_j``), and the output projection is the identity. Then
head ``h``'s block of output row ``i`` is ``A[h, i, :]``: whatever the implementation computes
(``torch.softmax``, hand-written exp/sum, SDPA inside), it is measured as it behaves.

Fits when every head's value width is at least ``kv_len``, the input width exceeds ``kv_len``,
and the output projection (if any) is square.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conformance.generation.cases import Case
from conformance.model.forms import PositionEncoding
from conformance.model.weights import HeadWeights
from conformance.numerics.position_encoding import encode
from conformance.subject.boundary import ImplementationError, Inputs, Instance

QK_GAIN = 1.5
"""Logit spread of the probe: large enough that rows are far from uniform, small enough that no
weight underflows to zero."""


class ProbeUnfit(ValueError):
    """The attention-matrix probe cannot measure this case (too many keys for the head width):
    the case is no example for a check that measures the matrix."""


def probe_unfit_reason(weights: HeadWeights, kv_len: int) -> str | None:
    """Why the probe can't measure this shape, or None when it can."""
    if weights.value_dim < kv_len:
        return f"value width {weights.value_dim} < kv_len {kv_len}"
    if weights.d_in <= kv_len:
        return f"input width {weights.d_in} <= kv_len {kv_len}"
    if weights.w_o is not None and weights.w_o.shape[0] != weights.w_o.shape[1]:
        return "output projection is not square"
    return None


def _probe_weights(original: HeadWeights, kv_len: int, generator: torch.Generator,
                   gain: float) -> HeadWeights:
    heads, head_dim, d_in = original.num_heads, original.head_dim, original.d_in
    kv_heads = original.num_kv_heads
    content = d_in - kv_len

    def content_reader(count: int) -> torch.Tensor:
        w = torch.zeros(count, head_dim, d_in, dtype=torch.float64)
        w[:, :, kv_len:] = torch.randn(count, head_dim, content, generator=generator,
                                       dtype=torch.float64) * (gain / content**0.5)
        return w

    # Grouped key/value heads: every group's values are the same one-hot positions, so each
    # query head's block still reads its own attention row.
    w_v = torch.zeros(kv_heads, original.value_dim, d_in, dtype=torch.float64)
    w_v[:, torch.arange(kv_len), torch.arange(kv_len)] = 1.0
    probe = HeadWeights(
        w_q=content_reader(heads), b_q=torch.zeros(heads, head_dim, dtype=torch.float64),
        w_k=content_reader(kv_heads), b_k=torch.zeros(kv_heads, head_dim, dtype=torch.float64),
        w_v=w_v, b_v=torch.zeros(kv_heads, original.value_dim, dtype=torch.float64),
        w_o=None if original.w_o is None else torch.eye(original.w_o.shape[0], dtype=torch.float64),
        b_o=None if original.b_o is None else torch.zeros_like(original.b_o, dtype=torch.float64),
    )
    return probe.map(lambda t: t.to(dtype=original.w_q.dtype, device=original.w_q.device))


@dataclass(frozen=True)
class Probe:
    """``attention`` (B, H, Lq, Lk) as measured, and the unscaled ``logits`` q_i . k_j the probe's
    weights and inputs give (float64; after RoPE where the module has it), so a scale can be
    fitted; ``bias``: the logit bias a position encoding adds (ALiBi), unscaled, or None."""

    attention: torch.Tensor
    logits: torch.Tensor
    bias: torch.Tensor | None = None
    q: torch.Tensor | None = None
    """(B, H, Lq, E) float64: the queries behind ``logits`` (a feature map of them is linear
    attention's)."""
    k: torch.Tensor | None = None
    """(B, H, Lk, E) float64: the keys behind ``logits``."""


def measure_attention(instance: Instance, case: Case, call: str, *,
                      keep: torch.Tensor | None = None, causal: bool = False,
                      gain: float = QK_GAIN) -> torch.Tensor:
    """The implementation's attention weights (B, H, Lq, Lk) for ``case``'s shapes, in float64.

    Loads probe weights into ``instance`` (its own weights are replaced). ``gain`` sets the
    logits' spread; 0 makes every logit 0, so each row spreads its weight evenly over the keys it
    may see (no weight can underflow, even in float16). Raises ProbeUnfit where the
    output shows the probe's premise does not hold for this layer.
    """
    return probe(instance, case, call, keep=keep, causal=causal, gain=gain).attention


def probe(instance: Instance, case: Case, call: str, *, keep: torch.Tensor | None = None,
          causal: bool = False, gain: float = QK_GAIN,
          encoding: PositionEncoding | None = None) -> Probe:
    """Measure the attention matrix (see :func:`measure_attention`), with the probe's logits
    (the module's relative position ``encoding`` applied to them)."""
    original = instance.read_weights()
    kv_len = case.kv_len
    reason = probe_unfit_reason(original, kv_len)
    if reason is not None:
        raise ProbeUnfit(f"probe does not fit: {reason}")
    generator = torch.Generator().manual_seed(case.seed + 7919)
    weights = _probe_weights(original, kv_len, generator, gain)
    instance.write_weights(weights)

    d_in = original.d_in
    content = d_in - kv_len

    def content_inputs(length: int) -> torch.Tensor:
        x = torch.zeros(case.batch, length, d_in, dtype=torch.float64)
        x[:, :, kv_len:] = torch.randn(case.batch, length, content, generator=generator,
                                       dtype=torch.float64)
        return x

    kv = content_inputs(kv_len)
    kv[:, torch.arange(kv_len), torch.arange(kv_len)] = 1.0
    q_in = kv if call == "self" else content_inputs(case.q_len)
    to_case = dict(dtype=original.w_q.dtype, device=original.w_q.device)
    kv_case = kv.to(**to_case)
    q_case = kv_case if call == "self" else q_in.to(**to_case)
    inputs = (Inputs.self_attention(kv_case, keep, causal) if call == "self"
              else Inputs(q_case, kv_case, kv_case, keep, causal))
    w64 = weights.expanded().map(lambda t: t.to(torch.float64).cpu())
    q = torch.einsum("bld,hed->bhle", q_case.to(torch.float64).cpu(), w64.w_q)
    k = torch.einsum("bld,hed->bhle", kv_case.to(torch.float64).cpu(), w64.w_k)
    q, k, bias = encode(q, k, encoding, None if keep is None else keep.cpu(),
                        heads=(0, weights.num_heads, weights.num_kv_heads))

    output = instance.forward(inputs).to(torch.float64).cpu()
    heads, value_dim = original.num_heads, original.value_dim
    expected_shape = (case.batch, case.q_len, heads * value_dim)
    if tuple(output.shape) != expected_shape:
        raise ImplementationError(
            f"probe output has shape {tuple(output.shape)}, expected {expected_shape}")
    blocks = output.reshape(case.batch, case.q_len, heads, value_dim).permute(0, 2, 1, 3)
    stray = blocks[..., kv_len:].abs()
    if stray.numel() and float(torch.nan_to_num(stray, nan=0.0).max()) > 1e-3:
        # The probe's premise (the output is the weights' rows) does not hold for this layer:
        # the suite's instrument does not fit, which is no finding about the layer.
        raise ProbeUnfit(
            "with one-hot values and identity projections, output features past kv_len are "
            f"{float(stray.max()):.3g}, not 0: the layer computes more than its projections and "
            "attention, so the attention-matrix probe can't read its weights")
    return Probe(attention=blocks[..., :kv_len], logits=q @ k.transpose(-1, -2), bias=bias,
                 q=q, k=k)
