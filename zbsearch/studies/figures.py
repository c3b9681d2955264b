"""A comparison as figures: a grid of Gantt charts on one time axis and a memory-bubble Pareto plot
per microbatch count (drawn by report/plot.py; matplotlib is needed only to draw)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from ..core.memory import parse_mem_limit
from ..core.placement import AUTO_PLACEMENTS
from ..report.render import fmt_number
from ..sim.simulate import Timeline
from ..report import plot
from ..report.plot import ParetoPoint
from .rows import Comparison, Row
from .tables import pct



def chart_title(row: Row) -> str:
    """'zb-h1: bubble 15.85% (makespan), peak 8 x M_B' plus the limit for solved rows."""
    what = f"zbsearch at {row.mem_limit}" if row.source == "zbsearch" else row.schedule
    over = "" if row.within_limit else f", over {row.mem_limit}"
    extra = f", {row.status}, {row.note}" if row.source == "zbsearch" else ""
    return (f"{what}: bubble {pct(row.bubble_rate)} ({row.objective}), {row.objective} "
            f"{fmt_number(row.cost)}, peak {row.peak_memory:.3g} x M_B{over}{extra}")


def gantt_charts(comp: Comparison, m: int) -> list[tuple[str, Timeline]]:
    """(title, timeline) of every distinct schedule at m: each fixed schedule once, zbsearch per limit."""
    charts: list[tuple[str, Timeline]] = []
    seen: set[str] = set()
    for r in comp.rows_for(m):
        if r.timeline is None or (r.source != "zbsearch" and r.schedule in seen):
            continue
        seen.add(r.schedule)
        row = r if r.source == "zbsearch" else _best_limit_row(comp, m, r.schedule)
        charts.append((chart_title(row), r.timeline))
    return charts


def _best_limit_row(comp: Comparison, m: int, name: str) -> Row:
    """A fixed schedule's row at the smallest limit it fits (else the last), for its chart title."""
    rows = [r for r in comp.rows_for(m) if r.schedule == name]
    return next((r for r in rows if r.within_limit), rows[-1])


def pareto_points(rows: Sequence[Row], series: str = "zbsearch", placement: str | None = None) -> list[ParetoPoint]:
    """Points for plot.pareto_figure: each fixed schedule once, each solved row with its limit, in
    the frontier `series`; `placement`: what the solved rows were solved on (compare's --placement), which
    their bounds hold on."""
    over = None if placement is None else placement_words(placement)

    points, seen = [], set()
    for r in rows:
        if r.source == "zbsearch":
            points.append(ParetoPoint(f"zbsearch at {r.mem_limit}", r.peak_memory, r.bubble_rate, "zbsearch",
                                      _limit_in_stage_units(r), r.bubble_rate_lower_bound, series, over))
        elif r.schedule not in seen:
            seen.add(r.schedule)
            points.append(ParetoPoint(r.schedule, r.peak_memory, r.bubble_rate, r.source))
    return points


def placement_words(placement: str) -> str:
    """A placement as the figures name it: `auto` is every placement it tries.

    >>> placement_words("auto"), placement_words("v"), placement_words("interleaved:2")
    ('linear and V-shape', 'V-shape', 'interleaved:2')
    """
    words = {"linear": "linear", "v": "V-shape", "dualpipe": "DualPipe"}
    if placement.strip().lower() == "auto":
        return " and ".join(words[name] for name in AUTO_PLACEMENTS)
    return words.get(placement.strip().lower(), placement)


def _limit_in_stage_units(row: Row) -> float | None:
    """The row's limit on its busiest rank in stage M_B units; None without a timeline or a finite limit."""
    tl = row.timeline
    if tl is None:
        return None
    limit = parse_mem_limit(row.mem_limit, tl.profile).in_stage_units(tl.profile)
    return max(limit) if all(math.isfinite(x) for x in limit) else None


def figure_paths(prefix: str | Path, comp: Comparison, fmt: str) -> dict[tuple[str, int], Path]:
    """Where write() puts each figure: PREFIX_gantt.FMT and PREFIX_pareto.FMT, with _mM before the
    kind when several microbatch counts are compared."""
    prefix = Path(prefix)
    out = {}
    for m in comp.microbatches:
        tag = f"_m{m}" if len(comp.microbatches) > 1 else ""
        out[("gantt", m)] = prefix.with_name(f"{prefix.name}{tag}_gantt.{fmt}")
        out[("pareto", m)] = prefix.with_name(f"{prefix.name}{tag}_pareto.{fmt}")
    return out


def write_figures(comp: Comparison, prefix: str | Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """The Gantt grid and the Pareto plot of each microbatch count, in each format."""

    written: list[Path] = []
    prof = comp.profile
    setup = prof.name if f"p={prof.num_stages}" in prof.name else f"{prof.name}, p={prof.num_stages}"
    series = f"zbsearch ({comp.placement} placement)"
    footer = f"regenerate: {comp.command}" if comp.command else None
    for fmt in formats:
        paths = figure_paths(prefix, comp, fmt)
        for m in comp.microbatches:
            charts = gantt_charts(comp, m)
            if charts:
                title = f"{setup}, m={m}: every compared schedule on one time axis"
                written.append(plot.plot_gantt_grid(charts, paths[("gantt", m)], suptitle=title, footer=footer))
            points = pareto_points(comp.rows_for(m), series, comp.placement)
            if points:
                title = f"{setup}, m={m}: bubble rate ({comp.objective}) against peak activation memory"
                written.append(plot.plot_pareto(points, paths[("pareto", m)], title=title, objective=comp.objective,
                                                p=prof.num_stages, footer=footer))
    return written
