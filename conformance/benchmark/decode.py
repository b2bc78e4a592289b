"""The decode step: time per generated token with a KV cache, beside SDPA with a cache.

For each implementation that declares a KV cache and each context length C: a prefill of C
tokens into a fresh cache, then decode calls of one token each, timed interleaved with the same
calls on the baseline (q/k/v/out projections, the cache concatenated along the sequence, one
``F.scaled_dot_product_attention`` call: what a decode step needs and no more), both through the
suite's boundary with the same sizes and inputs. Each timed call adds its token to the cache, so
the contexts measured are C .. C + warm-up + rounds, a few tokens more than C. One torch thread:
a decode step is a few small matmuls, where threads cost more than they save and, on a shared
machine, make the timing erratic (steps of 0.4 ms measured at 44 ms with two threads).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from conformance.benchmark.measure import WARMUP, time_interleaved
from conformance.generation.cases import Case, dtype_name
from conformance.model.capability_groups import CacheForm, CausalForm
from conformance.model.declared_layouts import SeparateProjections
from conformance.model.forms import CacheStyle
from conformance.model.spec import Capabilities, Implementation
from conformance.subject.boundary import ImplementationError, Inputs
from conformance.subject.head_projections import HeadProjections
from conformance.subject.in_process import InProcessSubject

DEFAULT_CONTEXTS = (128, 512, 2048)


class SDPAWithCache(HeadProjections):
    """The baseline decode step: projections, the cache concatenated along the sequence, SDPA
    (no mask: one new token sees every cached key), the output projection."""

    def forward(self, x: torch.Tensor, past_key_value=None, use_cache: bool = False):
        q, k, v = self.heads(x, x, x)
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
        length, keys = q.shape[2], k.shape[2]
        mask = None if length == 1 else torch.ones(length, keys, dtype=torch.bool,
                                                   device=x.device).tril(keys - length)
        out = self.merge(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return (out, (k, v)) if use_cache else out


BASELINE = Implementation(
    "sdpa-kv-cache", lambda c: SDPAWithCache(c.d_model, c.num_heads),
    Capabilities(call="self", causality=CausalForm("always"), cache=CacheForm(
        style=CacheStyle.RETURNED, argument="past_key_value", options=(("use_cache", True),))),
    SeparateProjections(q="q_proj", k="k_proj", v="v_proj", o="out_proj"),
    description="baseline: F.scaled_dot_product_attention over a concatenated KV cache")


@dataclass(frozen=True)
class DecodePoint:
    """One implementation's decode step at one context length."""

    implementation: str
    context: int
    median_ms: float | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    sdpa_median_ms: float | None = None
    ratio_to_sdpa: float | None = None
    skipped: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _stepper(implementation: Implementation, case: Case, prompt: torch.Tensor, token: torch.Tensor):
    """A fresh instance with ``prompt`` prefilled; a call decoding ``token`` at the next
    position."""
    instance = InProcessSubject(implementation).instantiate(case.config, case.seed)
    instance.forward(Inputs(prompt, prompt, prompt, causal=True, cache=True))
    position = [prompt.shape[1]]

    def step() -> None:
        instance.forward(Inputs(token, token, token, causal=True, cache=True,
                                position=position[0]))
        position[0] += 1

    return step


def decode_bench(implementations: Sequence[Implementation], *,
                 contexts: Sequence[int] = DEFAULT_CONTEXTS, batch: int = 1, heads: int = 4,
                 head_dim: int = 32, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 rounds: int = 15) -> list[DecodePoint]:
    """Time per decoded token of each implementation, beside the SDPA baseline."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _decode_points(implementations, contexts, batch, heads, head_dim, dtype, device,
                              rounds)
    finally:
        torch.set_num_threads(threads)


def _decode_points(implementations: Sequence[Implementation], contexts: Sequence[int],
                   batch: int, heads: int, head_dim: int, dtype: torch.dtype, device: str,
                   rounds: int) -> list[DecodePoint]:
    points = []
    for implementation in implementations:
        caps = implementation.capabilities
        for context in contexts:
            if caps.cache.style is None:
                points.append(DecodePoint(implementation.name, context,
                                          skipped="declares no KV cache"))
                continue
            case = Case(batch=batch, q_len=context, kv_len=context, num_heads=heads,
                        head_dim=head_dim, dtype=dtype_name(dtype), device=device, seed=0,
                        causal=True)
            prompt = case.tensor(batch, context, case.d_model)
            token = case.tensor(batch, 1, case.d_model, stream=1)
            if sys.stderr.isatty():
                sys.stderr.write(f"\r\033[K{implementation.name}: context {context}")
            try:
                with torch.no_grad():
                    calls = {"impl": _stepper(implementation, case, prompt, token),
                             "sdpa": _stepper(BASELINE, case, prompt, token)}
                    timing = time_interleaved(calls, device=device, rounds=rounds,
                                              warmup=WARMUP)
            except ImplementationError as error:
                points.append(DecodePoint(implementation.name, context,
                                          skipped=str(error).splitlines()[0]))
                continue
            ms, base = timing["impl"].median * 1e3, timing["sdpa"].median * 1e3
            points.append(DecodePoint(implementation.name, context, round(ms, 4),
                                      round(timing["impl"].q1 * 1e3, 4),
                                      round(timing["impl"].q3 * 1e3, 4), round(base, 4),
                                      round(ms / base, 3) if base else None))
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
    return points


def decode_table(points: Sequence[DecodePoint], heading: str) -> str:
    """Markdown: one row per implementation, ms per token (x SDPA with a cache) per context."""
    contexts = sorted({p.context for p in points})
    rows: dict[str, dict[int, DecodePoint]] = {}
    for point in points:
        rows.setdefault(point.implementation, {})[point.context] = point
    lines = [heading, "", "| implementation | " + " | ".join(
        f"context {c}: ms/token (x SDPA)" for c in contexts) + " |",
        "| --- |" + " --- |" * len(contexts)]
    for name, by_context in rows.items():
        cells = []
        for context in contexts:
            point = by_context.get(context)
            if point is None or point.median_ms is None:
                cells.append("–")
            else:
                cells.append(f"{point.median_ms:.3f} ({point.ratio_to_sdpa:.2f})")
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    skipped = [f"{p.implementation} at {p.context}: {p.skipped}" for p in points if p.skipped]
    if skipped:
        lines += ["", "Not measured: " + "; ".join(skipped)]
    return "\n".join(lines)
