"""Lower bounds: never above the true optimum; and the Table 5 result they prove."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

import itertools

from zbsearch.search.options import SearchOptions
from zbsearch.search.bounds.analytic import lower_bound, most_that_fits, rank_bounds
from zbsearch.search.problem import Problem, make_problem
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate

from random_pipelines import random_stages, tell_cpsat_no_bounds

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))


def test_uniform_makespan_bound_is_the_known_optimum():
    # With memory to spare, the last rank can be busy from its head on: (p-1)(F+c) + m(F+B+W) = 74.
    # But rank 0 ends only after the last gradient has come back to it, (p-1)(B+c), and its weight
    # pass: with the last rank's forwards and backwards, m(F+B), in between, that is 75, the optimum
    # CP-SAT proves when told none of these bounds (the nesting of bounds/window_nesting.py).
    prof = uniform_profile(3, 2, 1, 0.5, p=5, m=10)
    assert lower_bound(make_problem(prof, "2p", "makespan")) == pytest.approx(4 * 3.5 + 10 * 5 + 4 * 2.5 + 1)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("limit", ["0.5p", "1p", "2p"])
@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_bound_never_exceeds_a_valid_schedule(seed, limit, objective):
    """Every handcrafted schedule that fits the limit costs at least the bound."""
    rng = random.Random(seed)
    p, m = rng.randint(2, 5), rng.randint(2, 10)
    stages = [{"F": rng.uniform(1, 3), "B": rng.uniform(1, 3), "W": rng.uniform(0.2, 2), "mem_B": 1.0,
               "mem_W": rng.uniform(0.1, 0.9)} for _ in range(p)]
    prof = Profile.from_dict({"stages": stages, "comm": rng.uniform(0, 0.5), "microbatches": m,
                              "source": {"kind": "estimated", "method": "random test"}})
    problem = make_problem(prof, limit, objective)
    bound = lower_bound(problem)
    for name in ("1f1b", "zb-h1", "zb-h2", "gpipe"):
        tl = simulate(generate(name, p, m), prof)
        if any(tl.peak_memory(r) > problem.limit.per_rank[r] + 1e-9 for r in range(p)):
            continue
        cost = tl.makespan if objective == "makespan" else tl.span
        assert cost >= bound - 1e-9, f"{name} beats the 'lower bound'"


def test_zb_h1_is_proven_optimal_at_1p_on_every_table5_setup():
    """The paper's ZB-1p equals ZB-H1 in all 12 rows; the bound proves nothing better exists."""
    from zb1p_proof import rows

    table = rows()
    assert len(table) == 12
    for row in table:
        for objective in ("span", "makespan"):
            zbh1, bound, proven = row[objective]
            assert proven, f"{row['setup']} {objective}: ZB-H1 {zbh1:.5f} vs bound {bound:.5f}"
        assert round(row["span"][0], 4) == pytest.approx(row["paper_zb1p"], abs=1e-4)


def test_start_and_end_idle_are_what_memory_cannot_cover():
    # p=2, F=B=W=1, comm 0, limit 1 microbatch: the round trip is F+B = 2 after rank 0's first F
    # starts (F0 on rank 0, F0 on rank 1, B0 on rank 1): 2F + B = 3, 1 forward fits: idle 2.
    prof = uniform_profile(1, 1, 1, p=2, m=4)
    rb = rank_bounds(make_problem(prof, "0.5p", "span"), make_problem(prof, "0.5p", "span").passes)
    assert rb[0].start_idle == pytest.approx(2.0)
    assert rb[1].start_idle == pytest.approx(0.0)


def test_memory_time_is_the_round_trip_of_every_microbatch_over_the_limit():
    # p=2, F=B=W=1, no comm, limit one microbatch (mem_B 1, mem_W 0.5). On rank 0 a microbatch holds
    # 0.5 from F start to B end (F, F, B, B: 4) and 0.5 to W end (5): 4.5 per microbatch, x4 / 1 = 18.
    # Only one microbatch fits at a time, so the real optimum is 4 x 5 = 20; the bound must not pass it.
    # The rank on its own (bounds/rank_sequence.py) sees that one at a time is all memory allows: 20, exactly.
    prof = uniform_profile(1, 1, 1, p=2, m=4)
    problem = make_problem(prof, "0.5p", "span")
    rb = rank_bounds(problem, problem.passes)
    assert rb[0].memory_time == pytest.approx(18.0, rel=1e-6)
    assert rb[0].memory_time > rb[0].work + rb[0].start_idle  # 18, above work + idle (12 + 2)
    assert rb[0].sequence == pytest.approx(20.0)
    assert rb[0].span == pytest.approx(20.0)
    from zbsearch.search.solve.starts import one_at_a_time

    assert simulate(one_at_a_time(problem), prof).span == pytest.approx(20.0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("limit", ["0.5p", "1p"])
@pytest.mark.parametrize("placement", ["linear", "v"])
def test_bound_never_exceeds_a_heuristic_on_any_placement(seed, limit, placement):
    """The bound against every valid heuristic on the placement (handcrafted and greedy), with the
    tight limits where the memory-time bound binds."""
    from zbsearch.search.greedy.candidates import candidates

    rng = random.Random(100 + seed)
    p, m = rng.randint(2, 4), rng.randint(2, 8)
    prof = random_stages(rng, p, m)
    for objective in ("makespan", "span"):
        problem = make_problem(prof, limit, objective, placement)
        bound = lower_bound(problem)
        found = candidates(Problem(prof, problem.placement, m, problem.limit, objective), same_placement=True)
        for name, _, tl in found:
            cost = tl.makespan if objective == "makespan" else tl.span
            assert cost >= bound - 1e-9, f"{name} beats the 'lower bound'"


def test_start_and_end_idle_on_a_v_shape_middle_rank():
    # Hetero p=4, V-shape, 0.5p: rank 3 holds chunks 3 and 4 (F=B=75, W=60, mem_B 0.75, mem_W 0.375
    # each; limit 3.0), hops 5. From F(3) starting to B(4) being able to start: F3 F4 F5 F6 F7 B7 B6
    # B5 = 75+75+50+50+60+60+50+50 plus 6 hops = 500, and only 4 forwards (300) fit: idle 200.
    # After the last F(4): F5..B5 and 6 hops = 350; that microbatch holds 1.5, the other 1.5 holds at
    # best one microbatch awaiting B3, W3, B4, W4 (270): idle 80.
    from make_results import hetero_profile

    problem = make_problem(hetero_profile(4, 16), "0.5p", "makespan", "v")
    rb = rank_bounds(problem, problem.passes)[3]
    assert rb.start_idle == pytest.approx(200.0)
    assert rb.end_idle == pytest.approx(80.0, rel=1e-6)
    assert rb.disjoint
    assert rb.end == pytest.approx(175 + 6720 + 280, rel=1e-6)


def _v_with_a_head(limit: str | None, objective: str, m: int = 4):
    """A V-shape on 2 ranks whose rank 0 holds a cheap first chunk (an embedding) and the heaviest, last
    one (a head): chunk times 1, 4, 4 and 8 (F = B = W), one layer each, no hops."""
    from zbsearch.search.partition.search import SplitRequest, SplitSearch
    from zbsearch.core.placement import parse_placement

    gib = 2**30
    layers = [{"name": name, "kind": kind, "F": t, "B": t, "W": t, "mem_B": gib, "mem_W": gib / 2,
               "static_bytes": gib, "out_bytes": 1.0}
              for name, kind, t in (("tok_embeddings", "embedding", 1), ("layers.0", "decoder", 4),
                                    ("layers.1", "decoder", 4), ("output", "output", 8))]
    prof = Profile.from_dict({
        "name": "head", "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": gib, "mem_W": gib}], "microbatches": m,
        "time_unit": "unit", "memory_unit": "bytes", "comm": 0.0, "device_capacity_bytes": 80.0 * gib,
        "layers": layers, "source": {"kind": "estimated", "method": "hand-made for a test"}})
    search = SplitSearch(SplitRequest(prof, 2, ("v",), limit, objective), 1e18)
    return search.problem(parse_placement("v", 2), (1, 1, 1, 1))


def test_start_idle_counts_only_the_forwards_that_have_arrived():
    # Rank 0 holds chunks 0 (F=1) and 3 (F=8). Its first backward (B3 of microbatch 0) can start 17
    # after its first forward: F0 F1 F2 F3 = 1+4+4+8. Chunk 3's first forward arrives at 9, so only
    # one of its forwards starts before 17: the four F0 (4) and one F3 (8) fill 12; idle 5. Counting
    # every forward that fits in memory (4 + 32) would leave no idle at all.
    problem = _v_with_a_head(None, "makespan")
    rb = rank_bounds(problem, problem.passes)[0]
    assert rb.start_idle == pytest.approx(5.0)


@pytest.mark.parametrize("limit,objective", [(None, "makespan"), (None, "span"), ("7GiB", "makespan"),
                                             ("6GiB", "span")])
def test_the_arrival_bound_stays_below_the_optimum(monkeypatch, limit, objective):
    """The V with a head, where the start idle binds: CP-SAT, told nothing by the analytic bounds,
    proves the optimum; the bound must not exceed it."""
    from zbsearch.search.solve.driver import solve

    problem = _v_with_a_head(limit, objective)
    bound = lower_bound(problem)
    tell_cpsat_no_bounds(monkeypatch)
    result = solve(problem, SearchOptions(time_limit=20))
    assert result.status == "optimal"
    assert bound <= result.objective + 1e-9


@pytest.mark.parametrize("seed,cap,objective", [(0, None, "makespan"), (1, "14GiB", "makespan"), (2, "12GiB", "span"),
                                                (3, None, "span")])
def test_v_bounds_with_a_head_stay_below_every_splits_optimum(monkeypatch, seed, cap, objective):
    """Random layers whose first is cheap and last heavy (an embedding and a head), every split of them
    on a V over 2 ranks: CP-SAT, told nothing by the analytic bounds, proves each split's optimum; the
    split's analytic bound and the split walk's cheap bound must not exceed it."""
    from zbsearch.core.errors import InfeasibleError
    from zbsearch.search.partition.search import SplitRequest, SplitSearch
    from zbsearch.core.placement import parse_placement
    from zbsearch.search.solve.driver import solve
    from zbsearch.search.partition.bounds import split_bound
    from zbsearch.search.partition.enumerate import bound_input

    rng, gib, n, m = random.Random(500 + seed), 2**30, 5, 3
    times = [1] + [rng.randint(2, 4) for _ in range(n - 2)] + [rng.randint(6, 9)]
    layers = [{"name": f"layers.{i}", "kind": "embedding" if i == 0 else "output" if i == n - 1 else "decoder",
               "F": t, "B": t + rng.choice([0, 1]), "W": rng.choice([1, 2]), "mem_B": rng.choice([1, 2]) * gib,
               "mem_W": gib / 2, "static_bytes": gib, "out_bytes": 1.0} for i, t in enumerate(times)]
    prof = Profile.from_dict({
        "name": "head", "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": gib, "mem_W": gib}], "microbatches": m,
        "time_unit": "unit", "memory_unit": "bytes", "comm": rng.choice([0.0, 1.0]),
        "device_capacity_bytes": 80.0 * gib, "layers": layers,
        "source": {"kind": "estimated", "method": "random layers for a test"}})
    request = SplitRequest(prof, 2, ("v",), cap, objective)
    search, placement = SplitSearch(request, 1e18), parse_placement("v", 2)
    data = bound_input(prof, placement, cap, objective, request.headroom)
    bounds = {}
    for cuts in itertools.combinations(range(1, n), 3):
        edges = (0,) + cuts + (n,)
        counts = tuple(b - a for a, b in zip(edges, edges[1:]))
        try:
            problem = search.problem(placement, counts)
            problem.check_feasible()
        except InfeasibleError:
            continue
        bounds[counts] = (lower_bound(problem), split_bound(data, counts), problem)
    assert bounds, "the test needs at least one feasible split"
    tell_cpsat_no_bounds(monkeypatch)
    for counts, (own, cheap, problem) in bounds.items():
        result = solve(problem, SearchOptions(time_limit=20))
        assert result.status == "optimal"
        assert own <= result.objective + 1e-9, counts
        assert cheap <= result.objective + 1e-9, counts


@pytest.mark.parametrize("seed,placement,limit,objective", [
    (0, "v", "0.5p", "makespan"), (1, "v", "0.5p", "span"), (2, "v", "0.75p", "makespan"), (3, "v", "1p", "span"),
    (4, "interleaved:2", "0.5p", "makespan"), (5, "interleaved:2", "0.75p", "span"), (6, "dualpipe", "0.75p", "span"),
    (7, "v", "0.5p", "span"),
])
def test_bound_never_exceeds_the_optimum_cpsat_proves_without_it(monkeypatch, seed, placement, limit, objective):
    """Chunked placements at tight limits, where the start, round-trip and end idle bind: CP-SAT, told
    nothing by the analytic bounds (they are replaced by zeros in the model and the stopping rule),
    proves the optimum of integer-time instances; the real bound must not exceed it."""
    from zbsearch.search.solve.driver import solve

    rng = random.Random(300 + seed)
    p, m = rng.choice([2, 3]), rng.choice([2, 3, 4])
    if placement == "dualpipe":
        p, m = 2, 4  # its routes take half the microbatches each
    stages = [{"F": rng.randint(2, 6), "B": rng.randint(2, 7), "W": rng.randint(1, 5), "mem_B": rng.choice([1.0, 2.0]),
               "mem_W": rng.choice([0.0, 0.5])} for _ in range(p)]
    prof = Profile.from_dict({"stages": stages, "comm": rng.randint(0, 2), "microbatches": m,
                              "source": {"kind": "estimated", "method": "random test"}})
    problem = make_problem(prof, limit, objective, placement)
    bound = lower_bound(problem)
    tell_cpsat_no_bounds(monkeypatch)
    result = solve(problem, SearchOptions(time_limit=20))
    assert result.status == "optimal", "the instance is meant to be small enough for CP-SAT to prove"
    assert bound <= result.objective + 1e-9


@pytest.mark.parametrize("seed", range(8))
def test_the_fill_is_the_best_whole_count_choice(seed):
    """The most forward work held at once in a room (what the idle bounds of the V split walk and of
    every rank subtract) equals an enumeration of whole counts."""
    rng = random.Random(seed)
    items = [(rng.choice([0.0, 1.0, 2.5, 3.0]), rng.uniform(1, 5), rng.randint(0, 4)) for _ in range(rng.randint(1, 3))]
    room = rng.uniform(0, 12)
    best = max(sum(n * w for n, (_, w, _) in zip(counts, items))
               for counts in itertools.product(*(range(c + 1) for _, _, c in items))
               if sum(n * s for n, (s, _, _) in zip(counts, items)) <= room)
    assert most_that_fits(room, items) == pytest.approx(best)
