"""Gantt charts of schedules, drawn with matplotlib (see figure.py for how figures are made).

The charts follow the papers' pictures: one row per rank (rank 0 on top), time to the right, one
colour per pass kind (F blue, B green, W yellow as in the terminal chart of render.py; the fused
backward BW orange, where the terminal uses cyan, so it stays apart from a second chunk's light blue F;
a DualPipe F&B pair is drawn as its two halves), the microbatch number in each cell when it fits, a
lighter shade for a rank's second (fourth, ...) chunk, and on the right of each row that rank's idle
time and peak activation memory (in multiples of the rank's stage M_B). Layout is computed in inches,
so labels never overlap at any p: charts grow with the pass count and the rank count, and a cell too
narrow for its number is left unlabelled.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..core.errors import ZbsearchError
from ..core.ir import Action, Kind
from ..sim.simulate import Timeline
from .figure import figure_format, require_matplotlib, save, time_scale
from .render import fmt_number
from ..core.objective import Objective

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# (even local chunk, odd local chunk): a strong and a light shade of one hue per kind. The hues stay
# apart for the common colour-vision deficiencies (blue / green / yellow / orange differ in lightness
# as well as hue), and the light shades keep the hue of their kind.
KIND_COLORS: dict[Kind, tuple[str, str]] = {
    Kind.F: ("#3465a4", "#9fbfe8"),
    Kind.B: ("#2e9451", "#9ad9ad"),
    Kind.W: ("#e8b419", "#f6e09a"),
    Kind.FULL_B: ("#d2601a", "#f2b48c"),
}
KIND_LEGEND: dict[Kind, str] = {
    Kind.F: "F forward",
    Kind.B: "B backward, inputs (torch I)",
    Kind.W: "W backward, weights",
    Kind.FULL_B: "BW full backward (torch B)",
    Kind.OVERLAP: "F&B overlapped pair (top F, bottom its backward)",
}
IDLE_COLOR = "#f4f4f4"

# Layout, in inches.
_LEFT = 0.75  # rank labels
_RIGHT = 1.9  # per-rank idle / peak annotation
_TITLE = 0.36
_XAXIS = 0.55
_LEGEND_ROW = 0.22
_CELL_IN = 0.17  # width of a typical short pass (room for a two-digit number), before clamping
_MIN_WIDTH, _MAX_WIDTH = 6.0, 40.0
_MIN_FONT = 4.0  # points; cell numbers that would need a smaller font are left out

Box = list[tuple[float, float]]


def _local_odd(timeline: Timeline, rank: int, action: Action) -> bool:
    chunk = action.pair[0].chunk if action.kind is Kind.OVERLAP else action.chunk
    chunks = timeline.schedule.placement.chunks_on(rank)
    return chunk in chunks and chunks.index(chunk) % 2 == 1


def _text_color(hex_color: str) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.55 else "black"


def _short_pass(timeline: Timeline) -> float:
    """A typical short pass of the chart: the 10th percentile of its pass durations."""
    durations = sorted(s.end - s.start for s in timeline.iter_slots() if s.end > s.start)
    return durations[len(durations) // 10] if durations else 1.0


def chart_width(timelines: Sequence[Timeline]) -> float:
    """Width of the drawing area in inches: wide enough that, on the shared time axis, a typical short
    pass of every chart is _CELL_IN wide (room for a two-digit microbatch number), clamped."""
    xmax = max(t.makespan for t in timelines)
    need = max(_CELL_IN * xmax / _short_pass(t) for t in timelines)
    return min(_MAX_WIDTH, max(_MIN_WIDTH, need))


def _row_height(p: int) -> float:
    return 0.26 if p <= 16 else max(0.12, 4.2 / p)


def _chart_height(p: int) -> float:
    return _row_height(p) * p + 0.1


def _box(x0: float, x1: float, y0: float, y1: float) -> Box:
    return [(x0, y0), (x0, y1), (x1, y1), (x1, y0)]


def draw_gantt(ax: Axes, timeline: Timeline, *, xmax: float | None = None, title: str | None = None,
               annotate: bool = True, divisor: float = 1.0, width_in: float | None = None) -> set[Kind]:
    """Draw one schedule's chart on `ax`; return the pass kinds it shows (for the legend).

    `xmax` fixes the time axis (a grid shares one); `divisor` scales times for display (see
    time_scale); `width_in` is the axes width in inches, used to decide which cells can carry their
    microbatch number.
    """
    p = timeline.num_ranks
    xmax = (xmax if xmax is not None else timeline.makespan) / divisor or 1.0
    pts_per_time = (width_in if width_in is not None else 8.0) * 72 / xmax
    row_pts = _row_height(p) * 72 * 0.8
    # One font size per chart: the largest that fits the row and puts the widest microbatch number
    # into a typical short pass; a cell too narrow for it stays unlabelled rather than shrinking.
    digits = len(str(max(timeline.schedule.num_microbatches - 1, 0)))
    short_pts = _short_pass(timeline) / divisor * pts_per_time
    font = min(8.0, row_pts * 0.62, 0.97 * (short_pts - 1.5) / (0.62 * digits))
    ax.set_xlim(0, xmax)
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_facecolor("white")
    seen = _draw_passes(ax, timeline, divisor, pts_per_time, font)
    _style_axes(ax, p, row_pts, title)
    if annotate:
        _annotate_ranks(ax, timeline, divisor, row_pts)
    return seen


def _draw_passes(ax: Axes, timeline: Timeline, divisor: float, pts_per_time: float, font: float) -> set[Kind]:
    """The idle background of each rank, then one cell per pass (two halves for an F&B pair) with its
    microbatch number where the font fits; returns the kinds drawn."""
    from matplotlib.collections import PolyCollection

    end = timeline.makespan / divisor
    idle = [_box(0, end, r - 0.4, r + 0.4) for r in range(timeline.num_ranks)]
    ax.add_collection(PolyCollection(idle, facecolors=IDLE_COLOR, edgecolors="none", zorder=0))
    seen: set[Kind] = set()
    cells: list[Box] = []
    faces: list[str] = []
    widths: list[float] = []
    outlines: list[Box] = []
    for slot in timeline.iter_slots():
        a = slot.action
        odd = _local_odd(timeline, slot.rank, a)
        x0, x1, y = slot.start / divisor, slot.end / divisor, slot.rank
        seen.add(a.kind)
        thin = 0.5 if (x1 - x0) * pts_per_time > 4 else 0.0
        if a.kind is Kind.OVERLAP:
            fwd, bwd = a.pair
            cells += [_box(x0, x1, y - 0.4, y), _box(x0, x1, y, y + 0.4)]
            faces += [KIND_COLORS[Kind.F][odd], KIND_COLORS[bwd.kind][odd]]
            widths += [thin, thin]
            outlines.append(_box(x0, x1, y - 0.4, y + 0.4))
            label, color = f"{fwd.microbatch}&{bwd.microbatch}", KIND_COLORS[Kind.F][odd]
        else:
            color = KIND_COLORS[a.kind][odd]
            cells.append(_box(x0, x1, y - 0.4, y + 0.4))
            faces.append(color)
            widths.append(thin)
            label = str(a.microbatch)
        if font >= _MIN_FONT and (x1 - x0) * pts_per_time >= 0.62 * font * len(label) + 1.5:
            ax.text((x0 + x1) / 2, y, label, ha="center", va="center", fontsize=font, color=_text_color(color),
                    zorder=4, clip_on=True)
    ax.add_collection(PolyCollection(cells, facecolors=faces, edgecolors="white", linewidths=widths, zorder=2))
    if outlines:
        ax.add_collection(PolyCollection(outlines, facecolors="none", edgecolors="#333333", linewidths=0.6, zorder=3))
    return seen


def _style_axes(ax: Axes, p: int, row_pts: float, title: str | None) -> None:
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"rank {r}" for r in range(p)], fontsize=min(8.5, max(5.0, row_pts * 0.7)))
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#dddddd", linewidth=0.5, zorder=-1)
    ax.set_axisbelow(True)
    if title:
        ax.set_title(title, loc="left", fontsize=9.5, pad=4)


def _annotate_ranks(ax: Axes, timeline: Timeline, divisor: float, row_pts: float) -> None:
    """Each rank's idle time and peak memory (x its stage M_B), right of its row."""
    p = timeline.num_ranks
    twin = ax.twinx()
    twin.set_ylim(ax.get_ylim())
    twin.set_yticks(range(p))
    work = [timeline.work(r) for r in range(p)]
    peaks = [timeline.peak_memory(r) / timeline.profile.stage_mem_B(r) for r in range(p)]
    twin.set_yticklabels(
        [f"idle {fmt_number((timeline.makespan - work[r]) / divisor)}  peak {peaks[r]:.3g}" for r in range(p)],
        fontsize=min(8.0, max(5.0, row_pts * 0.65)), family="DejaVu Sans Mono")
    twin.tick_params(axis="y", length=0)
    for side in twin.spines.values():
        side.set_visible(False)


def _legend_items(kinds: set[Kind], chunked: bool) -> list[tuple[str, str, str]]:
    """(label, face colour, edge colour) of each legend entry."""
    items = [(KIND_LEGEND[k], KIND_COLORS[Kind.F if k is Kind.OVERLAP else k][0],
              "#333333" if k is Kind.OVERLAP else "none")
             for k in (Kind.F, Kind.B, Kind.W, Kind.FULL_B, Kind.OVERLAP) if k in kinds]
    items.append(("idle", IDLE_COLOR, "#cccccc"))
    if chunked:
        items.append(("light shade: the rank's 2nd chunk", "#bbbbbb", "none"))
    return items


def _legend_columns(items: list[tuple[str, str, str]], width_in: float) -> int:
    """As many columns as fit in `width_in` (about 0.075 in per character at 8 pt, plus the patch)."""
    widest = max(len(label) for label, _, _ in items) * 0.075 + 0.55
    return max(1, min(len(items), int(width_in // widest)))


def _legend(fig: Figure, items: list[tuple[str, str, str]], ncol: int, bottom_in: float, height_in: float) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=face, edgecolor=edge, label=label) for label, face, edge in items]
    fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(_LEFT / fig.get_figwidth(), bottom_in / height_in),
               ncol=ncol, fontsize=8, frameon=False, handlelength=1.4, columnspacing=1.4, borderaxespad=0.0)


def default_title(timeline: Timeline, objective: Objective | str = Objective.MAKESPAN) -> str:
    """'name: bubble 12.3% of makespan, makespan 1,234 us, peak 8 x M_B'."""
    objective = Objective.parse(objective)
    rate = timeline.bubble_rate_makespan if objective is Objective.MAKESPAN else timeline.bubble_rate_span
    cost = objective.of(timeline)
    peak = max(timeline.peak_memory(r) / timeline.profile.stage_mem_B(r) for r in range(timeline.num_ranks))
    return (f"{timeline.schedule.name}: bubble {rate:.2%} of {objective}, {objective} {fmt_number(cost)} "
            f"{timeline.profile.time_unit}, peak {peak:.3g} x M_B")


def gantt_grid_figure(charts: Sequence[tuple[str, Timeline]], *, annotate: bool = True,
                      suptitle: str | None = None, footer: str | None = None) -> Figure:
    """One figure with a chart per (title, timeline), stacked on one shared time axis; `footer` is a
    small line under the legend (e.g. the command that regenerates the figure)."""
    if not charts:
        raise ZbsearchError("nothing to draw: give at least one schedule")
    Figure = require_matplotlib()
    timelines = [t for _, t in charts]
    xmax = max(t.makespan for t in timelines)
    unit, divisor = time_scale(timelines[0].profile.time_unit, xmax)
    width_in = chart_width(timelines)
    kinds = {s.action.kind for t in timelines for s in t.iter_slots()}
    chunked = any(t.schedule.placement.chunks_per_rank > 1 for t in timelines)
    fig_w = _LEFT + width_in + (_RIGHT if annotate else 0.3)
    items = _legend_items(kinds, chunked)
    ncol = _legend_columns(items, fig_w - _LEFT - 0.1)
    legend_in = _LEGEND_ROW * math.ceil(len(items) / ncol) + 0.1 + (0.22 if footer else 0.0)
    top_in = 0.45 if suptitle else 0.1
    heights = [_chart_height(t.num_ranks) for t in timelines]
    fig_h = top_in + sum(h + _TITLE for h in heights) + 0.15 * (len(charts) - 1) + _XAXIS + legend_in
    fig = Figure(figsize=(fig_w, fig_h))
    y = fig_h - top_in
    axes = []
    for (title, tl), h in zip(charts, heights):
        y -= _TITLE + h
        ax = fig.add_axes((_LEFT / fig_w, y / fig_h, width_in / fig_w, h / fig_h))
        draw_gantt(ax, tl, xmax=xmax, title=title, annotate=annotate, divisor=divisor, width_in=width_in)
        axes.append(ax)
        y -= 0.15
    for ax in axes[:-1]:
        ax.tick_params(axis="x", labelbottom=False)
    axes[-1].set_xlabel(f"time ({unit})", fontsize=9)
    if suptitle:
        fig.text(_LEFT / fig_w, 1 - 0.12 / fig_h, suptitle, ha="left", va="top", fontsize=11, weight="bold")
    _legend(fig, items, ncol, 0.08 + (0.22 if footer else 0.0), fig_h)
    if footer:
        fig.text(_LEFT / fig_w, 0.06 / fig_h, footer, ha="left", va="bottom", fontsize=7, color="#555555")
    return fig


def gantt_figure(timeline: Timeline, *, title: str | None = None, annotate: bool = True) -> Figure:
    """A single schedule's chart (see draw_gantt), titled with its bubble rate and peak memory."""
    return gantt_grid_figure([(title if title is not None else default_title(timeline), timeline)],
                             annotate=annotate)


def plot_gantt(timeline: Timeline, path: str | Path, *, title: str | None = None, annotate: bool = True) -> Path:
    """Draw one schedule's Gantt chart and write it to `path` (.png or .svg)."""
    figure_format(path)
    return save(gantt_figure(timeline, title=title, annotate=annotate), path)


def plot_gantt_grid(charts: Sequence[tuple[str, Timeline]], path: str | Path, *, annotate: bool = True,
                    suptitle: str | None = None, footer: str | None = None) -> Path:
    """Draw several charts on one time axis and write them to `path` (.png or .svg)."""
    figure_format(path)
    return save(gantt_grid_figure(charts, annotate=annotate, suptitle=suptitle, footer=footer), path)
