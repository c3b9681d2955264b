"""Solving the CP-SAT model (cpsat.py) on its time grid and reading the schedule back: the solver's
parameters, its progress, and each rank's order from the solution's start times (the Bs it fused run
as full backwards)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from ortools.sat.python import cp_model

from ...core.ir import Action, Kind, Schedule, build
from ...core.objective import Status
from ..budget import BUDGET, Budget
from ..problem import Problem
from .cpsat import add_hint, build_model, durations

# Above this many passes, CP-SAT's presolve probing is switched off. Probing does not watch the time
# limit: at p=32, m=96 (9,216 passes) it took 25 s of a 47 s budget, and the call overran by 16 s.
# With it off that call kept its limit, and on Table 5 models of 1,536 to 3,072 passes turning it
# off changed neither the schedule nor the bound (measured on this 2-core machine).
PROBING_MAX_PASSES = 3000


@dataclass
class ModelResult:
    status: Status  # on the grid
    objective: int | None
    bound: int
    starts: dict[Action, int]
    wall: float
    build: float = 0.0  # seconds spent building the model before the search started
    fused: frozenset[Action] = frozenset()  # the Bs whose backward the solution runs fused
    gave_up: bool = False  # stopped by its GiveUp: its bound had not risen in time


@dataclass(frozen=True)
class GiveUp:
    """Stop the search `seconds` after it starts unless CP-SAT's bound has risen above `bound` (grid units)
    by then: a full model that proves nothing beyond the bound the caller has is not on its way to a
    proof, and on capped models of a few hundred passes the large-neighbourhood search improves the
    incumbent faster than it does (solve/driver.py hands it the time left)."""

    seconds: float
    bound: int


class _Watch:
    """CP-SAT's bound as it rises, and, while the `with` block runs the search, a timer that stops it where
    a GiveUp says so."""

    def __init__(self, solver: cp_model.CpSolver, give_up: GiveUp | None) -> None:
        self.solver, self.give_up, self.bound, self.fired = solver, give_up, -float("inf"), False
        solver.best_bound_callback = self._on_bound
        self.timer = threading.Timer(give_up.seconds, self._check) if give_up is not None else None

    def __enter__(self) -> "_Watch":
        if self.timer is not None:
            self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _on_bound(self, bound: float) -> None:
        self.bound = bound

    def _check(self) -> None:
        assert self.give_up is not None
        if self.bound <= self.give_up.bound:
            self.fired = True
            self.solver.stop_search()


class _Progress(cp_model.CpSolverSolutionCallback):
    def __init__(self, report: Callable[[float, int, int], None] | None, t0: float):
        super().__init__()
        self._report, self._t0 = report, t0

    def on_solution_callback(self) -> None:
        if self._report is not None:
            self._report(time.monotonic() - self._t0, int(self.objective_value), int(self.best_objective_bound))


def solve_grid(
    grid: Problem, *, hint: dict[Action, int] | None, horizon: int, time_limit: float, workers: int,
    seed: int, progress: Callable[[float, int, int], None] | None = None, headroom: int = 0,
    first_start_cap: list[int] | None = None, arrival_slack: int | None = None,
    hint_fused: frozenset[Action] = frozenset(), budget: Budget = BUDGET, give_up: GiveUp | None = None,
) -> ModelResult:
    """Build and solve the grid model; return the best starts found (and which backwards they fuse)
    and the proven bound. `hint_fused`: the Bs whose backward the hint runs fused; `budget`: the caps of
    the rank bounds the model reads; `give_up`: when to stop early (see GiveUp)."""
    t0 = time.monotonic()
    model, v = build_model(grid, horizon, headroom, first_start_cap, arrival_slack, budget)
    if hint:
        add_hint(model, grid, v, hint, hint_fused)
    built = time.monotonic() - t0
    solver = cp_model.CpSolver()
    params = solver.parameters
    # CP-SAT checks its clock between propagation rounds, and one round over a large model's memory
    # constraints can take seconds: at p=32, m=128 (12,288 passes, 2 s to build) calls overran by
    # 4-6 s. Keep back twice the build time, which grows with the model, to absorb it.
    params.max_time_in_seconds = max(0.1, time_limit - (time.monotonic() - t0) - 2 * built)
    params.num_workers = max(1, workers)
    params.random_seed = seed
    params.log_search_progress = False
    if len(grid.passes) > PROBING_MAX_PASSES:
        params.cp_model_probing_level = 0
    with _Watch(solver, give_up) as watch:
        status = solver.solve(model, _Progress(progress, t0))
    name = {cp_model.OPTIMAL: Status.OPTIMAL, cp_model.FEASIBLE: Status.FEASIBLE,
            cp_model.INFEASIBLE: Status.INFEASIBLE}.get(status, Status.UNKNOWN)
    starts = {a: int(solver.value(s)) for a, s in v.start.items()} if name in (Status.OPTIMAL, Status.FEASIBLE) else {}
    objective = int(solver.objective_value) if starts else None
    bound = int(solver.best_objective_bound) if name is not Status.INFEASIBLE else 0
    fused = frozenset(b for b, var in v.fused.items() if solver.boolean_value(var)) if starts else frozenset()
    return ModelResult(name, objective, bound, starts, time.monotonic() - t0, built, fused,
                       watch.fired and name is not Status.OPTIMAL)


def orders_from_starts(grid: Problem, starts: dict[Action, int], name: str,
                       fused: frozenset[Action] = frozenset()) -> Schedule:
    """Per-rank orders from solved start times; ties (zero-length passes) keep inputs first. A B in
    `fused` and its W are written as one full backward, at the B's place."""
    dur = durations(grid)
    kind_rank = {Kind.F: 0, Kind.B: 1, Kind.W: 2}
    ranks: list[list[Action]] = [[] for _ in range(grid.num_ranks)]
    key = lambda ps: (starts[ps.action], starts[ps.action] + dur[ps.action], kind_rank[ps.action.kind], ps.action.microbatch)
    for ps in sorted(grid.passes, key=key):
        a = ps.action
        if a in fused:
            ranks[ps.rank].append(Action(a.chunk, Kind.FULL_B, a.microbatch))
        elif not (a.kind is Kind.W and Action(a.chunk, Kind.B, a.microbatch) in fused):
            ranks[ps.rank].append(a)
    return build(name, grid.placement, grid.num_microbatches, ranks)
