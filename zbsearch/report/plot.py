"""Figures: Gantt charts of schedules (gantt.py) and a memory-bubble Pareto plot (pareto.py), drawn
with matplotlib, which is needed only when a figure is drawn (figure.py). This module gathers their
public names, so `from zbsearch.report.plot import plot_gantt, plot_pareto` reaches them all."""

from __future__ import annotations

from .figure import FORMATS, INSTALL_HINT, figure_format, require_matplotlib, save, time_scale
from .gantt import (IDLE_COLOR, KIND_COLORS, KIND_LEGEND, chart_width, default_title, draw_gantt, gantt_figure,
    gantt_grid_figure, plot_gantt, plot_gantt_grid)
from .pareto import ParetoPoint, frontier, group_points, pareto_figure, plot_pareto

__all__ = [
    "FORMATS", "IDLE_COLOR", "INSTALL_HINT", "KIND_COLORS", "KIND_LEGEND", "ParetoPoint", "chart_width",
    "default_title", "draw_gantt", "figure_format", "frontier", "gantt_figure", "gantt_grid_figure",
    "group_points", "pareto_figure", "plot_gantt", "plot_gantt_grid", "plot_pareto", "require_matplotlib", "save",
    "time_scale",
]
