"""A kernel function's own arguments beyond (q, k, v), found by name and settled by behaviour.

Names order the search (FlashAttention's and SDPA's keywords: ``softmax_scale``, ``window_size``,
``softcap``, ``return_lse``); behaviour decides what is stated: where ``causal=True`` puts the
diagonal when queries are fewer than keys (measured, see :func:`causal_alignment`), and whether
asking for the log-sum-exp returns ``(out, lse)`` with an lse of shape (batch, heads, q_len).
What each argument computes is the ``kernel`` check's to judge: a scale the kernel ignores, a
window one key off, a softcap applied after the mask fail there.
"""

from __future__ import annotations

import inspect

import torch

from conformance.errors import clipped
from conformance.model.forms import CausalAlignment, KernelArguments
from conformance.model.spec import Capabilities
from conformance.numerics.position_encoding import standard_slopes
from conformance.numerics.tolerance import unchanged_tolerance

SCALE_ARGUMENTS = ("softmax_scale", "scale", "sm_scale", "scaling")
WINDOW_ARGUMENTS = ("window_size",)
SOFTCAP_ARGUMENTS = ("softcap", "logit_softcap", "softcapping")
LSE_ARGUMENTS = ("return_lse", "return_softmax_lse")
ALIBI_ARGUMENTS = ("alibi_slopes",)
"""Keywords kernels take each argument by (FlashAttention, SDPA, Triton's tutorial)."""

ALIGNMENT_WORDS = {
    CausalAlignment.BOTTOM_RIGHT: "of 3 queries over 5 keys, query 0 sees keys 0 to 2: query i "
                                  "sees keys <= i + kv_len - q_len, as FlashAttention >= 2.1 and "
                                  "SDPA's lower-right",
    CausalAlignment.TOP_LEFT: "of 3 queries over 5 keys, query 0 sees key 0 alone: query i sees "
                              "keys <= i",
}


def call_output(result: object) -> torch.Tensor | None:
    """The attention output of a call: the tensor, or the first of an ``(out, lse)`` pair."""
    if isinstance(result, tuple) and result:
        result = result[0]
    return result if isinstance(result, torch.Tensor) else None


def refusal(error: BaseException) -> str:
    """An exception in a line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {clipped(lines[0], 120) if lines else ''}".rstrip(": ")


def per_head(layout: str, length: int, generator: torch.Generator, dtype: torch.dtype, *,
             heads: int = 2, batch: int = 1) -> torch.Tensor:
    """One of q, k, v for a probe: ``batch`` elements, ``heads`` heads of 8, ``length``
    tokens, in ``layout``, standard normal in ``dtype``."""
    shape = (batch, heads, length, 8) if layout == "bhld" else (batch, length, heads, 8)
    return torch.randn(shape, generator=generator).to(dtype)


def causal_alignment(function, layout: str, argument: str,
                     dtype: torch.dtype) -> tuple[CausalAlignment | None, str]:
    """How ``function(..., argument=True)`` aligns causality when queries are fewer than keys,
    by behaviour: with 3 queries over 5 keys, whether query 0 sees keys 0 to 2 (bottom-right)
    or key 0 alone (top-left), else NEITHER; None where it refuses those shapes. With what
    was seen, in words."""
    generator = torch.Generator().manual_seed(11)
    axis = 2 if layout == "bhld" else 1
    q, k, v = (per_head(layout, n, generator, dtype) for n in (3, 5, 5))
    seen = []
    try:
        with torch.no_grad():
            before = call_output(function(q, k, v, **{argument: True})).double()
            for key in range(5):
                k2, v2 = k.clone(), v.clone()
                k2.select(axis, key).mul_(-2.0)
                v2.select(axis, key).add_(3.0)
                after = call_output(function(q, k2, v2, **{argument: True})).double()
                row0 = (after - before).select(axis, 0)
                seen.append(bool((row0.abs() > unchanged_tolerance(dtype, before)).any()))
    except Exception as error:  # the function's own refusal of these shapes
        return None, (f"with {argument}=True, 3 queries over 5 keys raise "
                      f"({refusal(error)}): causality with fewer queries than keys not checked")
    for alignment, pattern in ((CausalAlignment.BOTTOM_RIGHT, [True] * 3 + [False] * 2),
                               (CausalAlignment.TOP_LEFT, [True] + [False] * 4)):
        if seen == pattern:
            return alignment, (f"causal aligned {alignment.value.replace('_', '-')} (probed: "
                               f"{ALIGNMENT_WORDS[alignment]})")
    keys = [key for key, moved in enumerate(seen) if moved]
    return CausalAlignment.NEITHER, (
        "causal aligned neither bottom-right nor top-left (probed: of 3 queries over 5 keys, "
        f"query 0 sees {'keys ' + str(keys) if keys else 'no key'}): checked against "
        "bottom-right by kernel")


def lse_argument(function, layout: str, names: list[str],
                 dtype: torch.dtype) -> tuple[str | None, str | None]:
    """The keyword that makes ``function`` return ``(out, lse)`` ("" where every call does),
    by behaviour: the second element is a tensor of shape (batch, heads, q_len); with a note."""
    generator = torch.Generator().manual_seed(13)
    q, k, v = (per_head(layout, n, generator, dtype) for n in (3, 4, 4))
    expected = (1, 2, 3)
    for keyword in ("", *(n for n in LSE_ARGUMENTS if n in names)):
        try:
            with torch.no_grad():
                result = function(q, k, v, **({keyword: True} if keyword else {}))
        except Exception:  # not this way: the next keyword, if any
            continue
        if not (isinstance(result, tuple) and len(result) >= 2):
            continue
        lse = result[1]
        shape = tuple(lse.shape) if isinstance(lse, torch.Tensor) else None
        if shape is not None and shape in (expected, (*expected, 1)):
            how = f"with {keyword}=True" if keyword else "always"
            return keyword, (f"returns (out, lse) {how} (lse (batch, heads, q_len), probed; "
                             "checked by kernel against the float64 log-sum-exp)")
        return None, (f"returns a tuple whose second element is {shape or type(lse).__name__}, "
                      f"not (batch, heads, q_len) = {expected}: not read as a log-sum-exp")
    return None, None


UNSETTLED = ("scale", "scaling")
"""Names that may mean something else than the softmax scale (``softmax_scale`` and
``sm_scale`` settle it; ``scaling`` is ``AttentionInterface``'s, and a RoPE's elsewhere):
behaviour decides (see :func:`_not_a_scale`)."""

TRIED = {"scale": 0.5, "window": (2, 0), "softcap": 1.0}
"""A value of each argument's form, tried once: a kernel whose argument of that name takes
another form (a window as one int) raises, and the argument is not read as FlashAttention's."""


def refuses(function, layout: str, dtype: torch.dtype, name: str, value: object) -> str | None:
    """Why ``function(..., name=value)`` raises on a small case, or None where it runs."""
    generator = torch.Generator().manual_seed(19)
    q, k, v = (per_head(layout, 4, generator, dtype) for _ in range(3))
    try:
        with torch.no_grad():
            function(q, k, v, **{name: value})
    except Exception as error:  # the function's own refusal of the value
        return f"raises ({refusal(error)})"
    return None


def _not_a_scale(function, layout: str, dtype: torch.dtype, name: str) -> str | None:
    """Why ``name`` is not the softmax scale: given 0.5, the output changes and is not
    softmax(0.5 q k^T) v (float64, from the same tensors); None where it is (or where it
    changes nothing: an ignored scale is the kernel check's to fail)."""
    generator = torch.Generator().manual_seed(23)
    q, k, v = (per_head(layout, 4, generator, dtype) for _ in range(3))
    heads = (lambda t: t) if layout == "bhld" else (lambda t: t.transpose(1, 2))
    with torch.no_grad():
        default = call_output(function(q, k, v)).double()
        given = call_output(function(q, k, v, **{name: 0.5})).double()
        q64, k64, v64 = (heads(t).double() for t in (q, k, v))
        expected = heads(torch.softmax(0.5 * q64 @ k64.transpose(-1, -2), -1) @ v64)
    allowed = 64 * torch.finfo(dtype).eps * max(1.0, float(expected.abs().max()))
    if float((given - default).abs().max()) <= allowed:
        return None
    if float((given - expected).abs().max()) <= allowed:
        return None
    return (f"changes the output into something other than softmax({name} q.k) v (off by "
            f"{float((given - expected).abs().max()):.3g})")


def kernel_arguments(function, layout: str, caps: Capabilities,
                     dtype: torch.dtype) -> tuple[KernelArguments, list[str]]:
    """The kernel's own arguments (see :class:`KernelArguments`), with notes."""
    names = list(inspect.signature(function).parameters)
    notes = []
    # The keyword inference turned causality on with (the wrapper's is_causal passes it on).
    causal = next((n for n in names if "causal" in n), None)
    alignment = None
    if caps.causality.kind == "optional" and causal:
        alignment, words = causal_alignment(function, layout, causal, dtype)
        notes.append(words)
    found = {role: next((n for n in candidates if n in names), None)
             for role, candidates in (("scale", SCALE_ARGUMENTS), ("window", WINDOW_ARGUMENTS),
                                      ("softcap", SOFTCAP_ARGUMENTS))}
    for role, words in (("scale", "the softmax scale"), ("window", "a window (left, right)"),
                        ("softcap", "a logit softcap")):
        name = found[role]
        if not name:
            continue
        problem = refuses(function, layout, dtype, name, TRIED[role])
        if problem is None and name in UNSETTLED:
            problem = _not_a_scale(function, layout, dtype, name)
        if problem is not None:  # another meaning of the name: not this argument's form
            found[role] = None
            notes.append(f"{name}={TRIED[role]!r} {problem}: not read as {words}, not "
                         "checked")
            continue
        notes.append(f"{words} set by {name}= (checked by kernel: the value given is the one "
                     "applied)")
    lse, words = lse_argument(function, layout, names, dtype)
    if words:
        notes.append(words)
    alibi = next((n for n in ALIBI_ARGUMENTS if n in names), None)
    if alibi:
        problem = refuses(function, layout, dtype, alibi,
                           torch.tensor(standard_slopes(2), dtype=torch.float32))
        notes.append(f"ALiBi slopes (heads,) given by {alibi}= (checked by kernel: -m_h |i - j| "
                     "added to the logits)" if problem is None else
                     f"{alibi}= given the paper's slopes (heads,) {problem}: not checked")
        alibi = alibi if problem is None else None
    return KernelArguments(scale_argument=found["scale"], alignment=alignment,
                           window_argument=found["window"], softcap_argument=found["softcap"],
                           lse_argument=lse, alibi_argument=alibi), notes
