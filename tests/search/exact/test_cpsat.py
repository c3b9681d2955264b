"""search/exact/cpsat.py: the CP-SAT model's variables and constraint families, its memory constraint, its
hint, and tiny models whose optimum is known by hand.

The tiny cases, p=2, m=2, F = B = W = 1, no communication:
- no limit (or 1p, two microbatches in flight): rank 1 cannot start before rank 0's first forward
  ends (t=1) and then has 6 units of work, so no schedule ends before 7; 1F1B-like orders reach 7.
- 0.5p (one microbatch in flight per rank): rank 0 cannot start microbatch 1's F until microbatch
  0's W has freed its memory, so the microbatches run one after the other: 2 x (F, F, B, B, W) = 10.
"""

from __future__ import annotations

import math

import pytest
from ortools.sat.python import cp_model

from zbsearch.core.ir import Kind
from zbsearch.core.memory import MemoryLimit
from zbsearch.search.problem import Problem, make_problem, on_grid
from zbsearch.core.profile import uniform_profile
from zbsearch.schedules import generate
from zbsearch.search.exact.cpsat import (add_dependencies, add_hint, add_intervals, add_memory,
    add_one_pass_at_a_time, add_symmetry_breaking, build_model, choose_step, memory_scale)
from zbsearch.search.exact import run_model
from zbsearch.search.exact.run_model import orders_from_starts, solve_grid
from zbsearch.sim.simulate import simulate
from zbsearch.sim.validate import validate

HORIZON = 60
CONSTRAINT_KINDS = ("interval", "no_overlap", "cumulative", "linear", "lin_max")


def grid(limit: str | None = None, objective: str = "makespan", p: int = 2, m: int = 2, placement: str = "linear",
         times: tuple[float, float, float] = (1, 1, 1)) -> Problem:
    return on_grid(make_problem(uniform_profile(*times, p=p, m=m), limit, objective, placement), 1.0)


def kinds(model: cp_model.CpModel) -> list[str]:
    return [next(k for k in CONSTRAINT_KINDS if getattr(c, f"has_{k}")()) for c in model.Proto().constraints]


def label(action) -> str:
    return f"{action.kind.label}_c{action.chunk}_mb{action.microbatch}"


# -- variables and constraint families ----------------------------------------------------------

@pytest.mark.parametrize("placement", ["linear", "v", "interleaved:2"])
def test_every_pass_has_a_start_and_an_interval_named_after_it(placement: str) -> None:
    g = grid("2p", p=3, m=4, placement=placement)
    model, _ = build_model(g, HORIZON)
    proto = model.Proto()
    starts = {v.name for v in proto.variables if v.name.startswith("start_")}
    runs = {c.name for c in proto.constraints if c.has_interval() and c.name.startswith("run_")}
    assert starts == {f"start_{label(ps.action)}" for ps in g.passes}
    assert runs == {f"run_{label(ps.action)}" for ps in g.passes}
    assert len(starts) == 3 * g.placement.num_chunks * 4
    assert {v.name for v in proto.variables} >= {f"first_start_rank{r}" for r in range(3)} | \
        {f"last_end_rank{r}" for r in range(3)} | {"makespan"}


def test_each_family_adds_its_own_constraints() -> None:
    g = grid("2p", p=3, m=4, placement="v")
    model = cp_model.CpModel()
    v = add_intervals(model, g, HORIZON)
    assert kinds(model) == ["interval"] * len(g.passes)

    def added(step) -> list[str]:
        before = len(model.Proto().constraints)
        step()
        return kinds(model)[before:]

    # A precedence per data input.
    assert added(lambda: add_dependencies(model, g, v)) == ["linear"] * sum(len(ps.inputs) for ps in g.passes)
    # One no-overlap per rank over exactly that rank's passes.
    assert added(lambda: add_one_pass_at_a_time(model, g, v)) == ["no_overlap"] * 3
    proto = model.Proto()
    for r, c in enumerate(c for c in proto.constraints if c.has_no_overlap()):
        names = {proto.constraints[i].name for i in c.no_overlap.intervals}
        assert names == {f"run_{label(ps.action)}" for ps in g.passes if ps.rank == r}
    # Same kind of one chunk in microbatch order: every pass but the last microbatch's.
    assert added(lambda: add_symmetry_breaking(model, g, v)) == ["linear"] * sum(
        1 for ps in g.passes if ps.action.microbatch < 3)
    # Memory: two held blocks per forward (until its B, until its W), one cumulative per rank.
    forwards = sum(1 for ps in g.passes if ps.action.kind is Kind.F)
    assert sorted(added(lambda: add_memory(model, g, v))) == ["cumulative"] * 3 + ["interval"] * (2 * forwards)


# -- the memory constraint ----------------------------------------------------------------------

def cumulatives(model: cp_model.CpModel) -> list:
    return [c.cumulative for c in model.Proto().constraints if c.has_cumulative()]


def test_no_limit_no_memory_constraint() -> None:
    model, v = build_model(grid(None, p=3, m=4), HORIZON)
    assert cumulatives(model) == [] and v.held == []
    assert not [x for x in model.Proto().variables if x.name.startswith("held_")]


def test_a_limit_is_one_cumulative_per_rank_at_its_capacity() -> None:
    g = grid("1.5p", p=3, m=4, times=(1, 2, 1))
    model, v = build_model(g, HORIZON)
    scale = memory_scale(g)
    found = cumulatives(model)
    assert len(found) == 3
    for r, c in enumerate(found):
        assert c.capacity.offset == math.floor(g.limit.per_rank[r] * scale + 1e-6) == 4_500_000
        # Each forward holds mem_B - mem_W until its B and mem_W until its W: 0.5 + 0.5 of mem_B = 1.
        assert sorted(d.offset for d in c.demands) == [500_000] * 8
    assert len(v.held) == 2 * 12
    assert {(src.kind, until.kind) for _, src, until in v.held} == {(Kind.F, Kind.B), (Kind.F, Kind.W)}


def test_a_limit_on_some_ranks_constrains_only_those() -> None:
    prof = uniform_profile(1, 1, 1, p=3, m=4)
    limit = MemoryLimit("mixed", (math.inf, 2.0, math.inf))
    g = on_grid(Problem(prof, make_problem(prof, None).placement, 4, limit), 1.0)
    model, _ = build_model(g, HORIZON)
    (only,) = cumulatives(model)
    assert only.capacity.offset == 2 * memory_scale(g)
    names = {model.Proto().constraints[i].name for i in only.intervals}
    assert names == {f"mem_F_c1_mb{i}_until_{k}" for i in range(4) for k in ("B", "W")}


def test_headroom_tightens_the_capacity() -> None:
    g = grid("1p")
    model = cp_model.CpModel()
    v = add_intervals(model, g, HORIZON)
    add_memory(model, g, v, headroom=7)
    assert [c.capacity.offset for c in cumulatives(model)] == [2 * memory_scale(g) - 7] * 2


# -- the hint -----------------------------------------------------------------------------------

def test_the_hint_is_the_start_schedule_and_a_complete_solution() -> None:
    g = grid("2p", p=3, m=6)
    schedule = generate("zb-h1", 3, 6)
    timeline = simulate(schedule, g.profile)
    starts = {slot.action: int(slot.start) for slot in timeline.iter_slots()}
    model, v = build_model(g, HORIZON)
    add_hint(model, g, v, starts)
    proto = model.Proto()
    hinted = dict(zip(proto.solution_hint.vars, proto.solution_hint.values))
    assert {proto.variables[i].name: value for i, value in hinted.items() if proto.variables[i].name.startswith("start_")} \
        == {f"start_{label(a)}": s for a, s in starts.items()}
    assert hinted[v.objective.index] == timeline.makespan
    # Fixed to the hint, the model still has a solution: the hint alone is a feasible schedule.
    solver = cp_model.CpSolver()
    solver.parameters.fix_variables_to_their_hinted_value = True
    solver.parameters.num_workers = 1
    assert solver.solve(model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    assert solver.objective_value == timeline.makespan
    assert {a: solver.value(s) for a, s in v.start.items()} == starts


def test_orders_from_starts_give_back_the_schedule() -> None:
    g = grid(None, p=3, m=6)
    schedule = generate("zb-h1", 3, 6)
    starts = {slot.action: int(slot.start) for slot in simulate(schedule, g.profile).iter_slots()}
    assert orders_from_starts(g, starts, "back").ranks == schedule.ranks


# -- solving ------------------------------------------------------------------------------------

@pytest.mark.parametrize("limit, objective, optimum", [
    (None, "makespan", 7), ("1p", "makespan", 7), (None, "span", 7), ("0.5p", "makespan", 10), ("0.5p", "span", 10),
])
def test_tiny_models_solve_to_the_known_optimum(limit: str | None, objective: str, optimum: int) -> None:
    g = grid(limit, objective)
    result = solve_grid(g, hint=None, horizon=HORIZON, time_limit=10, workers=1, seed=0)
    assert (result.status, result.objective, result.bound) == ("optimal", optimum, optimum)
    schedule = orders_from_starts(g, result.starts, "cpsat")
    timeline = validate(schedule, g.profile, g.limit)
    assert timeline is not None
    assert (timeline.makespan if objective == "makespan" else timeline.span) == optimum


def test_an_impossible_horizon_is_reported_infeasible() -> None:
    result = solve_grid(grid(None), hint=None, horizon=6, time_limit=10, workers=1, seed=0)
    assert (result.status, result.objective, result.starts) == ("infeasible", None, {})


def test_probing_is_switched_off_only_for_large_models(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real_solve = cp_model.CpSolver.solve

    def spy(self, model, callback=None):
        seen.append(self.parameters.cp_model_probing_level)
        return real_solve(self, model, callback)

    monkeypatch.setattr(cp_model.CpSolver, "solve", spy)
    monkeypatch.setattr(run_model, "PROBING_MAX_PASSES", 11)
    solve_grid(grid(None), hint=None, horizon=HORIZON, time_limit=5, workers=1, seed=0)   # 12 passes
    monkeypatch.setattr(run_model, "PROBING_MAX_PASSES", 12)
    solve_grid(grid(None), hint=None, horizon=HORIZON, time_limit=5, workers=1, seed=0)
    assert seen[0] == 0 and seen[1] != 0


# -- the grid step ------------------------------------------------------------------------------

@pytest.mark.parametrize("times, resolution, step", [((1, 2, 1), 4, 0.25), ((3, 6, 3), 10, 0.3), ((2, 3, 1), 5, 0.2)])
def test_choose_step_divides_the_pass_times_exactly_when_it_can(times, resolution: int, step: float) -> None:
    problem = make_problem(uniform_profile(*times, p=2, m=2), None)
    chosen = choose_step(problem, resolution)
    assert chosen == pytest.approx(step)
    shortest = min(times)
    assert resolution <= shortest / chosen <= 2 * resolution
    for t in times:
        assert t / chosen == pytest.approx(round(t / chosen))


class _Stoppable:
    """What run_model._Watch reads of a CpSolver: the bound callback it sets and stop_search."""

    def __init__(self) -> None:
        self.best_bound_callback = None
        self.stopped = False

    def stop_search(self) -> None:
        self.stopped = True


@pytest.mark.parametrize("bounds, stops", [((), True), ((3.0, 5.0), True), ((3.0, 6.0), False)])
def test_a_search_gives_up_only_where_its_bound_has_not_risen_above_the_callers(bounds: tuple[float, ...],
                                                                                stops: bool) -> None:
    solver = _Stoppable()
    watch = run_model._Watch(solver, run_model.GiveUp(30.0, 5))  # type: ignore[arg-type]
    for bound in bounds:
        solver.best_bound_callback(bound)  # type: ignore[misc]
    watch._check()
    assert solver.stopped is stops and watch.fired is stops


def test_a_search_done_before_its_give_up_time_has_not_given_up() -> None:
    g = grid("1p", "makespan")
    result = solve_grid(g, hint=None, horizon=HORIZON, time_limit=10, workers=1, seed=0,
                        give_up=run_model.GiveUp(30.0, 10**6))
    assert (result.status, result.objective, result.gave_up) == ("optimal", 7, False)
