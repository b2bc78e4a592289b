"""What turns an attention layer's logits into the weights that multiply its values, as observed.

Softmax over the keys is the textbook's and the default (nothing observed otherwise). A layer
whose measured weights are another map of its logits s = q·kᵀ is described by a
:class:`Normaliser`: the float64 reference applies it (:mod:`conformance.numerics.reference`),
and the properties of softmax alone (rows summing to 1, invariance to a shift of a row's logits,
the scale as a softmax temperature) are not asked of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F


class NormaliserKind(str, Enum):
    """The map from logits to weights."""

    SIGMOID = "sigmoid"
    """``A_ij = sigmoid(a s_ij + b)`` on each visible key, 0 elsewhere; rows are not normalised
    (Ramapuram et al. 2024, with ``b = -log n``)."""
    STICK_BREAKING = "stick_breaking"
    """``A_ij = beta_ij prod_{j<k visible} (1 - beta_ik)``, ``beta = sigmoid(a s + b)``: each key
    takes a share of what the nearer keys left (Tan et al. 2024); rows sum to at most 1."""
    RECTIFIED = "rectified"
    """``A_ij = n^lambda max(0, a s_ij + b)`` on each visible key: ReLU attention (Wortsman et al.
    2023 divide by the sequence length, lambda = -1); weights exactly 0 below the kink."""
    LINEAR = "linear"
    """``A_ij = phi(q_i)·phi(k_j) / (sum_visible phi(q_i)·phi(k_j) + eps)``: linear attention
    (Katharopoulos et al. 2020, phi = elu + 1), a feature map of q and k, not a map of q·k; its
    rows sum to 1 (less eps) and it is computed without ever forming A."""
    SELECTED = "selected"
    """A softmax over a subset of the visible keys that the data chooses (top-k by an indexer,
    routing): weights 0 on visible keys that vary from input to input."""
    UNKNOWN = "unknown"
    """Rows not normalised, and no map tried reproduces the weights from the logits."""


@dataclass(frozen=True)
class Normaliser:
    """An observed map from logits to weights other than a softmax over the keys.

    ``scale`` a and ``bias`` b: the map's argument is ``a q·k + b`` (sigmoid, stick-breaking),
    with ``log_length`` times log n added, n the number of keys (-1: Ramapuram's ``b = -log n``);
    a = ``scale`` w ** ``power`` at the width w where q and k meet (measured at two widths).
    ``attends_current``: whether a causal row weighs its own token (stick-breaking's choice).
    ``evidence``: what was measured, in words ("row 0 sums to 0.446").
    """

    kind: NormaliserKind
    scale: float | None = None
    power: float = -0.5
    bias: float = 0.0
    log_length: float = 0.0
    attends_current: bool = True
    length_power: float = 0.0
    """lambda: a rectified map's weights are multiplied by n ** lambda (-1: divided by n)."""
    feature: str = ""
    """Linear attention's feature map phi, a key of :data:`FEATURES`."""
    feature_powers: tuple[float, float] = (0.0, 0.0)
    """Linear attention's q and k are multiplied by w ** these before phi (w: their width)."""
    epsilon: float = 0.0
    """What linear attention adds to each row's sum before dividing by it."""
    evidence: str = ""

    @property
    def modelled(self) -> bool:
        """Whether the float64 reference can apply it (a fitted map, not the data's choice)."""
        return self.kind in (NormaliserKind.SIGMOID, NormaliserKind.STICK_BREAKING,
                             NormaliserKind.RECTIFIED, NormaliserKind.LINEAR)

    def scale_at(self, width: int) -> float | None:
        """The slope a on q·k at width ``width``."""
        return None if self.scale is None else self.scale * width ** self.power

    def describe(self) -> str:
        """The map in one phrase, with its fitted numbers."""
        argument = "q·k"
        if self.scale is not None:
            law = {-0.5: "/sqrt(d)", -1.0: "/d", 0.0: ""}.get(self.power, f"·d^{self.power:.3g}")
            argument = ("q·k" + law if abs(self.scale - 1) < 1e-6
                        else f"{self.scale:.3g}·q·k{law}")
        if self.bias:
            argument += f" {'+' if self.bias > 0 else '-'} {abs(self.bias):.3g}"
        if self.log_length:
            argument += (" - log n" if self.log_length == -1 else f" + {self.log_length:g} log n")
        if self.kind is NormaliserKind.SIGMOID:
            return f"sigmoid({argument}) on each visible key, not normalised over the keys"
        if self.kind is NormaliserKind.RECTIFIED:
            over = {0.0: "", -1.0: " / n"}.get(self.length_power,
                                                f" · n^{self.length_power:.3g}")
            return f"max(0, {argument}){over} on each visible key (ReLU attention), not normalised"
        if self.kind is NormaliserKind.STICK_BREAKING:
            current = ("the current token first" if self.attends_current
                       else "each row before its own token (row 0 sees nothing)")
            return (f"a stick-breaking product of beta = sigmoid({argument}), from {current}: "
                    "rows sum to at most 1")
        if self.kind is NormaliserKind.LINEAR:
            scaled = {(0.0, 0.0): "", (-0.5, 0.0): ", q scaled by 1/sqrt(d)",
                      (-0.25, -0.25): ", q and k each scaled by d^-1/4"}.get(
                          self.feature_powers, f", q and k scaled by d^{self.feature_powers}")
            eps = f" + {self.epsilon:.3g}" if self.epsilon else ""
            return (f"phi(q)·phi(k) over its row's sum{eps} (linear attention, phi = "
                    f"{self.feature}{scaled}): a feature map of q and k, not a map of q·k")
        if self.kind is NormaliserKind.SELECTED:
            return ("a softmax over a subset of the visible keys that the data chooses (visible "
                    "keys weighted 0 differ from input to input: a top-k selection or routing)")
        return "no softmax over the keys, and no map tried reproduces the weights from q·k"

    def weights(self, logits: torch.Tensor, allowed: torch.Tensor,
                q: torch.Tensor | None = None, k: torch.Tensor | None = None) -> torch.Tensor:
        """The weights (…, Lq, Lk) from scaled ``logits`` (the reference's ``a q·k``, any bias of
        a position encoding added) over the ``allowed`` keys, 0 on the others; linear
        attention's from ``q`` (…, Lq, E) and ``k`` (…, Lk, E) instead."""
        if self.kind is NormaliserKind.LINEAR:
            if q is None or k is None:
                raise ValueError("linear attention's weights are computed from q and k")
            return linear_weights(q, k, allowed, self.feature, self.feature_powers,
                                  self.epsilon)
        n = logits.shape[-1]
        argument = logits + self.bias + self.log_length * math.log(n)
        if self.kind is NormaliserKind.SIGMOID:
            return torch.sigmoid(argument).masked_fill(~allowed, 0.0)
        if self.kind is NormaliserKind.RECTIFIED:
            return (argument.clamp_min(0) * n ** self.length_power).masked_fill(~allowed, 0.0)
        if self.kind is not NormaliserKind.STICK_BREAKING:
            raise ValueError(f"the reference does not model {self.kind.value} weights")
        if not self.attends_current and logits.shape[-1] == logits.shape[-2]:
            allowed = allowed & ~torch.eye(n, dtype=torch.bool, device=allowed.device)
        log_beta = F.logsigmoid(argument).masked_fill(~allowed, float("-inf"))
        log_rest = F.logsigmoid(-argument).masked_fill(~allowed, 0.0)
        # sum over visible k > j of log(1 - beta_ik): a reversed cumulative sum, key j left out
        after = log_rest.flip(-1).cumsum(-1).flip(-1) - log_rest
        return torch.exp(log_beta + after)


FEATURES = {"elu + 1": lambda x: F.elu(x) + 1, "relu": F.relu}
"""Linear attention's feature maps: Katharopoulos et al.'s elu + 1 (positive everywhere) and a
ReLU."""
FEATURE_POWERS = ((0.0, 0.0), (-0.5, 0.0), (-0.25, -0.25))
"""How q and k may be scaled before the map: not at all, q by 1/sqrt(d), each by d^-1/4."""


def feature_products(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, feature: str,
                     powers: tuple[float, float]) -> torch.Tensor:
    """phi(q)·phi(k) on the ``allowed`` keys, 0 on the others (q and k first scaled by their
    width ** ``powers``)."""
    phi = FEATURES[feature]
    width = q.shape[-1]
    products = phi(q * width ** powers[0]) @ phi(k * width ** powers[1]).transpose(-1, -2)
    return products.masked_fill(~allowed, 0.0)


def over_row_sums(products: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``products`` over their row's sum plus ``epsilon`` (a row with nothing to weigh, and no
    epsilon, weighs 0)."""
    total = products.sum(-1, keepdim=True) + epsilon
    return torch.where(total != 0, products / torch.where(total != 0, total, 1.0), 0.0)


def linear_weights(q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, feature: str,
                   powers: tuple[float, float], epsilon: float) -> torch.Tensor:
    """Linear attention's weights: phi(q)·phi(k) on the ``allowed`` keys over the row's sum
    plus ``epsilon``."""
    return over_row_sums(feature_products(q, k, allowed, feature, powers), epsilon)
