"""The nesting bound (bounds/window_nesting.py): a rank's window holds every deeper rank's, never above a real
schedule, and where a deep rank sends microbatches round in waves it lifts the ranks above it."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from zbsearch.core.profile import Profile
from zbsearch.search.options import SearchOptions
from zbsearch.search.bounds.analytic import lower_bound, objective_bound, rank_bounds
from zbsearch.search.solve.starts import heuristic_start
from zbsearch.search.problem import make_problem
from zbsearch.search.bounds.relaxations import bound_passes
from zbsearch.sim.validate import check

from random_pipelines import tell_cpsat_no_bounds


def _hetero(p: int, m: int) -> Profile:
    """bench/results_hetero.py's profile: first stage 1.2x, last 1.5x, comm 5% of F, mem_W = mem_B / 2."""
    stages = []
    for r in range(p):
        k = 1.2 if r == 0 else 1.5 if r == p - 1 else 1.0
        stages.append({"F": 100 * k, "B": 100 * k, "W": 80 * k, "mem_B": 1.0 * k, "mem_W": 0.5 * k})
    return Profile.from_dict({"stages": stages, "comm": 5.0, "microbatches": m,
                              "source": {"kind": "estimated", "method": "synthetic test profile"}})


def test_a_rank_that_sends_microbatches_in_waves_holds_every_rank_above_it():
    # V-shape at 0.5p, p=8, m=8: the turn rank holds both chunks of a microbatch at once, four at a
    # time, so the eight go round in two groups; rank 0 waits for the second. The one-rank bounds
    # stop at 3,700; the nesting reaches 4,398, which zbsearch's solve has matched (solve_bench small-auto).
    problem = make_problem(_hetero(8, 8), "0.5p", "span", "v")
    bounds = rank_bounds(problem, bound_passes(problem))
    one_rank = objective_bound([replace(b, nested=0.0) for b in bounds], "span")
    assert one_rank == pytest.approx(3700)
    assert lower_bound(problem) == pytest.approx(4398)
    assert max(range(8), key=lambda r: bounds[r].span) == 0  # the outermost rank carries it
    schedule = heuristic_start(problem).schedule
    report = check(schedule, problem.profile, problem.limit)
    assert report.ok and report.timeline.span >= lower_bound(problem) - 1e-9


def test_the_turn_rank_gets_the_walk_its_many_microbatches_need():
    # m=24: the turn rank's walk needs about 40,000 states, past the other ranks' budget; the nesting
    # then lifts the bound from the one-rank 10,420 to 11,118 (the plan solve_bench found: 11,288).
    problem = make_problem(_hetero(8, 24), "0.5p", "span", "v")
    bounds = rank_bounds(problem, bound_passes(problem))
    assert objective_bound([replace(b, nested=0.0) for b in bounds], "span") == pytest.approx(10420)
    assert objective_bound(bounds, "span") == pytest.approx(11118)


def test_with_memory_to_spare_the_last_gradient_still_comes_back():
    # No limit: rank 0 ends after the last rank's forwards and backwards and the trips to it and back.
    problem = make_problem(_hetero(4, 6), None, "makespan")
    bounds = rank_bounds(problem, bound_passes(problem))
    trip = 3 * (100 + 5) + 0.2 * 100  # rank 0's F is 120: 120 + 5 + 100 + 5 + 100 + 5 to the last rank
    last = 6 * (150 + 150)
    back = 3 * 5 + 100 + 100 + 120  # from the last rank's B to rank 0's B's end
    assert bounds[0].nested == pytest.approx(trip + last + back + 96)
    assert bounds[-1].nested == 0.0  # nothing is deeper than the last rank


@pytest.mark.parametrize("seed,placement,limit,objective", [
    (0, "linear", "0.5p", "makespan"), (1, "linear", "0.5p", "span"), (2, "linear", "0.75p", "span"),
    (3, "linear", "1p", "makespan"), (4, "v", "0.5p", "span"), (5, "interleaved:2", "0.5p", "span"),
])
def test_nesting_never_exceeds_the_optimum_cpsat_proves_without_it(monkeypatch, seed, placement, limit, objective):
    """CP-SAT told no analytic bound proves the optimum of small integer-time instances; the nesting
    bound stays at or below it."""
    from zbsearch.search.solve.driver import solve

    rng = random.Random(500 + seed)
    p, m = (rng.choice([3, 4]), rng.choice([3, 4])) if placement == "linear" else (2, rng.choice([2, 3]))
    stages = [{"F": rng.randint(2, 6), "B": rng.randint(2, 7), "W": rng.randint(1, 5), "mem_B": rng.choice([1.0, 2.0]),
               "mem_W": rng.choice([0.0, 0.5])} for _ in range(p)]
    prof = Profile.from_dict({"stages": stages, "comm": rng.randint(0, 2), "microbatches": m,
                              "source": {"kind": "estimated", "method": "random test"}})
    problem = make_problem(prof, limit, objective, placement)
    nested = max(b.nested + (b.head if objective == "makespan" else 0.0)
                 for b in rank_bounds(problem, bound_passes(problem)))
    tell_cpsat_no_bounds(monkeypatch)
    result = solve(problem, SearchOptions(time_limit=20))
    assert result.status == "optimal", "the instance is meant to be small enough for CP-SAT to prove"
    assert 0 < nested <= result.objective + 1e-9


def test_the_split_walk_can_leave_the_nesting_out():
    # The split walk bounds thousands of splits; it asks for the one-rank bounds only.
    problem = make_problem(_hetero(8, 8), "0.5p", "span", "v")
    plain = rank_bounds(problem, bound_passes(problem), nesting=False)
    assert all(b.nested == 0.0 for b in plain)
    assert objective_bound(plain, "span") == pytest.approx(3700)
