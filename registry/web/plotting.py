"""Server-side plots with matplotlib's object-oriented API (Agg canvas, no pyplot state).

A figure is built from a :class:`PlotSpec` that the caller has already reduced to display
size, so rendering costs the same for a 1,000-point and a 1,000,000-point series. Every
``Figure`` is local to one call, which keeps rendering safe in a threaded server.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator

# Dark colours for smoothed lines; the raw points use the same hue mixed with white.
PALETTE = ("#1f5fa8", "#c8372d", "#2a8a3e", "#7b4fb0", "#d9770f", "#7a5230", "#c2448f", "#138a99",
           "#555555", "#8f8a12")
SINGLE_RAW = "#a9c9ea"
SINGLE_SMOOTH = "#17467f"
HEALTHY_FILL = "#dcf0d5"
HEALTHY_EDGE = "#6aa85a"
WARNING_RED = "#b3261e"
# Findings of the run's diagnosis, shaded over their step range (fill, and the strip along the top).
SPAN_COLORS = {"critical": ("#f6c9c4", "#c5221f"), "warning": ("#fbe3b0", "#d98a00")}
FORMATS = {"png": "image/png", "svg": "image/svg+xml"}


MAX_LABEL = 60


def plain(text: str, limit: int = MAX_LABEL) -> str:
    """User text drawn literally: no mathtext (``$...$`` in a run name must not be parsed), bounded length."""
    text = str(text)
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return text.replace("$", r"\$")


def light(color: str, amount: float = 0.62) -> str:
    """``color`` mixed with ``amount`` of white (raw points under a dark smoothed line)."""
    r, g, b = to_rgb(color)
    return to_hex((r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount))


@dataclass
class Trace:
    """One run (or one seed group) on a plot: raw points light, smoothed line dark."""

    label: str | None
    color: str
    raw_x: np.ndarray | None = None
    raw_y: np.ndarray | None = None
    smooth_x: np.ndarray | None = None
    smooth_y: np.ndarray | None = None
    raw_color: str | None = None
    linestyle: str = "-"
    band_x: np.ndarray | None = None       # seed group: min-max or mean +- std
    band_low: np.ndarray | None = None
    band_high: np.ndarray | None = None
    nonfinite_x: np.ndarray | None = None  # steps whose value was NaN or Inf
    raw_markers: bool = False              # raw points as dots: steps holding several points


@dataclass
class PlotSpec:
    traces: list[Trace]
    xlabel: str = "step"
    ylabel: str | None = None  # the definition's unit ("nats per token"), None when unknown
    title: str | None = None
    healthy: tuple[float | None, float | None] | None = None
    ylim: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)      # grey, top left ("downsampled ...")
    warnings: list[str] = field(default_factory=list)   # red banner: semantic differences
    legend: bool = False
    width: float = 5.0
    height: float = 2.6
    dpi: int = 110
    fraction_axis: bool = False
    spans: list[tuple[float, float, str, str]] = field(default_factory=list)  # (start, end, severity, label)


def _limits(spec: PlotSpec) -> tuple[float, float] | None:
    if spec.ylim is None:
        return None
    lo, hi = spec.ylim
    span = hi - lo
    band_lo, band_hi = spec.healthy or (None, None)
    # Show the healthy band when it is near the data; a far-away band would flatten the curve.
    for bound in (band_lo, band_hi):
        if bound is not None and np.isfinite(bound):
            new_lo, new_hi = min(lo, bound), max(hi, bound)
            if span <= 0 or (new_hi - new_lo) <= 3 * span:
                lo, hi = new_lo, new_hi
    span = hi - lo
    if span <= 0:
        pad = abs(hi) * 0.05 or 0.5
    else:
        pad = span * 0.06
    return lo - pad, hi + pad


def _x_extent(spec: PlotSpec) -> tuple[float, float] | None:
    xs = [t.raw_x if t.raw_x is not None and len(t.raw_x) else t.smooth_x for t in spec.traces]
    xs = [x for x in xs if x is not None and len(x)]
    if not xs:
        return None
    return float(min(x[0] for x in xs)), float(max(x[-1] for x in xs))


def _draw_spans(ax: Any, spec: PlotSpec) -> None:
    """Findings as shaded step ranges: a light fill over the plot and a strong strip along its top.

    A finding at a single step (a KL spike) gets a minimum width of 1% of the x range so
    it stays visible; critical ones are drawn over warnings.
    """
    extent = _x_extent(spec)
    width = (extent[1] - extent[0]) if extent and extent[1] > extent[0] else 1.0
    order = sorted(spec.spans, key=lambda s: s[2] == "critical")
    for start, end, severity, label in order:
        fill, edge = SPAN_COLORS.get(severity, SPAN_COLORS["warning"])
        x0, x1 = float(start), float(end)
        if x1 - x0 < 0.01 * width:
            mid = (x0 + x1) / 2
            x0, x1 = mid - 0.005 * width, mid + 0.005 * width
        ax.axvspan(x0, x1, color=fill, alpha=0.45, zorder=0.5, linewidth=0)
        ax.axvspan(x0, x1, ymin=0.965, ymax=1.0, color=edge, zorder=6, linewidth=0)
        if x1 - x0 <= 0.012 * width:
            ax.axvline((x0 + x1) / 2, color=edge, linewidth=0.8, alpha=0.8, zorder=2)


def wrap_notes(notes: list[str], width: int, max_lines: int = 2) -> list[str]:
    """The notes joined by " · " into at most ``max_lines`` lines of about ``width`` characters."""
    lines: list[str] = []
    for note in notes:
        if lines and len(lines[-1]) + 5 + len(note) <= width:
            lines[-1] += "  \u00b7  " + note
        else:
            lines.append(note)
    if len(lines) > max_lines:
        lines = lines[:max_lines - 1] + ["  \u00b7  ".join(lines[max_lines - 1:])]
    return [plain(line, width) for line in lines]


def render(spec: PlotSpec, fmt: str = "png") -> bytes:
    """The plot as PNG or SVG bytes."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}")
    left = 0.12 + (0.035 * 5.0 / spec.width if spec.ylabel else 0.0)
    note_lines = wrap_notes(spec.notes, int((0.985 - left) * spec.width * 72 / (7.2 * 0.55)))
    top_space = 0.1 + 0.085 * len(spec.warnings) + (0.07 if spec.title else 0.0) + \
        0.075 * 2.6 / spec.height * max(0, len(note_lines) - 1)
    fig = Figure(figsize=(spec.width, spec.height + 0.22 * len(spec.warnings)), dpi=spec.dpi)
    FigureCanvasAgg(fig)
    fig.patch.set_facecolor("white")
    fig.subplots_adjust(left=left, right=0.985, bottom=0.15, top=1 - min(top_space, 0.5))
    ax = fig.add_subplot()
    ax.set_facecolor("white")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color("#9a9a9a")
    ax.tick_params(labelsize=7.5, colors="#444444", length=3)
    ax.grid(True, color="#ececec", linewidth=0.7)
    ax.set_axisbelow(True)
    ax.xaxis.set_major_locator(MaxNLocator(6))
    ax.yaxis.set_major_locator(MaxNLocator(5))
    if not spec.fraction_axis:
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel(spec.xlabel, fontsize=7.5, color="#555555", labelpad=1)
    if spec.ylabel:
        # As many characters as fit the plot's height at this size.
        ax.set_ylabel(plain(spec.ylabel, int(spec.height * 72 * 0.8 / (7.5 * 0.55))), fontsize=7.5, color="#555555",
                      labelpad=2)

    limits = _limits(spec)
    if spec.healthy is not None:
        low, high = spec.healthy
        if low is not None or high is not None:
            y0 = low if low is not None else (limits[0] if limits else -1e300)
            y1 = high if high is not None else (limits[1] if limits else 1e300)
            ax.axhspan(y0, y1, color=HEALTHY_FILL, zorder=0, linewidth=0)
            for bound in (low, high):
                if bound is not None:
                    ax.axhline(bound, color=HEALTHY_EDGE, linewidth=0.7, linestyle=(0, (4, 3)), zorder=1)

    if spec.spans:
        _draw_spans(ax, spec)

    for trace in spec.traces:
        if trace.band_x is not None and len(trace.band_x):
            ax.fill_between(trace.band_x, trace.band_low, trace.band_high, color=light(trace.color, 0.72),
                            linewidth=0, zorder=2)
        if trace.raw_x is not None and len(trace.raw_x):
            if trace.raw_markers:  # several points at a step: a line through them would zigzag
                ax.plot(trace.raw_x, trace.raw_y, ".", color=trace.raw_color or light(trace.color),
                        markersize=2.5, zorder=3)
            else:
                ax.plot(trace.raw_x, trace.raw_y, color=trace.raw_color or light(trace.color), linewidth=0.8,
                        linestyle=trace.linestyle, zorder=3, solid_joinstyle="round")
        if trace.smooth_x is not None and len(trace.smooth_x):
            ax.plot(trace.smooth_x, trace.smooth_y, color=trace.color, linewidth=1.6, linestyle=trace.linestyle,
                    label=plain(trace.label) if trace.label else None, zorder=4)
            ax.plot(trace.smooth_x[-1:], trace.smooth_y[-1:], "o", color=trace.color, markersize=3, zorder=5)
        elif trace.label and trace.raw_x is not None and len(trace.raw_x):
            ax.plot([], [], color=trace.color, linestyle=trace.linestyle, label=plain(trace.label))
        if trace.nonfinite_x is not None and len(trace.nonfinite_x):
            ax.plot(trace.nonfinite_x, np.full(len(trace.nonfinite_x), 0.015), "|", color=WARNING_RED,
                    markersize=6, transform=ax.get_xaxis_transform(), zorder=6, clip_on=False)

    if limits is not None:
        ax.set_ylim(*limits)
    if spec.legend and any(t.label for t in spec.traces):
        ax.legend(fontsize=7, frameon=False, loc="best", handlelength=1.8)

    y = 0.985
    if spec.title:
        fig.text(0.012, y, plain(spec.title, 120), fontsize=9, color="#222222", va="top", weight="bold")
        y -= 0.075
    for text in spec.warnings:
        # One line each: as many characters as fit the figure's width (the page shows the full text).
        fig.text(0.012, y, "\u26a0 " + plain(text, int(spec.width * 72 / (7.5 * 0.62))), fontsize=7.5, color="white",
                 va="top", weight="bold",
                 bbox={"boxstyle": "square,pad=0.25", "facecolor": WARNING_RED, "edgecolor": "none"})
        y -= 0.085
    if spec.notes:
        # Dark enough to read on white at the plot's small size (it says what was left out); notes
        # that do not fit one line go on a second one rather than being cut.
        ax.text(0.005, 1.01, "\n".join(note_lines), transform=ax.transAxes, fontsize=7.2, color="#4a4a4a",
                va="bottom", ha="left", linespacing=1.25)

    buf = io.BytesIO()
    if fmt == "png":
        fig.savefig(buf, format="png", metadata={"Software": None})
    else:
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()
