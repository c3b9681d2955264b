"""search/exact/rank_subset.py and solve/pair_phase.py: the bound with a few ranks kept whole holds (never above
a proven optimum), rises with the ranks kept, meets the optimum with every rank kept, and lifts the bound
above the analytic one where memory binds; the pair phase runs only where it can pay."""

from __future__ import annotations

import pytest

from zbsearch.core.profile import uniform_profile
from zbsearch.search.bounds.analytic import lower_bound
from zbsearch.search.exact.rank_subset import applies, subset_bound
from zbsearch.search.options import SearchOptions
from zbsearch.search.problem import Problem, make_problem
from zbsearch.search.solve.driver import solve
from zbsearch.search.solve.pair_phase import PAIR_MAX_PASSES, pair_order, worth_a_pair

SECONDS = 20.0  # each of these models proves in a few seconds; the limit only guards a slow machine


def capped(times: tuple[float, float, float] = (2, 3, 2), p: int = 3, m: int = 4, limit: str = "0.6p",
           placement: str = "v") -> Problem:
    return make_problem(uniform_profile(*times, p=p, m=m), limit, "makespan", placement)


@pytest.fixture(scope="module")
def optimum() -> float:
    result = solve(capped(), SearchOptions(time_limit=SECONDS, workers=1))
    assert result.status.value == "optimal"
    return result.objective


def test_the_bound_holds_and_rises_with_the_ranks_kept(optimum: float) -> None:
    problem = capped()
    one = subset_bound(problem, (0,), SECONDS)
    pair = subset_bound(problem, (0, 2), SECONDS)
    every = subset_bound(problem, (0, 1, 2), SECONDS)
    assert one.proven and pair.proven and every.proven
    assert one.value <= pair.value <= every.value <= optimum * (1 + 1e-9)
    assert every.value == pytest.approx(optimum)  # every rank kept: the whole problem, on an exact grid
    # Where memory binds, rank 0 and the V-shape's turn kept whole see what the analytic bound misses.
    assert lower_bound(problem) < pair.value == pytest.approx(optimum)


@pytest.mark.parametrize("times, p, m, limit, placement", [
    ((1, 1, 1), 3, 4, "0.5p", "v"), ((2, 3, 2), 3, 6, "0.5p", "linear"), ((3, 2, 1), 3, 5, "0.7p", "linear")])
def test_no_pair_bounds_above_a_proven_optimum(times, p, m, limit, placement) -> None:
    problem = capped(times, p, m, limit, placement)
    result = solve(problem, SearchOptions(time_limit=SECONDS, workers=1))
    assert result.status.value == "optimal"
    for r in pair_order(p):
        found = subset_bound(problem, (0, r), SECONDS)
        assert found.value <= result.objective * (1 + 1e-9)


def test_the_bound_is_left_out_where_the_solvers_model_is_no_relaxation() -> None:
    problem = capped()
    assert applies(problem)
    span = make_problem(uniform_profile(2, 3, 2, p=3, m=4), "0.6p", "span", "v")
    assert not applies(span) and subset_bound(span, (0, 2), SECONDS).value == 0.0


def test_the_pair_phase_runs_only_where_it_can_pay() -> None:
    problem = capped()
    assert worth_a_pair(problem, 60.0, 50.0)
    assert not worth_a_pair(problem, 50.0, 50.0)  # no gap left
    assert not worth_a_pair(capped(limit="none"), 60.0, 50.0)  # memory does not bind
    assert not worth_a_pair(capped(p=2, m=4), 60.0, 50.0)  # a pair of two is the grid model
    big = capped(m=PAIR_MAX_PASSES // 18 + 1)  # 3 ranks x 2 chunks x 3 passes per microbatch
    assert len(big.passes) > PAIR_MAX_PASSES and not worth_a_pair(big, 1e9, 0.0)
    assert pair_order(4) == [3, 1, 2] and pair_order(3) == [2, 1]


def test_solve_starts_its_grid_rounds_from_what_the_pair_phase_proved() -> None:
    result = solve(capped(), SearchOptions(time_limit=10.0, workers=1))
    pairs = result.details.pair_bound
    assert pairs is not None and pairs.tried >= 1 and pairs.kept[0] == 0
    assert pairs.value <= result.objective * (1 + 1e-9) and result.lower_bound >= pairs.value * (1 - 1e-9)
    assert "pair_bound" in result.details.to_dict()
