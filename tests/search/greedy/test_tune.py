"""The per-rank tuned list greedy (zbsearch/search/greedy/tune.py)."""

from __future__ import annotations


import pytest

from zbsearch.search.options import SearchOptions
from zbsearch.search.budget import Budget
from zbsearch.core.ir import linear
from zbsearch.core.memory import parse_mem_limit as parse_limit
from zbsearch.core.profile import Profile
from zbsearch.search.greedy import candidates as heuristics
from zbsearch.search.greedy.list_engine import ListEngine
from zbsearch.search.greedy.options import GreedyOptions, RankPolicy
from zbsearch.search.greedy.tune import neighbours, tune, uniform_starts
from zbsearch.search.problem import Problem, make_problem
from zbsearch.search.solve.driver import solve
from zbsearch.sim.simulate import simulate
from zbsearch.sim.validate import check
from random_pipelines import integer_stages

# bench/solve_bench.py's hetero-random #12 (p=8, m=25, 0.75p): the first rank is memory-bound.
STAGES_12 = [(140, 143, 127, 1.269, 0.431), (111, 141, 71, 1.216, 0.472), (101, 131, 81, 0.853, 0.394),
             (126, 161, 67, 1.287, 0.526), (113, 128, 68, 1.352, 0.427), (99, 108, 55, 1.184, 0.538),
             (146, 165, 89, 1.679, 0.823), (81, 83, 61, 0.825, 0.354)]


def hetero_12() -> Profile:
    return Profile.from_dict({
        "name": "hetero-random-12", "num_stages": 8, "microbatches": 25, "time_unit": "unit",
        "stages": [{"F": f, "B": b, "W": w, "mem_B": mb, "mem_W": mw} for f, b, w, mb, mw in STAGES_12],
        "comm": [9, 9, 1, 5, 8, 2, 5],
        "source": {"kind": "estimated", "method": "random heterogeneous stages (tests)"},
    })


@pytest.mark.parametrize("options", [GreedyOptions("list", False, b, f, warmup=k)
                                     for b in (False, True) for f in (False, True) for k in (None, 1, 2)])
def test_uniform_per_rank_policies_are_the_plain_variant(options):
    """Per-rank policies that repeat one variant's switches give exactly that variant's schedule."""
    prof = integer_stages(3, 5, 12)
    limit = parse_limit("1p", prof)
    pl = linear(5)
    ranks = tuple(options.policy(r, r, 5) for r in range(5))
    problem = Problem(prof, pl, 12, limit)
    plain = ListEngine(problem, options).run()
    per_rank = ListEngine(problem, GreedyOptions("list", ranks=ranks)).run()
    assert per_rank.order == plain.order


def test_neighbours_change_one_choice_of_one_rank():
    ranks = (RankPolicy(3, False, "fill"), RankPolicy(1, True, "eager"))
    found = list(neighbours(ranks, 1))
    assert all(n[0] == ranks[0] for n in found)
    assert all(sum(a != b for a, b in zip((n[1].inflight, n[1].b_first, n[1].w_mode),
                                          (1, True, "eager"))) == 1 for n in found)
    assert all(n[1].inflight >= 1 for n in found)
    assert {n[1].w_mode for n in found} == {"fill", "fit", "eager"}


def test_tuned_start_beats_every_heuristic_on_a_memory_bound_pipeline():
    """On hetero-random #12 the best heuristic (uniform greedy variants and handcrafted schedules) spans
    12,522; tuning each rank's policy finds a shorter schedule, and it is valid as the engine says."""
    prof = hetero_12()
    limit = parse_limit("0.75p", prof)
    problem = Problem(prof, linear(8), 25, limit, "span")
    (_, _, best_tl), = heuristics.candidates(problem, top=1, same_placement=True)
    assert best_tl.span == 12522
    tuned = tune(problem, max_evaluations=420)
    assert tuned is not None
    assert tuned.cost < 0.98 * best_tl.span
    schedule = heuristics.engine_schedule(tuned.result, problem, tuned.options)
    report = check(schedule, prof, limit)
    assert report.ok, report.problems[:2]
    assert report.timeline.span == pytest.approx(tuned.cost)
    # Ranks do not all end up with one policy: that is what no uniform variant could give.
    assert len(set(tuned.options.ranks)) > 1


@pytest.mark.parametrize("seed", range(4))
def test_tuning_is_deterministic_and_never_worse_than_its_starts(seed):
    prof = integer_stages(seed, 4, 10)
    limit = parse_limit("1p", prof)
    problem = Problem(prof, linear(4), 10, limit, "makespan")
    first = tune(problem, max_evaluations=150, seed=seed)
    again = tune(problem, max_evaluations=150, seed=seed)
    assert first is not None and again is not None
    assert first.options == again.options and first.cost == again.cost
    starts = [ListEngine(problem, o).run().cost("makespan")
              for o in uniform_starts(linear(4), GreedyOptions("list"))]
    assert first.cost <= min(starts)
    assert simulate(heuristics.engine_schedule(first.result, problem, first.options), prof).makespan \
        == pytest.approx(first.cost)


def test_solve_starts_from_the_tuned_greedy():
    # Half the time to the tuning, a second or two: time-bounded, so a busy machine finds less.
    prof = hetero_12()
    problem = make_problem(prof, "0.75p", "span")
    result = solve(problem, SearchOptions(time_limit=4, workers=1, budget=Budget(tune_share=0.5)))
    assert result.details.tuned_start is not None
    assert result.start_heuristic.startswith("greedy(list,per-rank")
    assert result.heuristic_objective < 12522
    assert result.objective <= result.heuristic_objective
    assert check(result.schedule, prof, problem.limit).ok
