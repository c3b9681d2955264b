"""The memory-bubble Pareto plot: bubble rate against peak activation memory, zbsearch's frontier
under every handcrafted and torch schedule, drawn with matplotlib (see figure.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from .figure import figure_format, require_matplotlib, save

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter


@dataclass(frozen=True)
class ParetoPoint:
    """One schedule on the memory-bubble plane.

    peak: peak activation memory on the busiest rank, in multiples of that rank's stage M_B.
    bubble: bubble rate under the plot's objective. limit: for a solved point, the memory limit it
    was solved under (same unit); bound: the bubble rate of the proven lower bound at that limit;
    bound_over: the placements that bound holds on ("linear", "linear and V-shape"): a schedule on another
    placement may sit below it.
    """

    label: str
    peak: float
    bubble: float
    source: str = "handcrafted"  # handcrafted | torch | zbsearch
    limit: float | None = None
    bound: float | None = None
    series: str = "zbsearch"  # solved points of one series share a frontier line
    bound_over: str | None = None


_SERIES_STYLES = [("black", "-"), ("#b2182b", "--"), ("#2166ac", "-.")]
_MARKERS = "osD^vP*Xp<>hH8d"
_POINT_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"]


def group_points(points: Sequence[ParetoPoint]) -> list[list[ParetoPoint]]:
    """Points that land on the same spot (to 6 decimals), in first-seen order: they share one marker."""
    groups: dict[tuple[float, float], list[ParetoPoint]] = {}
    for q in points:
        groups.setdefault((round(q.peak, 6), round(q.bubble, 6)), []).append(q)
    return list(groups.values())


def frontier(points: Sequence[ParetoPoint]) -> tuple[list[float], list[float]]:
    """The best bubble rate at or below each memory, as the corners of a step line (drawn 'post'):
    at memory x it is the lowest bubble of the points whose peak is at most x, since a schedule fits
    every limit at or above its own peak. Only the points that lower it make a corner."""
    xs: list[float] = []
    ys: list[float] = []
    for q in sorted(points, key=lambda q: (q.peak, q.bubble)):
        if not ys or q.bubble < ys[-1]:
            xs.append(q.peak)
            ys.append(q.bubble)
    return xs, ys


def _finite_limit(q: ParetoPoint) -> float | None:
    return q.limit if q.limit is not None and math.isfinite(q.limit) else None


def pareto_figure(points: Sequence[ParetoPoint], *, title: str, objective: str, p: int,
                  footer: str | None = None) -> Figure:
    """Bubble rate against peak activation memory: zbsearch's frontier (per series, the best bubble
    rate its solves found at or below each memory, with each solve's schedule at its actual peak and
    the proven bound dotted at its limit where it is below) under every handcrafted and torch
    schedule. Schedules on the same spot share a marker and are named together in the legend. The top
    axis gives memory in the paper's units of p x M_B."""
    Figure = require_matplotlib()
    solved = sorted((q for q in points if q.source == "zbsearch"), key=lambda q: (q.limit or q.peak))
    series = list(dict.fromkeys(q.series for q in solved))
    groups = group_points([q for q in points if q.source != "zbsearch"])
    labels = [" = ".join(m.label for m in g) for g in groups] + [f"{s}: best found at or below each limit"
                                                                  for s in series]
    legend_in = min(6.0, max(2.6, 0.068 * max((len(x) for x in labels), default=20) + 0.5))
    fig_w, plot_w = 7.6 + legend_in, 6.6
    fig = Figure(figsize=(fig_w, 5.6))
    ax = fig.add_axes((0.75 / fig_w, 0.11, plot_w / fig_w, 0.72))
    limits = [x for x in map(_finite_limit, solved) if x is not None]
    xs = [q.peak for q in points] + limits
    xmax = max(xs) * 1.08 if xs else 1.0
    for x in sorted(set(limits)):
        ax.axvline(x, color="#e4e4e4", linewidth=0.8, zorder=0)
    for k, name in enumerate(series):
        _draw_series(ax, [q for q in solved if q.series == name], name, _SERIES_STYLES[k % len(_SERIES_STYLES)], xmax)
    for i, members in enumerate(groups):
        q = members[0]
        ax.scatter([q.peak], [q.bubble], marker=_MARKERS[i % len(_MARKERS)], s=80,
                   color=_POINT_COLORS[i % len(_POINT_COLORS)], edgecolor="black", linewidth=0.6, zorder=7,
                   label=" = ".join(m.label for m in members))
    _style_axes(ax, points, xmax, objective, p)
    fig.text(0.75 / fig_w, 0.975, title, ha="left", va="top", fontsize=10.5, weight="bold")
    ax.legend(loc="upper left", bbox_to_anchor=(1.03, 1.0), fontsize=8, frameon=False, borderaxespad=0.0,
              labelspacing=0.7)
    if footer:
        fig.text(0.75 / fig_w, 0.012, footer, ha="left", va="bottom", fontsize=7, color="#555555")
    return fig


def _draw_series(ax: Axes, mine: list[ParetoPoint], name: str, style: tuple[str, str], xmax: float) -> None:
    """One series' frontier, its schedules at their actual peaks, and its bounds at their limits."""
    color, line = style
    front_x, front_y = frontier(mine)
    ax.step(front_x + [xmax], front_y + [front_y[-1]], where="post", color=color, linestyle=line, linewidth=1.6,
            zorder=3, label=f"{name}: best found at or below each limit")
    ax.scatter([q.peak for q in mine], [q.bubble for q in mine], marker="o", s=22, color=color,
               edgecolor="white", linewidth=0.6, zorder=6, label=f"{name}: schedule, at its actual peak")
    if any(q.bound is not None and q.bound < q.bubble - 1e-9 for q in mine):
        at = [(x if x is not None else q.peak, q.bound) for q, x in zip(mine, map(_finite_limit, mine))
              if q.bound is not None]
        over = {q.bound_over for q in mine if q.bound_over is not None}
        where = f", on the {' / '.join(sorted(over))} placement{'s' if any(' and ' in o for o in over) else ''} only" \
            if over else ""
        ax.plot([x for x, _ in at], [b for _, b in at], linestyle=":", marker="_", markersize=10, color=color,
                linewidth=1.2, zorder=3, label=f"{name}: proven lower bound at that limit{where}")


# ax: Any, not Axes: its secondary_xaxis types the unit conversions over ArrayLike, which plain lambdas fail
def _style_axes(ax: Any, points: Sequence[ParetoPoint], xmax: float, objective: str, p: int) -> None:
    ax.set_xlim(0, xmax)
    ys = [q.bubble for q in points]
    ax.set_ylim(min(0.0, min(ys, default=0.0)), max(ys, default=0.1) * 1.1 + 0.005)
    ax.set_xlabel("peak activation memory on the busiest rank (x its stage M_B)", fontsize=9)
    ax.set_ylabel(f"bubble rate ({objective})", fontsize=9)
    ax.yaxis.set_major_formatter(_percent())
    ax.grid(color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)
    top = ax.secondary_xaxis("top", functions=(lambda x: x / p, lambda x: x * p))
    top.set_xlabel("the same in units of p x M_B (the paper's 1p, 2p limits)", fontsize=9)
    top.tick_params(labelsize=8)
    ax.tick_params(labelsize=8)


def _percent() -> FuncFormatter:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda y, _pos: f"{100 * y:.0f}%" if abs(y) >= 0.1 or y == 0 else f"{100 * y:.1f}%")


def plot_pareto(points: Sequence[ParetoPoint], path: str | Path, *, title: str, objective: str, p: int,
                footer: str | None = None) -> Path:
    """Draw the Pareto plot (see pareto_figure) and write it to `path` (.png or .svg)."""
    figure_format(path)
    return save(pareto_figure(points, title=title, objective=objective, p=p, footer=footer), path)
