"""What a schedule costs on a profile, as plain data (the CLI's --json and every table read this)."""

from __future__ import annotations

from typing import Any

from ..core.memory import MemoryLimit
from .simulate import Timeline


def summarize(
    timeline: Timeline, limit: MemoryLimit | None = None, valid: bool = True, memory_curve: bool = False,
) -> dict[str, Any]:
    """One JSON-ready dict per schedule. Memory per rank is in units of that rank's whole-stage mem_B
    (a chunk of a 2-chunk schedule holding one microbatch counts 0.5). With `memory_curve`, it adds
    each rank's activation memory over time as [time, level] points (same units), one per change."""
    schedule, profile = timeline.schedule, timeline.profile
    p = timeline.num_ranks
    peak = [timeline.peak_memory(r) for r in range(p)]
    out: dict[str, Any] = {
        "schedule": schedule.name,
        "placement": schedule.placement.name,
        "ranks": p,
        "stages": schedule.placement.num_chunks,
        "microbatches": schedule.num_microbatches,
        "profile": profile.name,
        "time_unit": profile.time_unit,
        "makespan": timeline.makespan,
        "span": timeline.span,
        "bubble_rate_makespan": timeline.bubble_rate_makespan,
        "bubble_rate_span": timeline.bubble_rate_span,
        "work_per_rank": [timeline.work(r) for r in range(p)],
        "idle_per_rank": [timeline.makespan - timeline.work(r) for r in range(p)],
        "span_per_rank": [timeline.span_of(r) for r in range(p)],
        "peak_memory_per_rank": [peak[r] / profile.stage_mem_B(r) for r in range(p)],
        "peak_memory_bytes_per_rank": peak if profile.memory_unit == "bytes" else None,
        "mem_limit": None if limit is None else limit.text,
        "valid": valid,
    }
    if memory_curve:
        out["memory_curve_per_rank"] = [
            [[t, level / profile.stage_mem_B(r)] for t, level, _ in timeline.memory[r]] for r in range(p)
        ]
    return out
