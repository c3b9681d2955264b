"""Recompute chosen per microbatch (issue 28, deliverable 3): the greedy choice on a fixed order, and
CP-SAT windows that choose the order and which microbatches recompute together (exact/recompute_flags.py)."""

from __future__ import annotations

import math
import time

import pytest

from zbsearch.core.ir import Schedule
from zbsearch.core.placement import parse_placement
from zbsearch.core.recompute.levels import with_recompute
from zbsearch.search.recompute.search import all_full
from zbsearch.search.partition.search import SplitRequest, SplitSearch
from zbsearch.search.recompute.microbatches import choose_by_windows, keep_where_it_fits, recompute_fewer
from zbsearch.search.solve.starts import heuristic_start
from zbsearch.sim.simulate import simulate
from zbsearch.sim.validate import check, over_limit

from ..exact.test_lns import assert_forwards_and_backwards_in_microbatch_order
from .test_search import block, profile


def toy_problem(cap: str, m: int = 8):
    """Four blocks on two ranks, every block recomputed on every microbatch, two blocks a rank."""
    prof = profile([block(i, 1.0, 0.5) for i in range(4)], m)
    request = SplitRequest(prof, 2, ("linear",), cap, "makespan")
    levels = all_full(request)
    search = SplitSearch(SplitRequest(with_recompute(prof, levels, restage=False), 2, ("linear",), cap, "makespan"),
                         math.inf)
    return search.problem(parse_placement("linear", 2), (3, 3))


@pytest.mark.parametrize("cap", ["18GiB", "20GiB", "28GiB"])
def test_greedy_choice_fits_and_keeps_every_microbatch_that_fits(cap: str) -> None:
    """On the heuristic's order, the microbatches kept fit under the cap (the validator passes), and every
    microbatch left recomputing would put its rank over the cap if it were kept too (checked with the
    simulator, not with the choice's own running levels)."""
    problem = toy_problem(cap)
    start = heuristic_start(problem)
    choice = keep_where_it_fits(problem, start.schedule)
    assert choice is not None
    assert check(start.schedule.with_choice(choice), problem.profile, problem.limit).ok
    recomputing = [(c, i) for c, entry in enumerate(choice) if entry for i in entry]
    kept = sum(problem.num_microbatches - len(entry) for entry in choice if entry is not None)
    assert kept > 0
    for c, i in recomputing:
        more = tuple(entry if k != c else entry - {i} for k, entry in enumerate(choice))
        timeline = simulate(start.schedule.with_choice(more), problem.profile)
        rank = problem.placement.chunk_to_rank[c]
        assert over_limit(timeline.peak_memory(rank), problem.limit.per_rank[rank]), (c, i)


def test_windows_choose_order_and_microbatches_faster_than_the_greedy_choice() -> None:
    """At m=8 the whole problem is one window. At 16 GiB the heuristic's start is GPipe with fused
    backwards (a recomputed block, split, holds its rebuilt activations from I until W), and no
    microbatch fits kept on its order; the windows, which may fuse or split each backward, choose the
    order and which microbatches recompute together: faster, some microbatches kept. The plan passes the
    validator as it carries its choice, and is costed as solved."""
    problem = toy_problem("16GiB")
    start = heuristic_start(problem)
    _, greedy = recompute_fewer(problem, start)
    chosen_problem, chosen = choose_by_windows(problem, start, time.monotonic() + 4.5)
    assert chosen.objective < min(start.objective, greedy.objective) * (1 - 1e-6)
    choice = chosen.schedule.plan.recompute_microbatches
    assert choice is not None and len(choice) == 2 and choice == chosen_problem.recompute_microbatches
    # As a file states it: one entry per chunk, microbatch indices in range (checked as it loads).
    assert Schedule.from_dict(chosen.schedule.to_dict()).plan.recompute_microbatches == choice
    recomputing = [len(entry) for entry in choice if entry is not None]
    assert 0 < sum(recomputing) < 8 * len(recomputing)  # some microbatches recompute, not all
    report = check(chosen.schedule, problem.profile, problem.limit)
    assert report.ok, report
    assert report.timeline is not None and math.isclose(report.timeline.makespan, chosen.objective, rel_tol=1e-9)
    assert_forwards_and_backwards_in_microbatch_order(chosen.schedule)  # torch's runtime can run it


def test_windows_keep_every_microbatch_where_the_cap_is_roomy() -> None:
    """With room for every microbatch's activations nothing needs recompute: the windows keep them all."""
    problem = toy_problem("200GiB")
    start = heuristic_start(problem)
    chosen_problem, chosen = choose_by_windows(problem, start, time.monotonic() + 3)
    assert chosen_problem.recompute_microbatches is not None
    assert all(not entry for entry in chosen_problem.recompute_microbatches if entry is not None)
    assert check(chosen.schedule, problem.profile, problem.limit).ok


def test_windows_start_from_fused_backwards_that_hold_too_much_split() -> None:
    """Under torch's runtime a recomputed block's split I holds its rebuilt activations until W: the
    GPipe schedule at 16 GiB (as fast as 1F1B there, which the heuristic start prefers for its lower peak) is
    valid only with its backwards fused. The windows keep those whole (and may split them): they run from it,
    and their plan, with every microbatch recomputing, is valid and no slower."""
    from zbsearch.core.ir import Kind
    from zbsearch.search.exact import lns
    from zbsearch.search.exact.cpsat import fusable_chunks
    from zbsearch.search.greedy.candidates import candidates
    from zbsearch.search.solve.incumbent import with_backwards_split

    problem = toy_problem("16GiB")
    start = next(c for c in candidates(problem) if c.name == "gpipe")
    assert not check(with_backwards_split(start.schedule), problem.profile, problem.limit).ok
    kept_whole = with_backwards_split(start.schedule, keep_whole=fusable_chunks(problem))
    assert any(a.kind is Kind.FULL_B for rank in kept_whole.ranks for a in rank)
    found = lns.improve(problem, kept_whole, time.monotonic() + 3)
    assert found is not None
    schedule, timeline, objective = found.schedule, found.timeline, found.objective
    assert objective <= start.timeline.makespan * (1 + 1e-9)
    report = check(schedule, problem.profile, problem.limit)
    assert report.ok and report.timeline is not None
    assert math.isclose(report.timeline.makespan, objective, rel_tol=1e-9)


@pytest.mark.parametrize("cap", ["18GiB", "20GiB", "28GiB"])
def test_fewest_is_the_best_of_the_heuristics_top_schedules_with_fewer(cap) -> None:
    """microbatches.fewest keeps the microbatches that fit on each of the heuristics' best schedules and
    returns the fastest: never slower than doing so on the best schedule alone, and valid."""
    from zbsearch.search.greedy.candidates import candidates
    from zbsearch.search.recompute.microbatches import FEWER_TOP, fewest
    from zbsearch.search.solve.starts import Start

    problem = toy_problem(cap)
    chosen, start = fewest(problem)
    alone = recompute_fewer(problem, heuristic_start(problem))[1]
    assert start.objective <= alone.objective * (1 + 1e-12)
    top = [Start(*c, problem.objective.of(c.timeline)) for c in candidates(problem, top=FEWER_TOP, same_placement=True)]
    assert start.objective == pytest.approx(min(recompute_fewer(problem, s)[1].objective for s in top))
    assert check(start.schedule, chosen.profile, chosen.limit).ok
