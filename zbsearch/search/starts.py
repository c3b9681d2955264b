"""Better starts for the solver than the heuristics' best: searches that cost more than one greedy run,
so solve() gives each a share of its time limit, and keeps what they find only when it is shorter and
passes the validator.

- tuned_start: the list greedy with its choices tuned rank by rank (greedy_tune.py).
- periodic_start: on chunked placements (V-shape, interleaved) under a memory limit, the periodic
  schedule (greedy_modulo.py).
"""

from __future__ import annotations

import math
from typing import Any

from ..core.ir import Schedule
from ..sim.simulate import Timeline
from ..sim.validate import check
from .incumbent import objective_of
from .problem import Problem

Start = tuple[str, Schedule, Timeline, float]  # name, schedule, validated timeline, objective


def tuned_start(problem: Problem, start: Start, deadline: float, seed: int, details: dict[str, Any]) -> Start:
    """The per-rank tuned list greedy where it is shorter than `start` and valid; else `start`."""
    from .greedy_options import GreedyOptions
    from .greedy_tune import tune
    from .heuristics import _schedule

    pl, m = problem.placement, problem.num_microbatches
    base = GreedyOptions("list", by_route=len(pl.routes) > 1)
    tuned = tune(problem.profile, m, problem.limit, pl, problem.objective, base=base, deadline=deadline, seed=seed)
    if tuned is None or tuned.cost >= start[3] * (1 - 1e-12):
        return start
    found = _valid(problem, _schedule(tuned.result, pl, m, problem.limit, tuned.options))
    if found is None:
        return start
    details["tuned_start"] = {"from": start[0], "found_at_evaluation": tuned.found_at}
    return found


def periodic_applies(problem: Problem) -> bool:
    """Whether the periodic start is tried: one route, some rank holding several chunks, a finite
    limit (where it has beaten the other starts; see greedy_modulo.py)."""
    pl = problem.placement
    return len(pl.routes) == 1 and pl.num_chunks > pl.num_ranks \
        and not all(math.isinf(cap) for cap in problem.limit.per_rank)


def periodic_start(problem: Problem, start: Start, deadline: float, details: dict[str, Any]) -> Start:
    """The best periodic schedule where it is shorter than `start` and valid; else `start`."""
    from .greedy_modulo import best_periodic

    found = best_periodic(problem, deadline)
    if found is None or found[1] >= start[3] * (1 - 1e-12):
        return start
    valid = _valid(problem, found[0])
    if valid is None:
        return start
    details["periodic_start"] = {"from": start[0]}
    return valid


def _valid(problem: Problem, schedule: Schedule) -> Start | None:
    report = check(schedule, problem.profile, problem.limit)
    if not report.ok or report.timeline is None:
        return None
    return schedule.name, schedule, report.timeline, objective_of(report.timeline, problem.objective)
