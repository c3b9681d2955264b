"""The Zero Bubble paper's round-by-round greedy (zbsearch/search/greedy/rounds.py) on a linear
placement: its own timing is the simulator's, its warm-up runs the forwards the paper's rule gives, and
on uniform stages (F = B = W) it reaches the closed forms of ZB-H2 (no limit) and ZB-H1 (warm-up capped
at 1F1B's), worked out by hand below."""

from __future__ import annotations


import pytest

from zbsearch.core.ir import Kind, linear
from zbsearch.core.memory import MemoryLimit, no_limit, parse_mem_limit
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.search.greedy.candidates import engine_schedule
from zbsearch.search.greedy.options import CannotFit, EngineResult, GreedyOptions, fits
from zbsearch.search.greedy.rounds import RoundsEngine
from zbsearch.search.problem import Problem
from zbsearch.sim.validate import validate
from random_pipelines import uneven_stages


def _first_b(res: EngineResult) -> list[int]:
    """Per rank, how many passes (all forwards) it runs before its first B."""
    return [next(i for i, step in enumerate(order) if step.kind is Kind.B) for order in res.order]


OPTIONS = [GreedyOptions(), GreedyOptions("rounds", True, True, False), GreedyOptions(b_first=True),
           GreedyOptions(w_fill=False, warmup=1), GreedyOptions(warmup=2)]
CASES = [("uniform", uniform_profile(1, 2, 1, 0.5, p=4, m=8), "2p"),
         ("uniform-1p", uniform_profile(3, 3, 2, p=3, m=7), "1p"),
         ("hetero", uneven_stages(1, 4, 9), "1.5p"), ("hetero-none", uneven_stages(2, 3, 5), "none")]


@pytest.mark.parametrize("name,profile,limit", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("options", OPTIONS, ids=[o.label for o in OPTIONS])
def test_the_engines_timing_is_the_simulators(name: str, profile: Profile, limit: str, options: GreedyOptions) -> None:
    p, m = profile.num_stages, profile.microbatches
    problem = Problem(profile, linear(p), m, parse_mem_limit(limit, profile))
    res = RoundsEngine(problem, options).run()
    tl = validate(engine_schedule(res, problem, options), profile, problem.limit)
    assert tl is not None
    assert res.first_start == pytest.approx([tl.first_start(r) for r in range(p)], rel=1e-12)
    assert res.last_end == pytest.approx([tl.last_end(r) for r in range(p)], rel=1e-12)
    assert res.cost("makespan") == pytest.approx(tl.makespan, rel=1e-12)
    assert res.cost("span") == pytest.approx(tl.span, rel=1e-12)
    assert res.peak == pytest.approx([tl.peak_memory(r) for r in range(p)], rel=1e-12)
    assert all(fits(peak, cap) for peak, cap in zip(res.peak, problem.limit.per_rank))
    # Every rank runs each kind once per microbatch, each kind in microbatch order.
    for order in res.order:
        for kind in (Kind.F, Kind.B, Kind.W):
            assert [s.microbatch for s in order if s.kind is kind] == list(range(m))


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_the_warm_up_is_zb_h2s_without_a_limit_and_1f1bs_when_capped(p: int) -> None:
    # F = B = W = 1, no hops, m = 2p + 1. Microbatch i's F runs on rank r in [i + r, i + r + 1]; its B0
    # comes back to rank r at 2p - 1 - r. Until then rank r runs forwards back to back from time r:
    # 2p - 1 - 2r of them (ZB-H2's warm-up). A cap of k runs at most k x (p - 1 - r) beyond the first
    # forward: with k = 1, p - r (1F1B's and ZB-H1's).
    m = 2 * p + 1
    profile = uniform_profile(1, 1, 1, p=p, m=m)
    problem = Problem(profile, linear(p), m, no_limit(profile))
    assert _first_b(RoundsEngine(problem, GreedyOptions()).run()) == [2 * p - 1 - 2 * r for r in range(p)]
    assert _first_b(RoundsEngine(problem, GreedyOptions(warmup=2)).run()) == [2 * p - 1 - 2 * r for r in range(p)]
    assert _first_b(RoundsEngine(problem, GreedyOptions(warmup=1)).run()) == [p - r for r in range(p)]


@pytest.mark.parametrize("p,m", [(2, 3), (3, 5), (3, 9), (4, 7), (4, 12), (5, 16)])
@pytest.mark.parametrize("t", [1.0, 2.5])
def test_uniform_stages_without_a_limit_reach_zero_bubble(p: int, m: int, t: float) -> None:
    # F = B = W = t, no hops, no limit, m >= 2p - 1 (ZB-H2's condition). Lower bounds, by hand: every
    # rank has 3mt of work, so span >= 3mt; the last rank's first input arrives at (p-1)t, so
    # makespan >= 3mt + (p-1)t. ZB-H2 (Qi et al., ICLR 2024, Fig. 3) meets both; so does the paper's greedy.
    profile = uniform_profile(t, t, t, p=p, m=m)
    res = RoundsEngine(Problem(profile, linear(p), m, no_limit(profile)), GreedyOptions()).run()
    assert res.cost("span") == pytest.approx(3 * m * t)
    assert res.cost("makespan") == pytest.approx(3 * m * t + (p - 1) * t)


@pytest.mark.parametrize("p,m", [(2, 3), (3, 4), (4, 8), (5, 6)])
def test_a_1f1b_warm_up_leaves_zb_h1s_bubble(p: int, m: int) -> None:
    # With the warm-up capped at 1F1B's (warmup=1) and m >= p, the schedule is ZB-H1's: its bubble is
    # (p-1)(F + B - W) (Qi et al., Section 3.1), here (p-1) x 1, so span = 3m + p - 1; the makespan is
    # the last rank's 3m after its (p-1) start, the same figure.
    profile = uniform_profile(1, 1, 1, p=p, m=m)
    res = RoundsEngine(Problem(profile, linear(p), m, no_limit(profile)), GreedyOptions(warmup=1)).run()
    assert res.cost("span") == 3 * m + p - 1
    assert res.cost("makespan") == 3 * m + p - 1


@pytest.mark.parametrize("p", [1, 2, 4])
def test_one_microbatch_is_its_critical_path(p: int) -> None:
    # m = 1, F = B = W = 1: F down the ranks ends at p, B back up ends on rank 0 at 2p, its W at 2p + 1.
    profile = uniform_profile(1, 1, 1, p=p, m=1)
    res = RoundsEngine(Problem(profile, linear(p), 1, no_limit(profile)), GreedyOptions()).run()
    assert res.cost("makespan") == 2 * p + 1
    assert res.last_end == [2 * p + 1 - r for r in range(p)]      # rank r's B ends at 2p - r, its W 1 later
    assert res.first_start == [float(r) for r in range(p)]


def test_the_smallest_feasible_limit_runs_one_microbatch_at_a_time() -> None:
    # Room for exactly one microbatch's activations per rank: each F must wait for the previous W there.
    profile = uniform_profile(1, 1, 1, p=3, m=4)
    limit = MemoryLimit("1 stage", (1.0, 1.0, 1.0))
    res = RoundsEngine(Problem(profile, linear(3), 4, limit), GreedyOptions()).run()
    assert res.peak == [1.0, 1.0, 1.0]
    for order in res.order:
        kinds = [(s.kind, s.microbatch) for s in order]
        for i in range(1, 4):
            assert kinds.index((Kind.W, i - 1)) < kinds.index((Kind.F, i))
    validate(engine_schedule(res, Problem(profile, linear(3), 4, limit), GreedyOptions()), profile, limit)


def test_a_limit_below_one_microbatch_cannot_fit() -> None:
    profile = uniform_profile(1, 1, 1, p=3, m=4)
    problem = Problem(profile, linear(3), 4, MemoryLimit("half a stage", (0.5, 0.5, 0.5)))
    with pytest.raises(CannotFit):
        RoundsEngine(problem, GreedyOptions()).run()
