"""A finding's picture (:class:`~conformance.model.picture.Picture`) drawn with matplotlib: a PNG.

Three panels where the probabilities were measured: the implementation's attention, the float64
reference's, and their difference. On each, keys the case masks are hatched in grey, query rows
with no key to attend to are hatched across, the causal boundary is a white staircase (a row's
keys to its right are its future), and every cell where the implementation gives weight to a key
the row may not see is outlined in red: a leak is seen, not read. Where only the output could be
compared, each query row's error against the reference, as bars.
"""

from __future__ import annotations

import io

from conformance.benchmark.render import plot_available
from conformance.model.picture import Picture

LEAK = 1e-3
"""Weight on a key the row may not see from which the cell is outlined as a leak."""

INSTALL = "pip install 'attention-conformance[plot]'"
"""What gives a report its figures."""


def available() -> bool:
    """Whether matplotlib (the ``[plot]`` extra) is importable (as ``bench --plot`` asks)."""
    return plot_available()


def png(picture: Picture, title: str) -> bytes | None:
    """``picture`` drawn, as PNG bytes; None where it holds nothing to draw."""
    if picture.measured is None and picture.row_error is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = (_probabilities(plt, picture) if picture.measured is not None
              else _row_errors(plt, picture))
    figure.suptitle(title, fontsize=10)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def _probabilities(plt, picture: Picture):
    import numpy as np

    measured = np.array(picture.measured, dtype=float)
    reference = np.array(picture.reference, dtype=float)
    difference = measured - reference
    rows, keys = measured.shape
    size = max(3.0, 0.42 * keys + 1.2)
    figure, axes = plt.subplots(1, 3, figsize=(3 * size + 1.2, max(3.0, 0.42 * rows + 1.2)),
                                constrained_layout=True)
    span = float(np.nanmax(np.abs(difference))) if np.isfinite(difference).any() else 1.0
    panels = ((measured, "implementation", "viridis", 0.0, 1.0),
              (reference, "float64 reference", "viridis", 0.0, 1.0),
              (difference, "implementation - reference", "RdBu_r", -max(span, 1e-12),
               max(span, 1e-12)))
    allowed = np.array(picture.allowed, dtype=bool) if picture.allowed else np.ones_like(
        measured, dtype=bool)
    for axis, (values, name, colours, low, high) in zip(axes, panels, strict=True):
        image = axis.imshow(np.ma.masked_invalid(values), cmap=colours, vmin=low, vmax=high,
                            interpolation="nearest")
        figure.colorbar(image, ax=axis, shrink=0.8)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("key")
        axis.set_ylabel("query row")
        _marks(axis, picture, allowed, measured if axis is not axes[1] else None)
    for r, c in zip(*np.nonzero(np.isnan(measured)), strict=True):
        for axis in (axes[0], axes[2]):
            axis.text(c, r, "NaN", ha="center", va="center", color="red", fontsize=7)
    return figure


def _marks(axis, picture: Picture, allowed, measured) -> None:
    """Masked keys, rows with no key, the causal boundary and (given what was ``measured``)
    the leaks, on one panel."""
    import numpy as np
    from matplotlib.patches import Rectangle

    rows, keys = allowed.shape
    for key, kept in enumerate(picture.kept or ()):
        if not kept:
            axis.add_patch(Rectangle((key - 0.5, -0.5), 1, rows, fill=False, hatch="///",
                                     edgecolor="grey", linewidth=0))
    for row, attending in enumerate(picture.attending or ()):
        if not attending:
            axis.add_patch(Rectangle((-0.5, row - 0.5), keys, 1, fill=False, hatch="\\\\\\",
                                     edgecolor="grey", linewidth=0))
    if picture.causal:
        xs, ys = [], []
        for row in range(rows):
            seen = np.nonzero(allowed[row])[0]
            edge = (int(seen.max()) if seen.size else row) + 0.5
            xs += [edge, edge]
            ys += [row - 0.5, row + 0.5]
        axis.plot(xs, ys, color="white", linewidth=2)
        axis.plot(xs, ys, color="black", linewidth=0.8, linestyle="--")
    if measured is not None:
        leaks = (~allowed) & ~(np.nan_to_num(np.abs(measured), nan=1.0) <= LEAK)
        for row, key in zip(*np.nonzero(leaks), strict=True):
            axis.add_patch(Rectangle((key - 0.5, row - 0.5), 1, 1, fill=False, edgecolor="red",
                                     linewidth=1.6))
    axis.set_xlim(-0.5, keys - 0.5)
    axis.set_ylim(rows - 0.5, -0.5)


def _row_errors(plt, picture: Picture):
    errors = list(picture.row_error or ())
    figure, axis = plt.subplots(figsize=(max(4.0, 0.4 * len(errors) + 2), 3),
                                constrained_layout=True)
    finite = [e if e == e and e != float("inf") else 0.0 for e in errors]
    top = max(finite) if any(finite) else 1.0
    colours = ["red" if not (e == e and e != float("inf")) else "tab:blue" for e in errors]
    heights = [e if c == "tab:blue" else top for e, c in zip(finite, colours, strict=True)]
    axis.bar(range(len(errors)), heights, color=colours)
    for row, attending in enumerate(picture.attending or ()):
        if not attending:
            axis.axvspan(row - 0.5, row + 0.5, color="grey", alpha=0.3)
    axis.set_xlabel("query row (red: NaN or inf; grey: no key to attend to)")
    axis.set_ylabel("largest |output - reference|")
    axis.set_title(f"batch {picture.batch}: each row's output error", fontsize=9)
    return figure
