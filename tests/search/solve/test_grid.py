"""solve/grid.py: the time grid CP-SAT runs on. exact_step is the greatest common step of every pass and
hop time (up to MAX_RESOLUTION units in the shortest pass), grid_is_exact, the real bound a grid bound
proves (makespan, and span on exact and inexact grids), a horizon that holds the incumbent, and refine:
no rounds where the start meets the bound or no time is left, and on a tiny case the hand-known optimum."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import pytest

from zbsearch.core.ir import Placement, dualpipe, linear, vshape
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.objective import Status
from zbsearch.core.profile import uniform_profile
from zbsearch.search.bounds.analytic import rank_bounds
from zbsearch.search.budget import Budget
from zbsearch.search.problem import Problem
from zbsearch.core.objective import OPTIMAL_RTOL
from zbsearch.search.options import SearchOptions
from zbsearch.search.solve.grid import (EXACT_FIRST_MAX_PASSES, MAX_RESOLUTION, GridSearch, _give_up, exact_step,
                                        grid_is_exact, horizon, real_bound, refine)
from zbsearch.search.solve.pair_phase import PAIR_MAX_PASSES
from zbsearch.search.exact.run_model import ModelResult
import zbsearch.search.solve.grid as grid_module
from zbsearch.search.solve.starts import Start, heuristic_start, one_at_a_time, valid_start
from zbsearch.sim.validate import ValidationReport, check


def _problem(F: float, B: float, W: float, comm: float = 0.0, *, p: int = 2, m: int = 2, objective: str = "makespan",
             placement: Placement | None = None, limit: str = "2p") -> Problem:
    prof = uniform_profile(F, B, W, comm, p=p, m=m)
    pl = placement or linear(p)
    return Problem(prof, pl, m, parse_mem_limit(limit, prof, pl), objective)


def _gcd(*times: str) -> float:
    """The greatest common divisor of decimal times, by exact fractions (zeros ignored)."""
    fracs = [Fraction(t) for t in times if Fraction(t) != 0]
    scale = math.lcm(*(f.denominator for f in fracs))
    return math.gcd(*(int(f * scale) for f in fracs)) / scale


@pytest.mark.parametrize("times", [
    ("4", "6", "2", "0"), ("4", "6", "6", "1"), ("6", "9", "3", "3"), ("12", "8", "4", "2"), ("2", "2", "2", "1"),
    ("1.5", "1", "1", "0"), ("0.3", "0.6", "0.9", "0.15"), ("2.5", "1.25", "5", "0.5"),
])
def test_exact_step_is_the_greatest_common_step_of_every_pass_and_hop(times: tuple[str, ...]) -> None:
    problem = _problem(*(float(t) for t in times))
    step = exact_step(problem)
    assert step == pytest.approx(_gcd(*times))
    assert step is not None and grid_is_exact(problem, step) and grid_is_exact(problem, step / 3)


def test_exact_step_gives_up_past_max_resolution_units_in_the_shortest_pass() -> None:
    # Coprime times: the step is 1, which is the shortest pass over MAX_RESOLUTION units at most.
    assert exact_step(_problem(MAX_RESOLUTION, MAX_RESOLUTION + 1, MAX_RESOLUTION + 1)) == pytest.approx(1.0)
    assert exact_step(_problem(MAX_RESOLUTION + 1, MAX_RESOLUTION + 2, MAX_RESOLUTION + 2)) is None


def test_a_grid_is_exact_only_where_every_time_is_a_whole_number_of_steps() -> None:
    problem = _problem(3, 2, 1, 0.5)  # every time a multiple of 0.5
    assert grid_is_exact(problem, 0.5) and grid_is_exact(problem, 0.25)
    assert not grid_is_exact(problem, 1.0)  # the hop 0.5 is half a step
    assert not grid_is_exact(problem, 0.3)
    assert not grid_is_exact(_problem(3, 2, 1), 2.0)  # F = 3 is 1.5 steps


@pytest.mark.parametrize("objective,step,grid_bound,bound", [
    ("makespan", 1.0, 10, 10.0), ("makespan", 2.0, 10, 20.0),  # makespan: the grid's rounding never helps it
    ("span", 1.0, 10, 10.0),  # span on the exact grid: real schedules map onto it exactly
    ("span", 2.0, 10, 18.0),  # span on a coarser grid: a rank's first start may lose one step
])
def test_the_real_bound_of_a_grid_bound(objective: str, step: float, grid_bound: int, bound: float) -> None:
    problem = _problem(3, 2, 1, objective=objective)  # exact on step 1, not on step 2 (F = 1.5 steps)
    assert real_bound(problem, grid_bound, step) == pytest.approx(bound)


@pytest.mark.parametrize("placement", [linear(2), vshape(2), dualpipe(2)], ids=lambda pl: pl.name)
@pytest.mark.parametrize("objective", ["makespan", "span"])
@pytest.mark.parametrize("step", [0.5, 1.0, 3.0])
def test_the_horizon_holds_the_incumbent(placement: Placement, objective: str, step: float) -> None:
    problem = _problem(2, 3, 1, 0.5, m=4, objective=objective, placement=placement, limit="1p")
    bounds = rank_bounds(problem, problem.passes)
    for schedule in (heuristic_start(problem).schedule, one_at_a_time(problem)):
        report = check(schedule, problem.profile, problem.limit)
        assert report.ok and report.timeline is not None
        tl = report.timeline
        latest = horizon(problem, bounds, tl, step)
        assert latest * step >= tl.makespan
        if objective == "span":
            # An optimal order run as soon as possible starts a rank at its head and ends within the
            # incumbent's span of it.
            assert latest * step >= max(b.head for b in bounds) + tl.span


def _search(problem: Problem, deadline: float = 30.0, budget: Budget = Budget()) -> GridSearch:
    """The rounds' shared state: the problem's exact rank bounds, `deadline` seconds from now, one worker."""
    options = SearchOptions(workers=1, seed=0, resolution=20, budget=budget)
    return GridSearch(problem, rank_bounds(problem, problem.passes), time.monotonic(), deadline, options, True)


@pytest.mark.parametrize("shortfall", [0.0, OPTIMAL_RTOL / 2])
def test_refine_returns_a_start_that_meets_the_bound_unchanged(shortfall: float) -> None:
    problem = _problem(1, 1, 1, m=4, limit="1p")
    start = valid_start(problem, one_at_a_time(problem))
    assert start is not None
    # A bound at the start's objective (or below it by less than the optimality tolerance) proves it.
    run = refine(_search(problem), start, start.objective * (1 - shortfall))
    assert run.best is start and run.rounds == () and run.cpsat_status == "not run"
    assert run.bound == pytest.approx(start.objective * (1 - shortfall))


def test_refine_runs_no_round_without_time_or_for_a_model_too_large_for_it() -> None:
    problem = _problem(1, 1, 1, m=4, limit="1p")
    start = valid_start(problem, one_at_a_time(problem))
    assert start is not None
    spent = refine(_search(problem, deadline=0.0), start, 1.0)
    assert spent.best is start and spent.rounds == () and spent.cpsat_status == "not run"
    slow = refine(_search(problem, budget=Budget(cpsat_seconds_per_pass=1e6)), start, 1.0)
    assert slow.best is start and slow.rounds == () and slow.cpsat_status.startswith("skipped")


def test_refine_reaches_the_known_optimum_from_one_microbatch_at_a_time() -> None:
    # p=2, m=4, F = B = W = 1 at 1p: rank 1 starts after one forward, then runs its 12 passes without a
    # gap (1p holds the two microbatches 1F1B needs in flight): makespan 1 + 12 = 13, no less possible.
    problem = _problem(1, 1, 1, m=4, limit="1p")
    start = valid_start(problem, one_at_a_time(problem))
    assert start is not None and start.objective == pytest.approx(20.0)
    run = refine(_search(problem), start, 12.0)
    assert run.best.objective == pytest.approx(13.0) and run.bound == pytest.approx(13.0)
    assert run.rounds and run.rounds[-1].cpsat_status is Status.OPTIMAL and run.rounds[-1].grid_step == 1.0
    assert isinstance(run.best, Start) and check(run.best.schedule, problem.profile, problem.limit).ok


@pytest.mark.parametrize("m, placement, limit, share", [
    (PAIR_MAX_PASSES // 24, "v", "1p", None),                # small enough for CP-SAT to prove: it keeps its time
    (PAIR_MAX_PASSES // 24 + 1, "v", "1p", 0.25),
    (EXACT_FIRST_MAX_PASSES // 24, "v", "1p", 0.25),
    (EXACT_FIRST_MAX_PASSES // 24 + 1, "v", "1p", 0.5),      # starts on a coarse grid: the windows re-time it
    (4 * EXACT_FIRST_MAX_PASSES // 24, "v", "1p", 0.5),
    (PAIR_MAX_PASSES // 24 + 1, "v", "none", None),          # no memory limit
    (EXACT_FIRST_MAX_PASSES // 24 + 1, "v", "none", None),
    (PAIR_MAX_PASSES // 12 + 1, "linear", "1p", None),       # one chunk per rank: the full model did better
    (EXACT_FIRST_MAX_PASSES // 12 + 1, "linear", "1p", None),
])
def test_a_round_gives_up_to_the_windows_only_on_a_capped_chunked_model_too_large_to_prove(
        m: int, placement: str, limit: str, share: float | None) -> None:
    pl = vshape(4) if placement == "v" else linear(4)  # 3 passes per microbatch and chunk
    problem = _problem(1, 1, 1, p=4, m=m, placement=pl, limit=limit)
    search = _search(problem, deadline=20.0, budget=Budget(grid_give_up_share=0.25, coarse_give_up_share=0.5))
    found = _give_up(search, 0.5, 10.2)
    assert (found is not None) is (share is not None)
    if found is not None:
        # the share of the time left, and the caller's bound in grid units, rounded up: CP-SAT must prove more
        assert found.seconds == pytest.approx(20.0 * share, abs=0.1) and found.bound == 21


def test_a_round_that_gave_up_says_so_even_when_the_validator_rejects_its_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver hands the windows the time a round gave up; a rejected answer must not hide that it did.
    problem = _problem(1, 1, 1, p=4, m=PAIR_MAX_PASSES // 24 + 1, placement=vshape(4), limit="1p")
    start = heuristic_start(problem)
    assert start is not None
    hinted = {ps.action: 0 for ps in problem.passes}
    monkeypatch.setattr(grid_module, "solve_grid", lambda *args, **kwargs: ModelResult(
        Status.FEASIBLE, 1, 0, hinted, 0.1, gave_up=True))
    monkeypatch.setattr(grid_module, "orders_from_starts", lambda *args: start.schedule)
    monkeypatch.setattr(grid_module, "check", lambda *args: ValidationReport(["rank 0: out of memory"]))
    run = refine(_search(problem), start, 1.0)
    assert run.best is start and run.rounds[-1].rejected == "rank 0: out of memory"
    assert run.gave_up
