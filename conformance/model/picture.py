"""The falsifying case of a finding, drawn: plain numbers a report turns into a figure."""

from __future__ import annotations

from dataclasses import asdict, dataclass

Matrix = tuple[tuple[float, ...], ...]
"""Rows of numbers: query rows by keys."""


@dataclass(frozen=True)
class Picture:
    """One batch and head of a finding's minimal case, as the implementation computed it and as
    the float64 reference does.

    Either ``measured`` and ``reference`` (the attention probabilities, Lq x Lk, measured through
    the implementation's own forward with probe weights: see
    :mod:`conformance.inference.observing.attention_probe`),
    or ``row_error`` (each query row's largest output error against the reference: an output-
    only finding, where the probabilities can't be measured), or neither, with ``unavailable``
    saying why. ``allowed`` marks the keys each row may see (the mask, causality and window as
    the case sets them): a key outside it is masked or in the future; ``kept`` the keys the
    padding mask keeps (None: no mask); ``attending`` the query rows with a key to attend to.
    """

    batch: int
    head: int
    measured: Matrix | None = None
    reference: Matrix | None = None
    row_error: tuple[float, ...] | None = None
    allowed: tuple[tuple[bool, ...], ...] | None = None
    kept: tuple[bool, ...] | None = None
    attending: tuple[bool, ...] | None = None
    causal: bool = False
    where: str = ""
    """How the batch and head were chosen (named by the finding, or where they differ most)."""
    unavailable: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)
