"""The per-microbatch steps of `--recompute auto` on a plan the partition search found: keep the
activations of the microbatches that fit on its order, and let CP-SAT windows choose the order and which
microbatches recompute together, on every chunk of its split.

The walk chooses levels per layer; on a chunk where it chose none, the windows (which choose per chunk and
microbatch between the chunk's level and none) could not recompute at all. So the plan is first widened:
every chunk without recompute lists its layers' full option with none of its microbatches recomputing,
which costs and holds exactly what the plan did. After the windows it is narrowed again: a chunk on which
no microbatch recomputes drops its levels (again the same costs), so the plan's levels name only layers
that some microbatch recomputes, as the exports expect.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from ...core.ir import Placement
from ...core.recompute.levels import with_recompute
from ...sim.validate import check
from ...core.plan_record import Choice
from ..options import SearchOptions
from ..problem import Problem
from ..solve.driver import SolveResult
from .microbatches import choose_by_windows, fewest, recompute_fewer
from ..solve.starts import Start
from ..partition.search import SplitRequest, SplitSearch


def fewer_microbatches(result: SolveResult) -> SolveResult:
    """`result` with only the microbatches that need it recomputing (search/recompute/microbatches.py), or
    the heuristics' best schedule of its split so (microbatches.fewest) where that is faster: the solver
    polished an order with every microbatch recomputing, which is not always the best with fewer."""
    own = recompute_fewer(result.problem, _as_start(result))
    heuristic = fewest(result.problem)
    return _as_result(result, *min(own, heuristic, key=lambda pair: pair[1].objective))


def choose_on_every_chunk(request: SplitRequest, result: SolveResult, deadline: float, options: SearchOptions,
                          every_layer: Mapping[str, str]) -> SolveResult:
    """`result` improved until `deadline` by CP-SAT windows choosing the order and which microbatches
    recompute, on every chunk (widened, then narrowed: see the module), with the options' workers, seed
    and resolution; `every_layer`: every layer's full level (recompute.all_full). Unchanged where
    nothing better was found."""
    levels = dict(result.schedule.plan.recompute)  # every level the profile runs, idle chunks' too
    names = _chunk_layers(result)
    idle = [c for c, cost in enumerate(result.problem.chunk_costs) if cost.without_recompute is None]
    wide = {**levels, **{n: every_layer[n] for c in idle for n in names[c] if n in every_layer}}
    start = _with_levels(request, result, wide) if wide != levels else result
    chosen = _as_result(start, *choose_by_windows(start.problem, _as_start(start), deadline, options))
    if not chosen.objective < result.objective * (1 - 1e-12):
        return result
    choice = chosen.problem.recompute_microbatches or ()
    unused = {n for c, entry in enumerate(choice) if entry is not None and not entry for n in names[c]}
    narrow = {n: level for n, level in wide.items() if n not in unused}
    return _with_levels(request, chosen, narrow) if narrow != wide else chosen


def _with_levels(request: SplitRequest, result: SolveResult, levels: dict[str, str]) -> SolveResult:
    """`result`'s schedule on its split with `levels`: a chunk that gains levels recomputes on none of its
    microbatches, one that loses them recomputed on none, so the costs are the same; checked, and
    `result` unchanged should the validator see otherwise."""
    placement = result.problem.placement
    search = SplitSearch(replace(request, profile=with_recompute(request.profile, levels, restage=False)), math.inf)
    problem = search.problem(placement, route_counts(result, placement))
    problem = problem.with_choice(_carried_choice(result.problem, problem))
    schedule = replace(result.schedule, plan=problem.plan)
    report = check(schedule, problem.profile, problem.limit)
    if not report.ok or report.timeline is None or not math.isclose(
            problem.objective.of(report.timeline), result.objective, rel_tol=1e-9):
        return result
    return replace(result, problem=problem, schedule=schedule, timeline=report.timeline)


def _carried_choice(old: Problem, new: Problem) -> Choice:
    """Per chunk of `new`: the microbatches that recompute as in `old` where both recompute layers, none
    where only `new` does (None where `new` recomputes nothing)."""
    return new.choice_where(lambda c, i: old.chunk_costs[c].without_recompute is not None and old.recomputes(c, i))


def _chunk_layers(result: SolveResult) -> tuple[tuple[str, ...], ...]:
    chunks = result.problem.profile.partition
    assert chunks is not None
    return chunks


def route_counts(result: SolveResult, placement: Placement) -> tuple[int, ...]:
    """Layers per route position of a partition search's result."""
    chunks = _chunk_layers(result)
    return tuple(len(chunks[c]) for c in placement.routes[0])


def _as_start(result: SolveResult) -> Start:
    return Start(result.start_heuristic, result.schedule, result.timeline, result.objective)


def _as_result(result: SolveResult, problem: Problem, start: Start) -> SolveResult:
    """`result` with another schedule of its split (and the problem with that schedule's choice)."""
    if start.schedule is result.schedule:
        return result
    return replace(result, problem=problem, schedule=start.schedule, timeline=start.timeline, objective=start.objective)
