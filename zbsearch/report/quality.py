"""How good a plan is, for the HTML report: its objective against a proven bound, what the same pipeline
reaches without the memory cap, and the handcrafted schedules at the same limit.

A plan from `solve` brings its bound, gap and status (SolveReport); a plan file does not, so
`quality_of` runs a short search at the plan's limit for a bound and one without a limit for the
uncapped figure, each for half of `time_limit`, and says so in `*_source`: the page never shows a number
without where it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.errors import InfeasibleError, PreconditionError, ScheduleError
from ..core.ir import Schedule
from ..core.memory import MemoryLimit, no_limit
from ..core.objective import Objective, status_for
from ..core.profile import Profile
from ..schedules import REGISTRY, generate
from ..sim.simulate import Timeline
from ..sim.validate import check

if TYPE_CHECKING:
    from ..search.solve.report import SolveReport

@dataclass(frozen=True)
class Handcrafted:
    """One handcrafted schedule on the plan's profile: its objective, bubble, busiest peak (in stage M_B)
    and whether it fits the limit (why not, where it does not)."""

    name: str
    placement: str
    value: float
    bubble: float
    peak: float
    fits: bool
    reason: str = ""


@dataclass(frozen=True)
class Quality:
    """The plan's objective and what it is measured against; None where not known."""

    objective: str
    value: float
    lower_bound: float | None
    bound_source: str
    status: str | None
    uncapped: float | None
    uncapped_source: str
    handcrafted: tuple[Handcrafted, ...]

    @property
    def gap(self) -> float | None:
        """(value - bound) / value, as the solver reports it."""
        if self.lower_bound is None or self.value <= 0:
            return None
        return max(0.0, (self.value - self.lower_bound) / self.value)


def handcrafted(profile: Profile, schedule: Schedule, limit: MemoryLimit | None,
                objective: Objective) -> tuple[Handcrafted, ...]:
    """Every handcrafted schedule that applies to the plan's p and m and runs on its placement or on one
    stage per rank (a chunked schedule on another placement would read the plan's chunk costs on the
    wrong ranks), validated on the plan's profile at its limit; the best first."""
    p, m, own = schedule.num_ranks, schedule.num_microbatches, schedule.placement
    rows = []
    for spec in REGISTRY.values():
        if spec.placement not in ("linear", own.name) or spec.problem(p, m, spec.default_chunks or 1) is not None:
            continue
        try:
            candidate = generate(spec.name, p, m)
        except PreconditionError:
            continue
        if candidate.placement != own and candidate.placement.name != "linear":
            continue
        report = check(candidate, profile, limit)
        if report.timeline is None:
            continue
        tl = report.timeline
        reason = "" if report.ok else "; ".join(report.problems[:1])
        rows.append(Handcrafted(spec.name, candidate.placement.name, objective.of(tl),
                                _bubble(tl, objective), _peak(tl), report.ok, reason))
    return tuple(sorted(rows, key=lambda h: (not h.fits, h.value)))


def _bubble(timeline: Timeline, objective: Objective) -> float:
    return timeline.bubble_rate_makespan if objective is Objective.MAKESPAN else timeline.bubble_rate_span


def _peak(timeline: Timeline) -> float:
    prof = timeline.profile
    return max(timeline.peak_memory(r) / prof.stage_mem_B(r) for r in range(timeline.num_ranks))


def _quick(profile: Profile, schedule: Schedule, limit: MemoryLimit, objective: Objective,
           seconds: float) -> tuple[float, float] | None:
    """(best objective found, proven bound) of a `seconds` search for the plan's placement, m and recompute
    choice at `limit`; None where no schedule fits it."""
    # defers OR-Tools (the solver): rendering a page from a solve's own report never loads it
    from ..search.options import SearchOptions
    # defers OR-Tools, as above
    from ..search.problem import Problem
    # defers OR-Tools, as above
    from ..search.solve.driver import solve

    problem = Problem(profile, schedule.placement, schedule.num_microbatches, limit, objective,
                      schedule.plan.recompute_microbatches)
    try:
        result = solve(problem, SearchOptions(time_limit=seconds))
    except (InfeasibleError, ScheduleError):
        return None
    return result.objective, result.lower_bound


def quality_of(timeline: Timeline, limit: MemoryLimit | None, objective: Objective, time_limit: float,
               solved: "SolveReport | None" = None) -> Quality:
    """The plan's quality. With `solved` (the plan's own solve) its bound and status are used; otherwise a
    search of time_limit / 2 at the plan's limit gives one. The uncapped figure is always a search of
    time_limit / 2 without a limit (or the plan itself, when it has no limit)."""
    schedule, prof = timeline.schedule, timeline.profile
    value = objective.of(timeline)
    share = max(0.1, time_limit / 2)
    if solved is not None:
        bound: float | None = solved.lower_bound
        bound_source = "the solve that made this plan"
        status: str | None = str(solved.status.value)
    else:
        found = _quick(prof, schedule, limit or no_limit(prof), objective, share)
        bound = None if found is None else found[1]
        bound_source = f"a {share:g} s search at the same limit (zbsearch solve)"
        status = None if bound is None else status_for(value, bound).value
    if limit is None or limit.unlimited:
        uncapped: float | None = value
        uncapped_source = "the plan itself: it has no memory limit"
    else:
        free = _quick(prof, schedule, no_limit(prof), objective, share)
        uncapped = None if free is None else free[0]
        uncapped_source = f"the best of a {share:g} s search without a memory limit (its bound: " + \
            ("none" if free is None else f"{free[1]:.6g}") + ")"
    return Quality(objective.value, value, bound, bound_source, status, uncapped, uncapped_source,
                   handcrafted(prof, schedule, limit, objective))
