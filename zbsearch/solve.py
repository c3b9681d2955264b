"""zbsearch's search: heuristics for a strong start, CP-SAT to improve it, bounds to say how good it is.

solve() never returns anything worse than the best valid heuristic, and everything it returns has
passed the validator with the exact profile times and the exact memory limit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .bounds import lower_bound, rank_bounds
from .cpsat import choose_step, orders_from_starts, solve_grid
from .errors import ZbsearchError
from .ir import Action, Kind, Schedule, build
from .problem import Problem, on_grid
from .report import summarize
from .simulate import Timeline, simulate
from .validate import check

# Relative tolerance under which the incumbent counts as equal to the lower bound (proven optimal).
OPTIMAL_RTOL = 1e-9


@dataclass(frozen=True)
class Progress:
    """One progress event: elapsed seconds, the incumbent and the bound in the profile's time unit."""

    elapsed: float
    incumbent: float
    bound: float
    phase: str


@dataclass
class SolveResult:
    problem: Problem
    schedule: Schedule
    timeline: Timeline
    objective: float
    lower_bound: float
    status: str  # optimal (incumbent equals a proven bound) or feasible
    solve_seconds: float
    start_heuristic: str
    heuristic_objective: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        return 0.0 if self.objective <= 0 else max(0.0, (self.objective - self.lower_bound) / self.objective)

    def report(self) -> dict[str, Any]:
        out = summarize(self.timeline, self.problem.limit)
        work = sum(out["work_per_rank"])
        p = self.problem.num_ranks
        out.update({
            "objective": self.problem.objective,
            "objective_value": self.objective,
            "lower_bound": self.lower_bound,
            # The bubble rate no schedule can beat, under the chosen objective.
            "bubble_rate_lower_bound": max(0.0, 1 - work / (p * self.lower_bound)) if self.lower_bound > 0 else 0.0,
            "gap": self.gap,
            "status": self.status,
            "solve_seconds": self.solve_seconds,
            "start_heuristic": self.start_heuristic,
            "heuristic_objective": self.heuristic_objective,
            **self.details,
        })
        return out


def objective_of(timeline: Timeline, objective: str) -> float:
    return timeline.makespan if objective == "makespan" else timeline.span


def split_backward(schedule: Schedule) -> Schedule:
    """The same orders with every full backward written as B then W and every overlapped pair as its
    two passes: the form the solver's model uses."""
    ranks = []
    for rank in schedule.ranks:
        out: list[Action] = []
        for action in rank:
            for a in action.passes():
                if a.kind is Kind.FULL_B:
                    out += [Action(a.chunk, Kind.B, a.microbatch), Action(a.chunk, Kind.W, a.microbatch)]
                else:
                    out.append(a)
        ranks.append(out)
    return build(schedule.name, schedule.placement, schedule.num_microbatches, ranks, **schedule.meta)


def one_at_a_time(problem: Problem) -> Schedule:
    """Microbatches strictly one after another: slow, but it fits the smallest feasible limit, so the
    solver always has a valid start."""
    ranks: list[list[Action]] = [[] for _ in range(problem.num_ranks)]
    pl, m = problem.placement, problem.num_microbatches
    for i in range(m):
        route = pl.route(i, m)
        for kind, chunks in ((Kind.F, route), (Kind.B, tuple(reversed(route))), (Kind.W, route)):
            for c in chunks:
                ranks[pl.chunk_to_rank[c]].append(Action(c, kind, i))
    return build("one-at-a-time", pl, m, ranks)


def heuristic_start(problem: Problem) -> list[tuple[str, Schedule, Timeline]]:
    """Every valid heuristic schedule for this problem, best first."""
    from . import heuristics

    found = [
        (name, s, t) for name, s, t in heuristics.candidates(problem.profile, problem.num_microbatches, problem.limit, problem.objective, placements=[problem.placement])
        if s.placement == problem.placement
    ]
    fallback = one_at_a_time(problem)
    report = check(fallback, problem.profile, problem.limit)
    if report.ok:
        found.append(("one-at-a-time", fallback, report.timeline))
    found.sort(key=lambda x: (objective_of(x[2], problem.objective), max(x[2].peak_memory(r) for r in range(problem.num_ranks))))
    return found


def solve(
    problem: Problem, *, time_limit: float = 30.0, workers: int = 2, seed: int = 0, resolution: int = 20,
    progress: Callable[[Progress], None] | None = None,
) -> SolveResult:
    """Find the best schedule for `problem` within `time_limit` seconds.

    Raises InfeasibleError (stating the smallest feasible limit) when the memory limit cannot be met.
    """
    t0 = time.monotonic()
    problem.check_feasible()
    starts = heuristic_start(problem)
    if not starts:
        raise ZbsearchError("no heuristic produced a valid schedule; this is a bug, please report it")
    name, best, best_tl = starts[0]
    best_obj = heuristic_obj = objective_of(best_tl, problem.objective)
    lb = lower_bound(problem)
    details: dict[str, Any] = {"heuristics_tried": len(starts), "cpsat_status": "not run"}
    if progress:
        progress(Progress(time.monotonic() - t0, best_obj, lb, "heuristics"))

    remaining = time_limit - (time.monotonic() - t0)
    if best_obj > lb * (1 + OPTIMAL_RTOL) and remaining > 0.5:
        step = choose_step(problem, resolution)
        grid = on_grid(problem, step)
        hint = {slot.action: int(round(slot.start)) for slot in simulate(split_backward(best), grid.profile).iter_slots()}
        horizon = _horizon(problem, best_tl, step)

        def on_solution(elapsed: float, obj: int, bound: int) -> None:
            if progress:
                progress(Progress(time.monotonic() - t0, min(best_obj, obj * step), max(lb, _real_bound(problem, bound, step)), "cp-sat"))

        caps = [int(math.floor(b.head / step + 1e-9)) for b in rank_bounds(problem, problem.passes)]
        result = solve_grid(grid, hint=hint, horizon=horizon, time_limit=remaining, workers=workers, seed=seed,
                            progress=on_solution, first_start_cap=caps)
        details.update({"cpsat_status": result.status, "grid_step": step, "cpsat_seconds": result.wall})
        if result.status in ("optimal", "feasible"):
            lb = max(lb, _real_bound(problem, result.bound, step))
            candidate = orders_from_starts(grid, result.starts, "zbsearch")
            report = check(candidate, problem.profile, problem.limit)
            if report.ok:
                obj = objective_of(report.timeline, problem.objective)
                if obj < best_obj * (1 - 1e-12):
                    best, best_tl, best_obj = candidate, report.timeline, obj
            else:
                details["cpsat_rejected"] = report.problems[0]
        elif result.status == "infeasible":
            # The heuristic's schedule is feasible, so an infeasible grid model means the horizon or
            # memory rounding cut it off; say so rather than hiding it.
            details["cpsat_rejected"] = "grid model infeasible (horizon or memory rounding)"
    status = "optimal" if best_obj <= lb * (1 + OPTIMAL_RTOL) else "feasible"
    meta = dict(best.meta, solver="zbsearch", start_heuristic=name, objective=problem.objective)
    schedule = Schedule("zbsearch" if best is not starts[0][1] else name, best.placement, best.num_microbatches, best.ranks, meta)
    return SolveResult(problem, schedule, best_tl, best_obj, min(lb, best_obj), status,
                       time.monotonic() - t0, name, heuristic_obj, details)


def _real_bound(problem: Problem, grid_bound: int, step: float) -> float:
    """The real-time bound that a grid bound proves (see cpsat.py): the grid is a relaxation, and a
    span can lose one step at a rank's first start unless every time is an exact multiple of the
    step, in which case real schedules map onto the grid exactly."""
    if problem.objective == "makespan" or grid_is_exact(problem, step):
        return step * grid_bound
    return step * (grid_bound - 1)


def grid_is_exact(problem: Problem, step: float) -> bool:
    def whole(x: float) -> bool:
        return abs(x / step - round(x / step)) < 1e-9

    return all(whole(ps.duration) and all(whole(h) for _, h in ps.inputs) for ps in problem.passes)


def _horizon(problem: Problem, incumbent: Timeline, step: float) -> int:
    """Latest grid time the model needs. For makespan: the incumbent's. For span: an optimal order
    run as soon as possible starts each rank at its head (its first pass is microbatch 0's forward)
    and ends within the incumbent's span after it."""
    if problem.objective == "makespan":
        return int(math.ceil(incumbent.makespan / step)) + 1
    heads = max(b.head for b in rank_bounds(problem, problem.passes))
    return int(math.ceil(max(heads + incumbent.span, incumbent.makespan) / step)) + 2
