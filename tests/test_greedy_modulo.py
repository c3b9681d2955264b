"""The periodic start (greedy_modulo.py): its orders are complete and never deadlock, whatever the
period; under a tight byte cap on a V-shape it beats every other heuristic start."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

from zbsearch.search.greedy_modulo import _Ring, best_periodic, periodic_schedule
from zbsearch.search.problem import make_problem
from zbsearch.sim.validate import check

from random_pipelines import random_stages

ROOT = Path(__file__).resolve().parent.parent


def test_a_pass_takes_the_first_free_phase_and_may_wrap():
    ring = _Ring(10.0)
    ring.take(2.0, 3.0)                      # busy [2, 5)
    assert ring.earliest(3.0, 2.0) == 5.0    # waits for the busy phase to end
    assert ring.earliest(1.0, 2.0) == 5.0    # [1, 3) would overlap
    assert ring.earliest(17.0, 4.0) == 17.0  # phase 7: [7, 11) wraps to [0, 1), free
    ring.take(17.0, 4.0)
    assert ring.earliest(20.0, 1.0) == 21.0  # phase 0 is taken by the wrapped piece; phase 1 is free
    assert ring.earliest(0.0, 3.0) is None   # gaps left: [1, 2) and [5, 7)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("placement", ["v", "interleaved:2", "linear"])
def test_periodic_orders_are_complete_and_never_deadlock(seed: int, placement: str) -> None:
    rng = random.Random(600 + seed)
    p = rng.randint(2, 4)
    m = rng.randint(1, 3) * p
    prof = random_stages(rng, p, m)
    problem = make_problem(prof, None, "makespan", placement)
    work = max(sum(ps.duration for ps in problem.passes if ps.rank == r and ps.action.microbatch == 0)
               for r in range(p))
    built = 0
    for ratio in (1.0, 1.1, 1.5, 2.0):
        schedule = periodic_schedule(problem, work * ratio, weights_last=rng.random() < 0.5)
        if schedule is None:
            continue
        built += 1
        report = check(schedule, prof, problem.limit)
        assert report.ok, report.problems
    assert built > 0


def test_the_two_weight_orders_are_different_schedules() -> None:
    """Weight passes last, or each right after its backward: the sweep tries both, so they must differ."""
    prof = random_stages(random.Random(7), 4, 8)
    problem = make_problem(prof, None, "makespan", "v")
    work = max(sum(ps.duration for ps in problem.passes if ps.rank == r and ps.action.microbatch == 0)
               for r in range(4))
    differ = 0
    for ratio in (1.1, 1.3, 1.6):
        last, after_b = (periodic_schedule(problem, work * ratio, w) for w in (True, False))
        assert last is not None and after_b is not None
        differ += last.ranks != after_b.ranks
    assert differ > 0


def test_periodic_start_wins_on_a_tight_v_split() -> None:
    """DeepSeek-V2-Lite-like at p=8 under a 42 GiB cap, on the V split of least cheap bound: the middle
    ranks hold six chunk-microbatches. Every greedy start waits on the long round trips; the periodic
    one was 13% shorter when measured (1,272k against 1,466k us)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from partition_study import study_profile

    from zbsearch.search.partition_search import SplitRequest, SplitSearch
    from zbsearch.search.problem import parse_placement
    from zbsearch.search.solve import heuristic_start
    from zbsearch.search.starts import periodic_applies, periodic_start

    prof = study_profile("deepseek-v2-lite", 8)
    search = SplitSearch(SplitRequest(prof, 8, ("v",), "42GiB", "makespan"), time.monotonic() + 600)
    problem = search.problem(parse_placement("v", 8), (3, 2, 2, 2, 2, 2, 2, 1, 2, 1, 2, 2, 2, 2, 1, 1))
    assert periodic_applies(problem)
    name, schedule, tl = heuristic_start(problem)
    details: dict = {}
    start = periodic_start(problem, (name, schedule, tl, tl.makespan), time.monotonic() + 60, details)
    assert details["periodic_start"]["from"] == name
    assert start[3] < 0.95 * tl.makespan
    assert check(start[1], problem.profile, problem.limit).ok
    found = best_periodic(problem, time.monotonic() + 60)
    assert found is not None and found[1] == pytest.approx(start[3])
