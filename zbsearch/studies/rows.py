"""The rows of a comparison: one schedule at one memory limit, built from its `Summary` (fixed
schedules) or its `SolveReport` (zbsearch), so every number is what `zbsearch baseline NAME --json` or
`zbsearch solve --json` reports for the same inputs."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

from ..core.ir import Schedule
from ..core.memory import parse_mem_limit
from ..search.options import SearchOptions
from ..search.problem import make_problems
from ..core.profile import Profile
from ..schedules import REGISTRY, generate
from ..sim.simulate import Timeline
from ..sim.summary import Summary, summarize
from ..sim.validate import check, memory_problems
from ..core.objective import Objective
from ..core.placement import AUTO_PLACEMENTS
from ..interop.formats.torch_import import torch_builtin

TORCH_BUILTINS = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
SOURCES = ("handcrafted", "torch", "zbsearch")


@dataclass
class Row:
    """One schedule at one memory limit. Times are in the profile's time unit; memory in multiples of
    each rank's stage M_B."""

    schedule: str
    source: str  # handcrafted | torch | zbsearch
    microbatches: int
    mem_limit: str
    objective: str
    bubble_rate: float
    bubble_rate_makespan: float
    bubble_rate_span: float
    makespan: float
    span: float
    peak_memory_per_rank: list[float]
    within_limit: bool
    placement: str
    solve_seconds: float | None = None
    gap: float | None = None
    status: str | None = None
    bubble_rate_lower_bound: float | None = None
    note: str = ""
    timeline: Timeline | None = field(default=None, repr=False, compare=False)
    # On a zbsearch row: the fixed schedule on its placement that does better within the same limit.
    beaten_by: str | None = None
    imbalance: float = 0.0  # 1 - mean rank work / the busiest rank's: the part of bubble_rate no schedule removes

    @property
    def peak_memory(self) -> float:
        return max(self.peak_memory_per_rank)

    @property
    def cost(self) -> float:
        """The makespan or the span, as the row's objective says."""
        return Objective.parse(self.objective).of(self)

    def to_dict(self) -> dict[str, Any]:
        """The CSV's columns, in order (per-rank peaks joined by spaces)."""
        return {
            "m": self.microbatches, "mem_limit": self.mem_limit, "schedule": self.schedule, "source": self.source,
            "placement": self.placement, "objective": self.objective, "bubble_rate": self.bubble_rate,
            "bubble_rate_makespan": self.bubble_rate_makespan, "bubble_rate_span": self.bubble_rate_span,
            "makespan": self.makespan, "span": self.span, "peak_memory": self.peak_memory,
            "peak_memory_per_rank": " ".join(f"{x:.6g}" for x in self.peak_memory_per_rank),
            "within_limit": self.within_limit, "solve_seconds": self.solve_seconds, "gap": self.gap,
            "status": self.status, "bubble_rate_lower_bound": self.bubble_rate_lower_bound, "note": self.note,
            "imbalance": self.imbalance,
        }


class Skipped(NamedTuple):
    """A schedule left out of the tables at one microbatch count, and why."""

    microbatches: int
    schedule: str
    reason: str


@dataclass
class Comparison:
    """All rows of one comparison plus what produced them."""

    profile: Profile
    objective: str
    limits: tuple[str, ...]
    microbatches: tuple[int, ...]
    rows: list[Row]
    skipped: list[Skipped]
    time_limit: float
    placement: str = "linear"  # zbsearch's, as given (linear, interleaved:V, v, auto)
    command: str | None = None

    def rows_for(self, m: int, limit: str | None = None) -> list[Row]:
        return [r for r in self.rows if r.microbatches == m and (limit is None or r.mem_limit == limit)]


def summary_row(summary: Summary, timeline: Timeline, *, name: str, source: str, limit: str, objective: str,
                within: bool) -> Row:
    """A fixed schedule's row: the summary's figures under `objective`."""
    return Row(
        schedule=name, source=source, microbatches=summary.microbatches, mem_limit=limit, objective=objective,
        bubble_rate=summary.bubble_rate(objective), bubble_rate_makespan=summary.bubble_rate_makespan,
        bubble_rate_span=summary.bubble_rate_span, makespan=summary.makespan, span=summary.span,
        peak_memory_per_rank=list(summary.peak_memory_per_rank), within_limit=within,
        placement=summary.placement, timeline=timeline, imbalance=summary.imbalance,
    )


def fixed_rows(schedule: Schedule, profile: Profile, limits: Sequence[str], objective: str, *, name: str,
               source: str) -> list[Row]:
    """One row per limit for a given schedule, simulated once on `profile` and checked against each
    limit. Raises ScheduleError when the schedule is malformed or deadlocks."""
    report = check(schedule, profile)
    report.raise_if_invalid(name)
    assert report.timeline is not None
    rows = []
    for text in limits:
        limit = parse_mem_limit(text, profile)
        over = memory_problems(report.timeline, limit)
        summary = summarize(report.timeline, limit, valid=not over)
        rows.append(summary_row(summary, report.timeline, name=name, source=source, limit=text,
                                objective=objective, within=not over))
    return rows


def solved_row(profile: Profile, limit: str, objective: str, *, placement: str = "linear",
               options: SearchOptions = SearchOptions()) -> Row:
    """zbsearch's best schedule at `limit`, solved with `options`: exactly what `zbsearch solve --json`
    reports for the same inputs. Raises InfeasibleError when no schedule fits the limit."""
    # defers OR-Tools until a row is solved
    from ..search.solve import driver as search

    problems = make_problems(profile, limit, objective, placement, AUTO_PLACEMENTS)
    result = search.solve_placements(problems, options)
    report = result.report()
    start = report.start_heuristic
    row = summary_row(report.summary, result.timeline, name="zbsearch", source="zbsearch", limit=limit,
                      objective=objective, within=True)
    row.note = f"improved on {start}" if result.schedule.name == "zbsearch" else f"same as {start}"
    row.solve_seconds, row.gap, row.status = report.solve_seconds, report.gap, report.status
    row.bubble_rate_lower_bound = report.bubble_rate_lower_bound
    return row


def handcrafted_schedule(name: str, profile: Profile, chunks: int | None = None) -> Schedule:
    """The registry's schedule for the profile's p and m (`chunks` applies to interleaved-1f1b only).
    Raises PreconditionError when it is not defined for them."""
    gen = REGISTRY[name]
    return generate(name, profile.num_stages, profile.microbatches, chunks if gen.takes_chunks else None)


def display_name(name: str, chunks: int | None = None) -> str:
    gen = REGISTRY.get(name)
    if gen is not None and gen.takes_chunks:
        return f"{name} (v={chunks if chunks is not None else gen.default_chunks})"
    return name


def torch_available() -> bool:
    """True when torch is installed (nothing is imported): torch's built-in orders need it."""
    return importlib.util.find_spec("torch") is not None


def torch_schedule(name: str, profile: Profile) -> Schedule:
    """torch's built-in order `name` for the profile's p and m, as a zbsearch Schedule."""

    return torch_builtin(name, profile.num_stages, profile.microbatches)
