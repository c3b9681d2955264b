"""The large-neighbourhood search: windows re-solved with the rest fixed, never worse, always valid."""

from __future__ import annotations

import random
import time

import pytest

from zbsearch.core.ir import linear, vshape
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.profile import Profile
from zbsearch.search.options import SearchOptions
from zbsearch.search.exact import lns
from zbsearch.search.exact.cpsat import choose_step
from zbsearch.search.problem import Problem, on_grid
from zbsearch.search.budget import Budget
from zbsearch.search.solve.driver import solve
from zbsearch.search.solve.incumbent import with_backwards_split
from zbsearch.search.solve.starts import heuristic_start, one_at_a_time
from zbsearch.sim.simulate import simulate
from zbsearch.sim.validate import check, validate


def hetero(p: int, m: int, seed: int, comm: float = 1.0) -> Profile:
    rng = random.Random(seed)
    stages = [{"F": rng.randint(6, 14), "B": rng.randint(6, 16), "W": rng.randint(3, 12), "mem_B": 1.0,
               "mem_W": rng.choice([0.3, 0.5])} for _ in range(p)]
    return Profile.from_dict({"name": f"random{seed}", "num_stages": p, "microbatches": m, "stages": stages,
                              "comm": comm, "source": {"kind": "estimated", "method": "random test"}})


def _problem(p: int, m: int, seed: int, limit: str, placement=linear, objective: str = "span") -> Problem:
    prof = hetero(p, m, seed)
    pl = placement(p)
    return Problem(prof, pl, m, parse_mem_limit(limit, prof, pl), objective)


def _grid_incumbent(problem: Problem, schedule):
    grid = on_grid(problem, choose_step(problem, 20))
    return grid, simulate(schedule, grid.profile)


@pytest.mark.parametrize("placement", [linear, vshape])
def test_a_window_with_everything_fixed_gives_back_the_incumbent(placement):
    problem = _problem(4, 8, seed=3, limit="1p", placement=placement)
    start = with_backwards_split(heuristic_start(problem).schedule)
    grid, grid_tl = _grid_incumbent(problem, start)
    everything_before = lns.Window(tuple(len(r) for r in grid_tl.slots), (0,) * problem.num_ranks)
    wm = lns.build_window_model(grid, grid_tl, everything_before, problem.objective)
    assert wm.v.start == {}
    assert lns.splice(grid, wm, {}, "x").ranks == start.ranks
    # And with every pass after the window: the orders come back too.
    nothing_before = lns.Window((0,) * problem.num_ranks, (0,) * problem.num_ranks)
    wm = lns.build_window_model(grid, grid_tl, nothing_before, problem.objective)
    assert lns.splice(grid, wm, {}, "x").ranks == start.ranks


@pytest.mark.parametrize("objective", ["span", "makespan"])
def test_the_hint_is_feasible_in_every_window_model(objective):
    # The incumbent must satisfy its own window's model (memory blocks held across, fixed inputs,
    # the rank's free time): re-solving a window can then only keep it or do better on the proxy.
    problem = _problem(4, 8, seed=5, limit="1p", objective=objective)
    start = with_backwards_split(one_at_a_time(problem))
    grid, grid_tl = _grid_incumbent(problem, start)
    ends = sorted(s.start for s in grid_tl.iter_slots())
    from ortools.sat.python import cp_model

    for t0, t1 in ((ends[0], ends[30]), (ends[30], ends[60]), (ends[60], float("inf"))):
        wm = lns.build_window_model(grid, grid_tl, lns.window_at(grid_tl, t0, t1), problem.objective)
        for a, s in wm.hint.items():
            wm.model.add(wm.v.start[a] == s)
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = 10
        solver.parameters.num_workers = 1
        assert solver.solve(wm.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)


@pytest.mark.parametrize("limit", ["0.75p", "1p", "2p"])
def test_lns_improves_a_poor_start_and_the_result_validates(limit):
    problem = _problem(4, 10, seed=11, limit=limit)
    start = with_backwards_split(one_at_a_time(problem))
    before = check(start, problem.profile, problem.limit)
    assert before.ok and before.timeline is not None
    found = lns.improve(problem, start, time.monotonic() + 6, workers=1)
    assert found is not None
    schedule, timeline, obj, stats = found.schedule, found.timeline, found.objective, found.stats
    # Microbatches one after another leave almost every rank idle: any window frees some of it.
    assert obj < before.timeline.span * 0.9
    assert stats.improved >= 1
    # Re-timed orders only fail the exact check when the window's memory model let through what the
    # exact limit does not: it never should.
    assert stats.rejected == 0
    validate(schedule, problem.profile, problem.limit)
    assert simulate(schedule, problem.profile).span == pytest.approx(obj)
    assert obj == pytest.approx(timeline.span)


def test_lns_on_the_v_shape_keeps_memory_and_never_gets_worse():
    problem = _problem(4, 8, seed=2, limit="1p", placement=vshape)
    start = with_backwards_split(one_at_a_time(problem))
    found = lns.improve(problem, start, time.monotonic() + 4, workers=1)
    assert found is not None
    schedule, obj, stats = found.schedule, found.objective, found.stats
    assert stats.rejected == 0
    validate(schedule, problem.profile, problem.limit)
    assert obj <= simulate(start, problem.profile).span
    assert_forwards_and_backwards_in_microbatch_order(schedule)


def assert_forwards_and_backwards_in_microbatch_order(schedule) -> None:
    """Every chunk's F, and its I (or fused backward), in microbatch order: windows once reordered them
    (44 of 160 passes at 1p below), and torch's runtime then took the last stage's losses for the wrong
    microbatches; its export refuses such a plan."""
    from zbsearch.core.ir import Kind
    from zbsearch.interop.formats.export import torch_compatible

    for rank in schedule.ranks:
        seen: dict[tuple[int, bool], int] = {}
        for a in (x for action in rank for x in action.passes() if x.kind is not Kind.W):
            key = (a.chunk, a.kind is Kind.F)
            assert a.microbatch > seen.get(key, -1), (str(a), rank)
            seen[key] = a.microbatch
    if len(schedule.placement.routes) == 1:
        torch_compatible(schedule)


@pytest.mark.parametrize("limit", ["0.75p", "1p"])
def test_windows_keep_forwards_and_backwards_in_microbatch_order(limit):
    problem = _problem(4, 10, seed=11, limit=limit)
    start = with_backwards_split(one_at_a_time(problem))
    found = lns.improve(problem, start, time.monotonic() + 3, workers=1)
    assert found is not None and found.stats.improved >= 1
    assert_forwards_and_backwards_in_microbatch_order(found.schedule)


def test_an_invalid_start_is_refused():
    problem = _problem(4, 8, seed=1, limit="1p")
    ranks = [list(r) for r in with_backwards_split(one_at_a_time(problem)).ranks]
    ranks[0] = ranks[0][1:] + ranks[0][:1]   # its first forward last: deadlocks
    broken = problem.empty_schedule("broken", ranks)
    assert lns.improve(problem, broken, time.monotonic() + 2) is None


def test_solve_runs_the_search_when_the_full_model_is_skipped():
    problem = _problem(4, 12, seed=9, limit="0.75p")
    result = solve(problem, SearchOptions(time_limit=8, workers=1, budget=Budget(cpsat_seconds_per_pass=1e6)))
    assert result.details.cpsat_status.startswith("skipped")
    assert result.details.lns is not None and result.details.lns.windows >= 1
    assert result.objective <= result.heuristic_objective
    validate(result.schedule, problem.profile, problem.limit)
    assert simulate(result.schedule, problem.profile).span == pytest.approx(result.objective)


def test_a_window_holding_every_pass_solved_to_optimality_ends_the_search() -> None:
    """p=2, m=4: the first window holds all 24 passes; once CP-SAT proves it optimal on the grid no later
    window can do better there, so the search stops instead of re-solving the same model to its deadline."""
    problem = _problem(2, 4, seed=1, limit="1p")
    start = with_backwards_split(one_at_a_time(problem))
    found = lns.improve(problem, start, time.monotonic() + 30, workers=1)
    assert found is not None
    schedule, timeline, objective, stats = found.schedule, found.timeline, found.objective, found.stats
    assert stats.settled and stats.windows == 1
    assert check(schedule, problem.profile, problem.limit).ok
