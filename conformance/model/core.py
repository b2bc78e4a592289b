"""What a forward's attention core was given and computed, observed while the forward ran.

Plain data that crosses the worker boundary: one :class:`AttentionSite` per softmax attention the
forward computed (a ``softmax`` whose logits are a product of two token-derived tensors and
whose probabilities weight values over the keys), or per call of torch's
``scaled_dot_product_attention``. Each site's tensors are in one layout, whatever the module's
own: ``(G, Lq, Lk)`` for logits and probabilities, ``(G, Lk, Dv)`` for values and ``(G, Lq, Dv)``
for the result, ``G`` every other axis (batch and heads, in the module's order) flattened.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch


class CoreKind(str, Enum):
    """How the core computed its probabilities."""

    SOFTMAX = "softmax"
    """``torch.softmax`` / ``F.softmax`` / ``Tensor.softmax`` (or ``log_softmax``) of logits the
    forward computed itself: logits and probabilities are both observed."""
    SDPA = "sdpa"
    """``F.scaled_dot_product_attention``: its q, k, v, mask and scale are observed; what it
    computes inside is torch's."""


@dataclass(frozen=True)
class AttentionSite:
    """One attention core, as observed (see the module docstring for the layout).

    ``scores``: the sum of the products q·kᵀ that make the logits, recomputed in float64 from
    the operands the forward multiplied, with any scalar the forward multiplied q or k by since
    they were made divided out (so a scale applied to q before the product is still a scale).
    ``widths``: the widths of q and k as the core contracts them, first as seen, then any other
    reading the core admits (an "absorbed" product, where q was multiplied by a weight first,
    contracts a latent width: the width of q before that product is the textbook one).
    """

    kind: CoreKind
    scores: torch.Tensor
    widths: tuple[int, ...]
    term_widths: tuple[int, ...] = ()
    """The widths of the parts q·kᵀ is made of, where it is made of several: the products summed
    into the logits, or the parts q was joined from (MLA's non-rotary and rotary dimensions)."""
    logits: torch.Tensor | None = None
    """The softmax's input (SOFTMAX), in the module's dtype."""
    probabilities: torch.Tensor | None = None
    """The softmax's output (SOFTMAX), exponentiated for a ``log_softmax``."""
    used: torch.Tensor | None = None
    """The weights that multiply the values: the probabilities after whatever the forward did to
    them (dropout, a mask, a cast, sinks sliced off); None where no product with values was
    found."""
    values: torch.Tensor | None = None
    result: torch.Tensor | None = None
    over_keys: bool | None = None
    """Whether the softmax normalised over the key axis (the axis its weights are contracted
    with the values over); None where that could not be told."""
    combined: int = 1
    """How many softmax maps the weights that multiply the values combine (2 for differential
    attention: two maps subtracted)."""
    sinks: int = 0
    """Columns the softmax spans beyond the keys that weight values (attention sinks)."""
    scale: float | None = None
    """SDPA: the scale it applied (its ``scale`` argument, or 1/sqrt(E)), times any scalar q
    and k were multiplied by."""
    allowed: torch.Tensor | None = None
    """SDPA: (G, Lq, Lk) bool, the keys its mask and ``is_causal`` let each query see."""
    bias: torch.Tensor | None = None
    """SDPA: (G, Lq, Lk) float64, the additive bias of a float mask (0 where none)."""
    scalars_known: bool = True
    """Whether every scalar q and k were multiplied by was found (paths that multiply them by
    different numbers leave ``scores`` with them in, and this False)."""
    softcap: float | None = None
    """c, where the logits are c·tanh(·) of the scaled scores (a logit softcap): the multiplier
    of a tanh between the products and the softmax."""
    learned_scale: bool = False
    """The logits are multiplied by a learned parameter after the product (a temperature)."""
    heads_mixed: bool = False
    """The logits are a learned matrix times the heads' logits (talking heads): the products
    behind them are not observed as q·kᵀ, so no scale is fitted there."""
    qk_norm: str | None = None
    """``"head"``: q or k was normalised per head by its own statistics after its projection
    (Qwen 3's QK-norm), which the per-head weights hold but the float64 reference does not
    model; ``"heads"``: over every head together before the split (OLMo 2's), which no per-head
    projection holds; None without."""
    query_temperature: bool = False
    """The queries were multiplied by one number per position before the product (a temperature
    of the query's position, Llama 4's), which no per-head projection holds."""
    how: str = ""
    """In words: the calls the site was found in."""

    def departures(self) -> tuple[str, ...]:
        """How this core's design departs from one softmax of q·kᵀ weighting the values, in words
        (none for a textbook core; a mistake, a softmax over the queries, is no design)."""
        found = []
        if self.combined > 1:
            found.append(f"{self.combined} softmax maps combined before they weight the values "
                         "(differential attention)")
        if self.sinks:
            found.append(f"the softmax spans {self.sinks} column(s) beyond the keys (attention "
                         "sinks)")
        if self.learned_scale:
            found.append("a learned parameter multiplies the logits (a learned temperature)")
        if self.heads_mixed:
            found.append("the heads' logits are mixed by a learned matrix before the softmax "
                         "(talking heads)")
        if self.qk_norm == "heads":
            found.append("q or k is normalised over every head together after its projection "
                         "(a QK-norm across heads, OLMo 2's), which no per-head projection holds")
        if self.query_temperature:
            found.append("each query is multiplied by a factor of its position before q·kᵀ (a "
                         "temperature of the position, Llama 4's)")
        return tuple(found)


@dataclass(frozen=True)
class CoreObservation:
    """Every attention site one forward computed, in the order it computed them, and the
    forward's output."""

    sites: tuple[AttentionSite, ...]
    output: torch.Tensor

    def causal_weights(self) -> bool:
        """Whether every site gives every later key exactly weight 0 (its queries as many as
        its keys, row i weighing keys j > i by nothing: the weights that multiply the values,
        else its probabilities, or SDPA's allowed keys), and there is a site to say so."""
        if not self.sites:
            return False
        for site in self.sites:
            weights = site.used if site.used is not None else site.probabilities
            shown = site.allowed if site.kind is CoreKind.SDPA else weights
            if shown is None or shown.shape[-1] != shown.shape[-2]:
                return False
            if not unweighted_future(shown):
                return False
        return True


def unweighted_future(weights: torch.Tensor) -> bool:
    """Whether square ``weights`` (…, L, L) give every later key exactly 0 on every row, a row
    of equal weights on every key aside (a row whose every key was masked by a finite fill, as
    a top-k row left no visible key: that fill's, not the structure's). Bool ``weights`` (the
    keys a mask allows) have no such row."""
    later = torch.ones(weights.shape[-2:], dtype=torch.bool, device=weights.device).triu(1)
    weighed = (weights != 0) & later
    if weights.dtype != torch.bool and weights.shape[-1] > 1:
        weighed &= ~(weights.amax(-1) == weights.amin(-1))[..., None]
    return not bool(weighed.any())


def maps_per_sequence(sites: tuple[AttentionSite, ...], batch: int) -> int | None:
    """The attention maps per sequence of ``batch`` these sites computed, one a head: summed over
    the sites (a loop over heads computes one map a site), the maps a head combines (two in
    differential attention) counted once; None where there is no site, or the count does not
    divide by the batch."""
    maps = sum(int(site.scores.shape[0]) // max(site.combined, 1) for site in sites)
    return maps // batch if sites and not maps % batch else None
