"""A bound from a few ranks kept whole: the problem with every other rank's capacity and memory dropped, solved
by CP-SAT.

Keep the passes of every rank, but the one-at-a-time rule and the memory limit only on the ranks of `kept`:
the others become pure delays (a pass there starts once its input arrives, however many run at once). Every
schedule of the whole problem is a schedule of this one, so its optimum, and any bound CP-SAT proves on
it, bounds the whole problem's makespan.

Why two ranks: where memory binds hard, a rank's own bounds (bounds/analytic.py) let every microbatch's
round trip through the other ranks take its shortest path, and so let the rank keep its few microbatches in
flight turning over as fast as passes allow. With a second rank kept whole, a microbatch's round trip
waits there behind the other microbatches' passes, as it does in a real schedule. On the capped instances
of results/capped_optimum.md (family B: 0.58p, the cap costs 26-65%) the analytic bound stood 6-13% below
the proven optimum; this bound with rank 0 and one other closed that to 0-4% (bench/capped_pair_bound.py,
results/capped_pair_bound.md). CP-SAT proves it quickly on small problems only (a few hundred passes):
on the 8-rank, 32-microbatch example it proved less than the analytic bound in 60 s.

The model is the solver's own (exact/cpsat.py: its intervals, dependencies, microbatch order and memory
blocks, a backward fused where that holds less, on the integer grid that rounds every time down), with the
one-at-a-time rule and the limit on the kept ranks only. So it holds where the solver's CP-SAT bound holds,
and is not computed where that one is not used (an F&B pair time, or a fused backward that costs less time
than B and W apart: solve/driver.py), nor for the span objective.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Sequence

from ortools.sat.python import cp_model

from ...core.objective import Objective
from . import cpsat
from ..problem import Problem, on_grid
from ..bounds.relaxations import fusion_saves_time



@dataclass(frozen=True)
class SubsetBound:
    """What the model proved: `value`, a lower bound on the makespan (0 where nothing was proven), whether
    it is the relaxation's optimum, the ranks kept and the seconds it took."""

    value: float
    proven: bool
    kept: tuple[int, ...]
    seconds: float


def applies(problem: Problem) -> bool:
    """Whether the solver's model is a relaxation of the problem, so that this bound holds (see the module)."""
    return Objective.parse(problem.objective) is Objective.MAKESPAN and not problem.profile.gives_overlap \
        and not fusion_saves_time(problem.chunk_costs)


def subset_bound(problem: Problem, kept: Sequence[int], time_limit: float, step: float | None = None,
                 workers: int = 1, seed: int = 0, resolution: int = 20) -> SubsetBound:
    """The makespan bound of `problem` with only the ranks `kept` whole (see the module), after at most about
    `time_limit` seconds of CP-SAT, on a grid of `step` (real time units per grid unit; by default
    cpsat.choose_step's at `resolution` units in the shortest pass, as the solver's coarse rounds); 0 where
    the bound does not apply (`applies`)."""
    t0 = time.monotonic()
    kept = tuple(sorted(set(kept)))
    if not applies(problem) or time_limit <= 0:
        return SubsetBound(0.0, False, kept, 0.0)
    step = step if step is not None else cpsat.choose_step(problem, resolution)
    grid = on_grid(problem, step)
    dropped = tuple(cap if r in kept else math.inf for r, cap in enumerate(grid.limit.per_rank))
    relaxed = replace(grid, limit=replace(grid.limit, per_rank=dropped))
    horizon = int(sum(ps.duration + sum(hop for _, hop in ps.inputs) for ps in grid.passes)) + 1
    model = cp_model.CpModel()
    v = cpsat.add_intervals(model, relaxed, horizon)
    cpsat.add_dependencies(model, relaxed, v)
    cpsat.add_one_pass_at_a_time(model, relaxed, v, [ps for ps in relaxed.passes if ps.rank in kept])
    cpsat.add_symmetry_breaking(model, relaxed, v)
    cpsat.add_memory(model, relaxed, v)
    makespan = model.new_int_var(0, horizon, "makespan")
    model.add_max_equality(makespan, list(v.end.values()))
    model.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit - (time.monotonic() - t0))
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    status = solver.solve(model)
    value = step * solver.best_objective_bound if status != cp_model.INFEASIBLE else 0.0
    return SubsetBound(max(0.0, value), status == cp_model.OPTIMAL, kept, time.monotonic() - t0)
