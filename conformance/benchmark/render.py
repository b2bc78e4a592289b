"""Bench results as a table, JSON, or a log-log plot of time and memory against length."""

from __future__ import annotations

from collections.abc import Sequence

from conformance.benchmark.ladder import BenchPoint, scaling_exponent


def _by_implementation(points: Sequence[BenchPoint]) -> dict[str, list[BenchPoint]]:
    grouped: dict[str, list[BenchPoint]] = {}
    for point in points:
        grouped.setdefault(point.implementation, []).append(point)
    return grouped


FIT_POINTS = 3
"""Exponents are fitted over the longest lengths measured: at short lengths the projections
(linear in L) dominate, and a fit over the whole ladder would mix the two regimes."""


def exponents(points: Sequence[BenchPoint]) -> tuple[float | None, float | None]:
    """Fitted exponents of time and peak memory in sequence length, over the FIT_POINTS longest
    measured lengths."""
    measured = [p for p in points if p.median_ms is not None][-FIT_POINTS:]
    lengths = [p.length for p in measured]
    return (scaling_exponent(lengths, [p.median_ms for p in measured]),
            scaling_exponent(lengths, [p.peak_mb or 0.0 for p in measured]))


def table(points: Sequence[BenchPoint], heading: str) -> str:
    lines = [heading, ""]
    for name, rows in _by_implementation(points).items():
        lines.append(name)
        lines.append(f"  {'length':>7} {'median ms':>10} {'(IQR)':>17} {'x SDPA':>7} "
                     f"{'TFLOP/s':>9} {'of peak':>8} {'peak MB':>8} {'SDPA MB':>8}")
        for p in rows:
            if p.skipped:
                lines.append(f"  {p.length:>7}  skipped: {p.skipped}")
                continue
            lines.append(f"  {p.length:>7} {p.median_ms:>10.3f} ({p.q1_ms:>7.3f}-{p.q3_ms:<7.3f})"
                         f" {p.ratio_to_sdpa:>7.2f} {p.tflops:>9.4g} {_percent(p):>8} {p.peak_mb:>8.2f} "
                         f"{p.sdpa_peak_mb:>8.2f}")
        time_exponent, memory_exponent = exponents(rows)
        if time_exponent is not None:
            fitted = [p.length for p in rows if p.median_ms is not None][-FIT_POINTS:]
            span = f" (fitted over L = {fitted[0]}..{fitted[-1]})"
            lines.append(f"  scaling: time ~ L^{time_exponent:.2f}, peak memory ~ "
                         f"L^{memory_exponent:.2f}{span}" if memory_exponent is not None else
                         f"  scaling: time ~ L^{time_exponent:.2f}{span}")
        lines.append("")
    source = next((p.peak_source for p in points if p.peak_source), None)
    if source:
        lines.append(f"of peak: the device's dense peak in the dtype, {source}")
    return "\n".join(lines).rstrip()


def _percent(point: BenchPoint) -> str:
    return "-" if point.peak_fraction is None else f"{100 * point.peak_fraction:.1f}%"


def to_json(points: Sequence[BenchPoint], settings: dict) -> dict:
    return {
        "settings": settings,
        "points": [p.to_dict() for p in points],
        "exponents": {name: dict(zip(("time", "memory"), exponents(rows), strict=True))
                      for name, rows in _by_implementation(points).items()},
    }


def _quartiles(points: Sequence[BenchPoint], sdpa: bool = False) -> list[list[float]]:
    """Matplotlib's asymmetric ``yerr``: the distances from each median down to its first
    quartile and up to its third."""
    rows = [(p.sdpa_median_ms, p.sdpa_q1_ms, p.sdpa_q3_ms) if sdpa else
            (p.median_ms, p.q1_ms, p.q3_ms) for p in points]
    return [[max(m - (q1 if q1 is not None else m), 0.0) for m, q1, _ in rows],
            [max((q3 if q3 is not None else m) - m, 0.0) for m, _, q3 in rows]]


def plot_available() -> bool:
    """Whether matplotlib (``pip install 'attention-conformance[plot]'``) is importable."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def plot(points: Sequence[BenchPoint], path: str, heading: str) -> None:
    """Time and peak memory against length, log-log, one line per implementation (and SDPA)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    colours = plt.get_cmap("tab20").colors  # distinct for up to 20 implementations
    markers = "osD^v<>pPX*h"
    sdpa_drawn = False
    for index, (name, rows) in enumerate(_by_implementation(points).items()):
        measured = [p for p in rows if p.median_ms is not None]
        if not measured:
            continue
        lengths = [p.length for p in measured]
        style = dict(marker=markers[index % len(markers)], color=colours[index % len(colours)],
                     label=name, markersize=4)
        # Error bars: the interquartile range of the timed rounds.
        left.errorbar(lengths, [p.median_ms for p in measured], yerr=_quartiles(measured),
                      capsize=2, **style)
        right.plot(lengths, [p.peak_mb for p in measured], **style)
        if not sdpa_drawn:
            left.errorbar(lengths, [p.sdpa_median_ms for p in measured],
                          yerr=_quartiles(measured, sdpa=True), fmt="k--", capsize=2,
                          label="SDPA")
            right.plot(lengths, [p.sdpa_peak_mb for p in measured], "k--", label="SDPA")
            sdpa_drawn = True
    for axis, label in ((left, "median time per call (ms)"), (right, "peak memory (MB)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("sequence length")
        axis.set_ylabel(label)
        axis.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=7)
    figure.suptitle(heading, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
