"""What every figure shares: loading matplotlib, telling the format from a file name, writing a
figure atomically, and time units short enough for axis ticks.

matplotlib is an optional dependency (`pip install 'zbsearch[plot]'`): it is imported only when a
figure is drawn, and its absence is a one-line DependencyError. Nothing here touches pyplot's global
state: every figure is a `matplotlib.figure.Figure` rendered by the Agg (PNG) or SVG backend, so
figures can be drawn from any thread and never open a window.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import DependencyError, FileError
from ..core.fileio import write_atomic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'zbsearch[plot]' (matplotlib>=3.7)"
FORMATS = ("png", "svg")
_MAX_PIXELS = 16000  # PNG dpi is lowered so that no side exceeds this


def require_matplotlib() -> type[Figure]:
    """The Figure class, or a one-line error saying how to install matplotlib."""
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        raise DependencyError(f"figures need matplotlib, which is not installed: {INSTALL_HINT}") from None
    matplotlib.rcParams["svg.hashsalt"] = "zbsearch"  # reproducible SVG ids
    return Figure


def figure_format(path: str | Path) -> str:
    """'png' or 'svg' from the file name, or a FileError saying what to write."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise FileError(f"cannot tell the figure format of {str(path)!r}: end the name in .png or .svg")
    return suffix


def save(fig: Figure, path: str | Path, dpi: float = 130) -> Path:
    """Write a figure to `path` (PNG or SVG by its suffix) atomically; returns the path."""
    fmt = figure_format(path)
    width, height = fig.get_size_inches()
    dpi = min(dpi, _MAX_PIXELS / max(width, height))
    buf = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    fig.savefig(buf, format=fmt, dpi=dpi, metadata=metadata, facecolor="white")
    write_atomic(path, buf.getvalue())
    return Path(path)


_LARGER = {"us": ("ms", 1e3), "ms": ("s", 1e3), "ns": ("us", 1e3)}


def time_scale(unit: str, extent: float) -> tuple[str, float]:
    """(unit to show, divisor) so that axis ticks stay short: 1,200,000 us is shown as 1,200 ms."""
    divisor = 1.0
    while unit in _LARGER and extent / divisor >= 1e4:
        unit, factor = _LARGER[unit]
        divisor *= factor
    return unit, divisor
