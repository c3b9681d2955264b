"""The event-driven list greedy (zbsearch/search/greedy/list_engine.py) on every placement: its timing is
the simulator's, no rank ever goes over its limit, a warm-up cap bounds the microbatches in flight per
route and rank, DualPipe's two routes admit by route where rank by rank deadlocks (and by route every
variant finishes), and F&B pairs run for the profile's pair time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zbsearch.core.ir import Kind, Placement, dualpipe, interleaved, linear, vshape
from zbsearch.core.memory import MemoryLimit, min_feasible_limit, no_limit
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.search.greedy.candidates import engine_schedule, greedy_variants
from zbsearch.search.greedy.list_engine import ListEngine
from zbsearch.search.greedy.options import CannotFit, EngineResult, GreedyOptions, fits
from zbsearch.search.problem import Problem
from zbsearch.sim.validate import validate
from random_pipelines import uneven_stages


def _scaled(profile: Profile, placement: Placement, factor: float) -> MemoryLimit:
    """`factor` times the smallest feasible limit of each rank."""
    return MemoryLimit(f"{factor}x", tuple(factor * x for x in min_feasible_limit(profile, placement)))


def _in_flight(res: EngineResult, chunk: int) -> int:
    """The most microbatches that ran the chunk's F and not yet its B, along the order of its rank."""
    most = now = 0
    for order in res.order:
        for step in order:
            if step.chunk == chunk:
                now += {Kind.F: 1, Kind.B: -1}.get(step.kind, 0)
                most = max(most, now)
    return most


PLACEMENTS = {"linear": linear(4), "interleaved": interleaved(4, 2), "v": vshape(4), "dualpipe": dualpipe(4)}
OPTIONS = [GreedyOptions("list"), GreedyOptions("list", b_first=True, w_fill=False),
           GreedyOptions("list", b_first=True, warmup=1), GreedyOptions("list", w_fill=False, warmup=2),
           GreedyOptions("list", fused=True), GreedyOptions("list", b_first=True, warmup=1, fused=True)]


def _cases() -> list[tuple[str, GreedyOptions]]:
    """Every placement with every variant; on DualPipe's, admitting by route (rank by rank can deadlock)."""
    out = [(name, o) for name in ("linear", "interleaved", "v") for o in OPTIONS]
    return out + [("dualpipe", replace(o, by_route=True)) for o in OPTIONS]


@pytest.mark.parametrize("name,options", _cases(), ids=[f"{n}-{o.label}" for n, o in _cases()])
@pytest.mark.parametrize("factor", [1.0, 1.5, 3.0])
def test_timing_is_the_simulators_and_no_rank_goes_over_its_limit(name: str, options: GreedyOptions,
                                                                    factor: float) -> None:
    # Single-route placements admit a microbatch only with room for all its forwards on the rank, so
    # they never jam on memory: every variant finishes at every feasible limit.
    placement = PLACEMENTS[name]
    profile = uneven_stages(7, 4, 8)
    limit = _scaled(profile, placement, factor)
    problem = Problem(profile, placement, 8, limit)
    res = ListEngine(problem, options).run()
    tl = validate(engine_schedule(res, problem, options), profile, limit)
    assert tl is not None
    assert res.first_start == pytest.approx([tl.first_start(r) for r in range(4)], rel=1e-12)
    assert res.last_end == pytest.approx([tl.last_end(r) for r in range(4)], rel=1e-12)
    assert res.peak == pytest.approx([tl.peak_memory(r) for r in range(4)], rel=1e-12)
    assert all(fits(tl.peak_memory(r), limit.per_rank[r]) for r in range(4))


@pytest.mark.parametrize("p", [2, 3, 4])
def test_a_1f1b_warm_up_cap_holds_p_minus_r_in_flight_and_no_more(p: int) -> None:
    # F = B = W = 1, no hops, no limit, m = 2p. Rank r's forwards arrive at r, r+1, ...; microbatch 0's B
    # is there at 2p - 1 - r, by when forwards first could have run 2p - 1 - 2r >= p - r of them: the cap
    # p - r is reached, and the cap holds it there.
    m = 2 * p
    profile = uniform_profile(1, 1, 1, p=p, m=m)
    problem = Problem(profile, linear(p), m, no_limit(profile))
    capped = ListEngine(problem, GreedyOptions("list", warmup=1)).run()
    assert [_in_flight(capped, r) for r in range(p)] == [p - r for r in range(p)]
    twice = ListEngine(problem, GreedyOptions("list", warmup=2)).run()
    assert all(_in_flight(twice, r) <= 2 * (p - r) for r in range(p))
    # Uncapped and forwards first, rank 0 (its inputs always there) runs every forward before any B.
    free = ListEngine(problem, GreedyOptions("list")).run()
    assert _in_flight(free, 0) == m
    assert [s.kind for s in free.order[0][:m]] == [Kind.F] * m


@pytest.mark.parametrize("k", [1, 2])
def test_on_dualpipe_the_cap_counts_where_each_route_enters_the_rank(k: int) -> None:
    # Route 0 (chunks 0..p-1) reaches rank r at position r, route 1 (chunks p..2p-1) at position p-1-r:
    # in flight on rank r at most k(p - r) of route 0 and k(r + 1) of route 1.
    p, m = 4, 12
    profile = uniform_profile(1, 1, 1, p=p, m=m)
    problem = Problem(profile, dualpipe(p), m, no_limit(profile))
    res = ListEngine(problem, GreedyOptions("list", warmup=k, by_route=True)).run()
    for r in range(p):
        assert _in_flight(res, r) <= k * (p - r)
        assert _in_flight(res, 2 * p - 1 - r) <= k * (r + 1)       # route 1's chunk on rank r
    assert _in_flight(res, 0) == min(k * p, m // 2)                # rank 0 enters route 0: reached


def test_admitting_by_route_gates_at_the_routes_start() -> None:
    profile = uniform_profile(1, 1, 1, p=4, m=8)
    problem = Problem(profile, dualpipe(4), 8, no_limit(profile))
    # Slots are the positions of route 0 (chunks 0-3) then of route 1 (chunks 4-7).
    assert ListEngine(problem, GreedyOptions("list", by_route=True)).gate == [0, 0, 0, 0, 4, 4, 4, 4]
    # Rank by rank, each slot is its own rank's entry (a rank holds one chunk of each route).
    assert ListEngine(problem, GreedyOptions("list")).gate == list(range(8))
    # On one route, admitting by route changes nothing.
    v = Problem(profile, vshape(4), 8, no_limit(profile))
    assert ListEngine(v, GreedyOptions("list", by_route=True)).gate == ListEngine(v, GreedyOptions("list")).gate


@pytest.mark.parametrize("b_first", [False, True])
def test_at_the_smallest_limit_dualpipe_admits_by_route_where_rank_by_rank_deadlocks(b_first: bool) -> None:
    # p = 2, m = 4: route 0 carries microbatches 0 and 1 from rank 0, route 1 carries 2 and 3 from rank 1.
    # With one microbatch's activations per rank, rank by rank, rank 0 admits microbatch 0 and rank 1
    # microbatch 2 at once; each next forward needs the memory the other holds: nothing moves. By route, a
    # microbatch is admitted only with room on both ranks.
    p, m = 2, 4
    profile = uniform_profile(1, 1, 1, p=p, m=m)
    limit = MemoryLimit("1 stage", (1.0,) * p)
    problem = Problem(profile, dualpipe(p), m, limit)
    with pytest.raises(CannotFit):
        ListEngine(problem, GreedyOptions("list", b_first=b_first)).run()
    options = GreedyOptions("list", b_first=b_first, by_route=True)
    res = ListEngine(problem, options).run()
    tl = validate(engine_schedule(res, problem, options), profile, limit)
    assert tl is not None and tl.makespan == res.cost("makespan")
    assert max(tl.peak_memory(r) for r in range(p)) == 1.0


def _finishes_within(problem: Problem, options: GreedyOptions) -> None:
    """The engine's schedule passes the validator under the problem's limit, timed and peaked as the
    simulator times it."""
    res = ListEngine(problem, options).run()
    tl = validate(engine_schedule(res, problem, options), problem.profile, problem.limit)
    assert tl is not None and res.cost("makespan") == pytest.approx(tl.makespan, rel=1e-12)
    assert res.peak == pytest.approx([tl.peak_memory(r) for r in range(problem.num_ranks)], rel=1e-12)


def test_admitting_by_route_with_w_fill_finishes_at_p4_where_a_wake_up_was_lost() -> None:
    # Rank 3 runs 4F2 at 8.5-9.5 (free since its W) after rank 2, free at 11, already slept knowing of no
    # arrival: the wake-up for 5F2 at 10 falls before rank 2's free time and is dropped. The engine used to
    # give up here (CannotFit); when its heap runs dry it now lets every rank decide again.
    p, m = 4, 4
    profile = uniform_profile(1, 2, 1, 0.5, p=p, m=m, mem_W=0.4)
    _finishes_within(Problem(profile, dualpipe(p), m, MemoryLimit("1 stage", (1.0,) * p)),
                     GreedyOptions("list", w_fill=True, by_route=True))


def test_admitting_by_route_without_w_fill_finishes_at_p2_where_both_ranks_wait_on_w() -> None:
    # Route 1's next microbatch needs room on both ranks; each holds 1.5 of 2 in pending W, and each
    # rank's own W alone would not make room, so both slept. With nothing left in flight, the engine now
    # runs the W passes a rank would sleep on.
    profile = uniform_profile(1, 1, 1, p=2, m=4)
    _finishes_within(Problem(profile, dualpipe(2), 4, MemoryLimit("2 stages", (2.0, 2.0))),
                     GreedyOptions("list", w_fill=False, by_route=True))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("factor", [1.0, 1.3, 2.0])
def test_admitting_by_route_on_dualpipe_finishes_every_variant(seed: int, factor: float) -> None:
    # Every list variant candidates.greedy_variants offers, admitting by route: before the engine acted on
    # a dry heap, 72 of these 144 runs raised CannotFit.
    p, m = 4, 9
    profile = uneven_stages(seed, p, m)
    problem = Problem(profile, dualpipe(p), m, _scaled(profile, dualpipe(p), factor))
    for options in greedy_variants(dualpipe(p), pairs=True):
        if options.engine == "list" and options.by_route:
            _finishes_within(problem, options)


def test_pairs_run_for_the_profiles_pair_time() -> None:
    # F = B = 2, W = 1, a pair of F and a full backward 3.5 where apart they take 2 + 3: each pass in a
    # pair costs 0.7 of its own time, so a pair of F and B (no W) takes 0.7 x (2 + 2) = 2.8.
    profile = Profile.from_dict({"stages": [{"F": 2, "B": 2, "W": 1, "overlap_f_b": 3.5}] * 4, "comm": 0.5,
                                 "microbatches": 8, "source": {"kind": "estimated", "method": "test fixture"}})
    problem = Problem(profile, dualpipe(4), 8, no_limit(profile))
    apart = ListEngine(problem, GreedyOptions("list", by_route=True)).run()
    assert all(step.kind is not Kind.OVERLAP for order in apart.order for step in order)
    options = GreedyOptions("list", pairs=True, by_route=True)
    paired = ListEngine(problem, options).run()
    tl = validate(engine_schedule(paired, problem, options), profile, problem.limit)
    assert tl is not None
    pairs = [s for s in tl.iter_slots() if s.action.kind is Kind.OVERLAP]
    assert pairs and all(s.end - s.start == pytest.approx(2.8) for s in pairs)
    assert paired.cost("makespan") == pytest.approx(tl.makespan, rel=1e-12)
    # Each pair is one F and one B of that rank's chunks, and every pass still runs once.
    for r, order in enumerate(paired.order):
        for step in order:
            if step.kind is Kind.OVERLAP:
                assert {problem.placement.chunk_to_rank[c] for c in (step.chunk, step.b_chunk)} == {r}
        ran = [p for step in order for p in step.action().passes()]
        assert len(ran) == len(set(ran)) == 3 * 8


@pytest.mark.parametrize("name", ["linear", "v", "dualpipe"])
def test_a_limit_below_one_microbatch_cannot_fit(name: str) -> None:
    profile = uniform_profile(1, 1, 1, p=4, m=4)
    placement = PLACEMENTS[name]
    problem = Problem(profile, placement, 4, _scaled(profile, placement, 0.9))
    with pytest.raises(CannotFit):
        ListEngine(problem, GreedyOptions("list", by_route=name == "dualpipe")).run()


def test_where_b_alone_holds_more_than_f_took_only_fused_backwards_fit() -> None:
    """Under torch's runtime a B leaves the weight gradients held until W (mem_W > mem_B): at a cap of two
    microbatches every greedy variant with B and W apart goes over it after a B, the fused ones fit, and the
    best heuristic is a fused greedy (every backward one FULL_B pass) at least as short as every
    handcrafted schedule."""
    from zbsearch.search.greedy.candidates import candidates, fits_as_run
    from zbsearch.search.greedy.list_engine import fused_helps

    p, m = 4, 8
    profile = Profile.from_dict({
        "name": "torch-runtime toy", "num_stages": p, "microbatches": m, "time_unit": "unit", "memory_unit": "relative",
        "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": 1.0, "mem_W": 0.5, "mem_W_torch": 1.7}] * p, "comm": 0.0,
        "memory_model": "torch-runtime", "source": {"kind": "estimated", "method": "hand-made for tests"}})
    problem = Problem(profile, linear(p), m, MemoryLimit("2 mb", (2.0,) * p))
    assert fused_helps(problem)
    apart = [o for o in greedy_variants(linear(p)) if not o.fused]
    for options in apart:
        try:
            res = ListEngine(problem, options).run() if options.engine == "list" else None
        except CannotFit:
            continue
        assert res is None or not fits_as_run(problem, res)
    found = candidates(problem, same_placement=True)
    best = found[0]
    assert best.name.startswith("greedy(list") and "fused-bw" in best.name
    assert {a.kind for rank in best.schedule.ranks for a in rank} == {Kind.F, Kind.FULL_B}
    assert all(best.timeline.peak_memory(r) <= 2.0 + 1e-9 for r in range(p))
    handcrafted = [c for c in found if not c.name.startswith("greedy(")]
    assert all(best.timeline.makespan <= c.timeline.makespan + 1e-9 for c in handcrafted)
    assert not fused_helps(Problem(uniform_profile(1, 1, 1, p=p, m=m), linear(p), m, MemoryLimit("2 mb", (2.0,) * p)))
    # Where a list variant with B and W apart fits, the fused ones are not run (one more engine run each).
    roomy = candidates(Problem(profile, linear(p), m, MemoryLimit("40 mb", (40.0,) * p)), same_placement=True)
    assert roomy and not any("fused-bw" in c.name for c in roomy)
