"""`zbsearch solve --partition`: the split of layers searched (or named) together with the schedule."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.table import Table

from ..core.errors import PartitionError, ProfileError
from ..core.profile import Profile, check_stages, load_profile
from ..report.render import fmt_bytes, fmt_number
from ..search.solve.driver import SolveResult
from ..search.partition.report import layer_range
from .options import load_cli_profile


def solve_profile(path: Path | None, uniform: Any, p: int | None, m: int | None, uniform_memory: Any,
                  rule: str | None) -> Profile:
    """The profile `solve` plans on, read once: a file that lists its layers is split (-p may differ from its
    stage count); otherwise -p must match it, or --uniform builds one. A split rule needs layers."""
    loaded = load_profile(path) if path is not None and uniform is None else None
    if rule is None and (loaded is None or loaded.layers is None):
        return load_cli_profile(path, uniform, p, m, uniform_memory, loaded=loaded)
    if loaded is None:
        raise ProfileError("--partition needs a profile with per-layer costs: give --profile PROFILE.json "
                           "(zbsearch profile writes its layers)")
    if loaded.layers is None:
        raise PartitionError(f"--partition needs per-layer costs, and profile {loaded.label} has none (no layers "
                             "list): profile the model again with zbsearch profile, which writes them")
    if p is not None:
        check_stages(p)
    return loaded.with_microbatches(m) if m is not None else loaded


def split_table(result: SolveResult) -> Table:
    """Rank by rank: the layers of each chunk, static bytes, peak activations, their sum and the cap."""
    assert result.details.partition is not None
    facts = result.details.partition.facts
    bytes_unit = result.problem.profile.memory_unit == "bytes"
    show = fmt_bytes if bytes_unit else fmt_number
    table = Table(title=f"split ({facts.rule}): layers per chunk {','.join(map(str, facts.layers_per_chunk))}",
                  title_justify="left")
    recompute = any(row.recompute for row in facts.ranks)
    for col in ("rank", "layers", "static", "peak activations", "total", "cap", "fits") + \
            (("recomputed", "microbatches", "+time", "saved F->I") if recompute else ()):
        table.add_column(col, justify="left" if col == "layers" else "right",
                         overflow="fold" if col == "layers" else "ellipsis")
    for row in facts.ranks:
        layers = "\n".join(layer_range(names) for _, names in row.chunks)
        cap = row.cap_bytes
        cells = [str(row.rank), layers, show(row.static_bytes), show(row.peak_activation_bytes),
                 show(row.total_bytes), "-" if cap is None or math.isinf(cap) else show(cap),
                 "yes" if row.fits else "NO"]
        if recompute:
            cells += _recompute_cells(row.recompute, show)
        table.add_row(*cells)
    return table


def _recompute_cells(row: dict, show: Any) -> list[str]:
    """A rank's recompute: how many layers at which level, how many microbatches recompute on each of its
    chunks, the time it adds per iteration, the bytes it saves from F until I per recomputed microbatch."""
    chosen = row.get("recomputed", [])
    if not chosen:
        return ["-", "-", "-", "-"]
    levels = sorted({c["level"] for c in chosen})
    return [f"{len(chosen)} ({'/'.join(levels)})", "\n".join(map(str, row["recomputed_microbatches"])),
            fmt_number(row["recompute_time"]), show(row["recompute_saved_bytes"])]


def bound_line(result: SolveResult) -> str:
    """How far the plan is from the best plan of any split."""
    partition = result.details.partition
    assert partition is not None
    any_split = partition.any_split_bound
    gap = max(0.0, (result.objective - any_split) / result.objective) if result.objective > 0 else 0.0
    scored = f" ({partition.splits_scored} splits scored)" if partition.splits_scored else ""  # none on a named split
    line = f"any split: lower bound {fmt_number(any_split)}, gap {gap:.2%}{scored}"
    by = partition.any_split_bound_by_placement
    weakest = min(by, key=lambda name: by[name]["bound"], default=None)
    # (With no gap there is nothing to place: every placement's bound is capped at the plan then.)
    if weakest is not None and len(by) > 1 and weakest != result.problem.placement.name and gap > 1e-9 \
            and not math.isinf(by[weakest].get("best_found", math.inf)):
        # The plan's own placement is not what holds the bound down: say which is, and how far its
        # best plan is from it, so the user knows where the gap lives.
        line += (f"; the bound is placement {weakest}'s, whose best plan found is "
                 f"{fmt_number(by[weakest]['best_found'])}")
    return line
