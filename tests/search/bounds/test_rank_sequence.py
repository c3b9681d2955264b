"""The least span of one rank on its own: exact against enumeration, never above a real schedule."""

from __future__ import annotations

import itertools
import math
import random
import sys
from pathlib import Path

import pytest

from zbsearch.schedules import generate
from zbsearch.search.bounds import analytic as bounds_module
from zbsearch.search.bounds.analytic import lower_bound, rank_bounds
from zbsearch.search.problem import Problem, make_problem
from zbsearch.core.errors import InfeasibleError
from zbsearch.core.objective import Objective
from zbsearch.search.bounds.rank_chain import RankChain, RankPasses, Step
from zbsearch.search.bounds.rank_sequence import _least_span, least_span, least_to_last_backward
from zbsearch.sim.simulate import simulate

from random_pipelines import random_stages

ROOT = Path(__file__).resolve().parents[3]


def _over(level: float, cap: float) -> bool:
    """A level above the limit beyond round-off (the walk under test allows the same)."""
    return level > cap + 1e-9 * max(1.0, abs(cap))


def _orders(m: int):
    """Every order of m microbatches' F, B, W on one machine with each microbatch's F before its B
    before its W; microbatches in any order (no symmetry assumed)."""
    def rec(done: tuple[int, ...], out: list[tuple[int, int]]):
        if all(d == 3 for d in done):
            yield list(out)
            return
        for j, d in enumerate(done):
            if d < 3:
                yield from rec(done[:j] + (d + 1,) + done[j + 1:], out + [(j, d)])
    yield from rec((0,) * m, [])


def _brute(rank: RankPasses) -> float:
    """Least span over every order, each pass as early as the machine, its input and memory allow."""
    dur, best = (rank.F, rank.B, rank.W), math.inf
    for order in _orders(rank.m):
        t, level, f_start, ok = 0.0, 0.0, {}, True
        for j, kind in order:
            begin = t if kind != 1 else max(t, f_start[j] + rank.lag)
            if _over(level + rank.alloc[kind], rank.cap):
                ok = False
                break
            level += rank.alloc[kind] - rank.free[kind]
            if _over(level, rank.cap):
                ok = False
                break
            if kind == 0:
                f_start[j] = begin
            t = begin + dur[kind]
        if ok:
            best = min(best, t)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_least_span_matches_enumeration(seed: int) -> None:
    rng = random.Random(seed)
    m = rng.randint(2, 4)
    mem_b, mem_w = 1.0, rng.choice([0.3, 0.5])
    rank = RankPasses(rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 6), (mem_b, 0.0, 0.0),
                      (0.0, mem_b - mem_w, mem_w), rng.randint(0, 20), m, rng.choice([1.0, 1.5, 2.0, 2.6]))
    assert least_span(rank, ample=math.inf) == pytest.approx(_brute(rank))


def _in_order(rank: RankPasses) -> float:
    """Least span over every order with each kind in microbatch order, by depth-first search with no
    pruning: checks the dynamic program's dominance rule on more microbatches than _brute can walk."""
    dur, net = (rank.F, rank.B, rank.W), [a - f for a, f in zip(rank.alloc, rank.free)]

    def walk(f: int, b: int, w: int, t: float, starts: tuple[float, ...]) -> float:
        if w == rank.m:
            return t
        level, best = f * net[0] + b * net[1] + w * net[2], math.inf
        for kind, ready in ((0, f < rank.m), (1, b < f), (2, w < b)):
            if not ready or _over(level + rank.alloc[kind], rank.cap) or _over(level + net[kind], rank.cap):
                continue
            if kind == 0:
                best = min(best, walk(f + 1, b, w, t + dur[0], starts + (t,)))
            elif kind == 1:
                best = min(best, walk(f, b + 1, w, max(t, starts[0] + rank.lag) + dur[1], starts[1:]))
            else:
                best = min(best, walk(f, b, w + 1, t + dur[2], starts))
        return best

    return walk(0, 0, 0, 0.0, ())


@pytest.mark.parametrize("seed", range(8))
def test_dominance_keeps_the_least_span(seed: int) -> None:
    rng = random.Random(50 + seed)
    mem_w = rng.choice([0.3, 0.5])
    rank = RankPasses(rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 6), (1.0, 0.0, 0.0),
                      (0.0, 1.0 - mem_w, mem_w), rng.randint(5, 30), 6, rng.choice([2.0, 2.6, 3.3]))
    assert least_span(rank, ample=math.inf) == pytest.approx(_in_order(rank))


def test_no_order_fitting_the_limit_proves_nothing() -> None:
    # the limit (0.9) is below what one forward holds (1.0): no order fits
    rank = RankPasses(1, 1, 1, (1.0, 0.0, 0.0), (0.0, 0.5, 0.5), 3, 2, 0.9)
    assert least_span(rank, ample=math.inf) is None


def test_least_span_gives_up_past_its_budget() -> None:
    rank = RankPasses(1, 1, 1, (1.0, 0.0, 0.0), (0.0, 0.5, 0.5), 10, 12, 4.0)
    assert least_span(rank, max_expansions=10) is None
    assert least_span(rank) is not None
    assert least_span(rank, ample=0.5) is None  # memory for half a round trip counts as ample: skipped


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("limit", ["0.5p", "0.75p", "1p"])
def test_no_valid_schedule_has_a_rank_shorter_than_its_sequence_bound(seed: int, limit: str) -> None:
    rng = random.Random(100 + seed)
    p, m = rng.randint(2, 5), rng.randint(2, 12)
    prof = random_stages(rng, p, m)
    problem = make_problem(prof, limit, "span")
    _no_schedule_beats_the_sequence_bound(problem, [(name, generate(name, p, m)) for name in ("1f1b", "zb-h1", "gpipe")])


def _no_schedule_beats_the_sequence_bound(problem, extra: list) -> None:
    """Every heuristic candidate on the problem's placement (handcrafted ones included) and `extra`
    that fits the limit keeps each rank's span at or above that rank's sequence bound."""
    from zbsearch.search.greedy import candidates as heuristics

    prof, m, p = problem.profile, problem.num_microbatches, problem.num_ranks
    bounds = rank_bounds(problem, problem.passes)
    span_problem = Problem(prof, problem.placement, m, problem.limit, "span")
    schedules = [(n, s) for n, s, _ in heuristics.candidates(span_problem, same_placement=True)]
    checked = 0
    for name, sched in schedules + extra:
        tl = simulate(sched, prof)
        if any(tl.peak_memory(r) > problem.limit.per_rank[r] * (1 + 1e-9) for r in range(p)):
            continue
        checked += 1
        for r, b in enumerate(bounds):
            assert tl.span_of(r) >= b.sequence - 1e-9, f"{name}: rank {r} beats its sequence bound"
    assert checked > 0


def test_the_sequence_bound_lifts_a_tight_limit_bound() -> None:
    """hetero-random #16 (p=8, m=16, 0.75p): rank 0 must idle at its end as well as at its start, which
    the separate start and end idle bounds miss."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_instances import hetero_random

    prof, limit = hetero_random()[16]
    problem = make_problem(prof, limit, "span")
    bounds = rank_bounds(problem, problem.passes)
    rank0 = bounds[0]
    separate = max(rank0.work + rank0.start_idle + rank0.end_idle, rank0.memory_time)
    assert rank0.sequence > separate + 100
    assert lower_bound(problem) == pytest.approx(rank0.sequence)


def _v_chain(rng: random.Random, m: int, cap: float) -> RankChain:
    """A V-shape rank's chain: its two forwards, the backwards in reverse, a W after each backward;
    lags at least the pass before (a longer trip through the other ranks drawn on top)."""
    f1, f2, b2, b1, w2, w1 = (rng.randint(1, 5) for _ in range(6))
    mem1, mem2 = rng.choice([1.0, 0.5]), rng.choice([1.0, 0.5])
    keep1, keep2 = mem1 * rng.choice([0.3, 0.5]), mem2 * rng.choice([0.3, 0.5])
    steps = (Step(f1, mem1, 0.0), Step(f2, mem2, 0.0, 0, f1 + rng.randint(0, 12)),
             Step(b2, 0.0, mem2 - keep2, 1, f2 + rng.randint(0, 8)), Step(b1, 0.0, mem1 - keep1, 2, b2 + rng.randint(0, 12)),
             Step(w2, 0.0, keep2, 2), Step(w1, 0.0, keep1, 3))
    return RankChain(steps, m, cap)


def _chain_brute(chain: RankChain, in_order: bool, to_last_backward: bool = False) -> float:
    """Least span over every order of the chain's passes (each microbatch's steps after the ones they
    follow), each pass as early as the machine, its lag and memory allow; with `in_order`, each step's
    passes in microbatch order only (what the dynamic program assumes), which reaches more microbatches.
    `to_last_backward`: the least time to the end of the last forward or backward instead (a weight pass
    follows its backward with no lag; the ones still to run then do not count)."""
    steps, m = chain.steps, chain.m
    net = [s.alloc - s.free for s in steps]
    counted = [k for k, s in enumerate(steps) if not to_last_backward or s.after is None or s.lag is not None]

    best = math.inf  # the least span found: a partial order already at it cannot end sooner

    def walk(done: tuple[tuple[bool, ...], ...], starts: tuple[tuple[float, ...], ...], t: float, level: float) -> float:
        nonlocal best
        if all(d[k] for d in done for k in counted):
            best = min(best, t)
            return t
        if t >= best:
            return math.inf
        for i in range(m):
            for k, step in enumerate(steps):
                if done[i][k] or (step.after is not None and not done[i][step.after]):
                    continue
                if in_order and i > 0 and not done[i - 1][k]:
                    continue
                if _over(level + step.alloc, chain.cap) or _over(level + net[k], chain.cap):
                    continue
                begin = t if step.lag is None else max(t, starts[i][step.after] + step.lag)
                row = done[i][:k] + (True,) + done[i][k + 1:]
                srow = starts[i][:k] + (begin,) + starts[i][k + 1:]
                walk(done[:i] + (row,) + done[i + 1:], starts[:i] + (srow,) + starts[i + 1:],
                     begin + step.duration, level + net[k])
        return best

    n = len(steps)
    walk(((False,) * n,) * m, ((0.0,) * n,) * m, 0.0, 0.0)
    return best


@pytest.mark.parametrize("seed", range(10))
def test_chain_least_span_matches_enumeration(seed: int) -> None:
    """Two chunks on one rank (the V-shape): the walk without merging is exact against every order of
    two microbatches, and the merged walk that bounds.py runs is never above it."""
    rng = random.Random(200 + seed)
    chain = _v_chain(rng, 2, rng.choice([1.0, 1.5, 2.0, 3.0]))
    exact = _chain_brute(chain, in_order=False)
    if math.isinf(exact):
        assert _least_span(chain, 10**9, 10**6) is None
        return
    assert _least_span(chain, 10**9, 10**6) == pytest.approx(exact)
    assert least_span(chain, ample=math.inf) <= exact + 1e-9


@pytest.mark.parametrize("seed", range(10))
def test_least_time_to_the_last_backward_matches_enumeration(seed: int) -> None:
    """The walk that stops at the last backward (bounds/window_nesting.py reads it), on a V-shape rank's chain
    and on one chunk: exact without merging, never above every order with merging."""
    rng = random.Random(400 + seed)
    if seed % 2:
        chain = _v_chain(rng, 2, rng.choice([1.0, 1.5, 2.0, 3.0]))
    else:
        mem_w = rng.choice([0.3, 0.5])
        chain = RankPasses(rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 6), (1.0, 0.0, 0.0),
                           (0.0, 1.0 - mem_w, mem_w), rng.randint(0, 20), 3, rng.choice([1.0, 1.5, 2.0])).chain()
    exact = _chain_brute(chain, in_order=False, to_last_backward=True)
    if math.isinf(exact):
        assert least_to_last_backward(chain) is None
        return
    assert _least_span(chain, 10**9, 10**6, True) == pytest.approx(exact)
    assert least_to_last_backward(chain) <= exact + 1e-9
    # the weight passes left after the last backward only shorten it
    assert exact <= _chain_brute(chain, in_order=False) + 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_chain_dominance_keeps_the_least_span(seed: int) -> None:
    rng = random.Random(300 + seed)
    chain = _v_chain(rng, 3, rng.choice([1.5, 2.0]))
    exact = _chain_brute(chain, in_order=True)
    if math.isinf(exact):
        # No order fits the limit: the walk gets stuck and gives no bound, rather than a partial one.
        assert _least_span(chain, 10**9, 10**6) is None and least_span(chain, ample=math.inf) is None
        return
    assert _least_span(chain, 10**9, 10**6) == pytest.approx(exact)
    assert least_span(chain, ample=math.inf) <= exact + 1e-9


def _chunked_problem(seed: int, placement: str, limit: str):
    """The random chunked problem of `seed`, or None where the limit is below one microbatch."""
    rng = random.Random(400 + seed)
    p = rng.randint(2, 4)
    m = rng.randint(2, 4) * p
    prof = random_stages(rng, p, m)
    try:
        return make_problem(prof, limit, "span", placement)
    except InfeasibleError:
        return None


def _feasible_seeds(placement: str, limit: str, count: int = 8) -> list[int]:
    """The first `count` seeds whose problem fits the limit, chosen when the tests are collected so that
    every case runs (the cheap parse only: the bounds and the heuristics run in the test)."""
    return list(itertools.islice((s for s in itertools.count() if _chunked_problem(s, placement, limit)), count))


@pytest.mark.parametrize("placement,limit,seed", [
    pytest.param(placement, limit, seed, id=f"{placement}-{limit}-{seed}")
    for placement, limit in [("v", "0.5p"), ("v", "0.75p"), ("interleaved:2", "0.75p")]
    for seed in _feasible_seeds(placement, limit)])
def test_no_chunked_schedule_has_a_rank_shorter_than_its_chain_bound(seed: int, placement: str, limit: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On the V-shape and interleaved placements every heuristic and handcrafted schedule that fits
    keeps each rank's span at or above the chain bound (computed on every rank here)."""
    monkeypatch.setattr(bounds_module, "CHAIN_REACH", 1.0)
    problem = _chunked_problem(seed, placement, limit)
    assert problem is not None  # seeds whose limit is below one microbatch are left out at collection
    _no_schedule_beats_the_sequence_bound(problem, [])


def _turn_chain(rng: random.Random, m: int, cap: float) -> RankChain:
    """The V-shape's turn rank: both chunks on it back to back (no hop), so its forwards, its backwards
    and its weight passes each cost the same; only the round trip through the other ranks is drawn."""
    f, b, w = rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 4)
    mem = rng.choice([1.0, 0.5])
    keep = mem * rng.choice([0.3, 0.5])
    steps = (Step(f, mem, 0.0), Step(f, mem, 0.0, 0, f), Step(b, 0.0, mem - keep, 1, f + rng.randint(1, 14)),
             Step(b, 0.0, mem - keep, 2, b), Step(w, 0.0, keep, 2), Step(w, 0.0, keep, 3))
    return RankChain(steps, m, cap)


@pytest.mark.parametrize("seed", range(12))
def test_twin_passes_pooled_never_exceed_every_order(seed: int) -> None:
    """The turn rank's twin forwards, twin backwards and weight passes pooled (chain_walk._twins): the
    walk stays at or below every order of two microbatches, to the last backward and to the
    last pass, and at or below the walk that keeps every chunk apart."""
    from zbsearch.search.bounds import chain_walk

    rng = random.Random(600 + seed)
    chain = _turn_chain(rng, 2, rng.choice([1.0, 1.5, 2.0, 3.0]))
    assert [len(g) for g in chain_walk._twins(chain.steps, [0, 1, 2, 3], {4: 0, 5: 0},
                                               lambda s: s.lag is not None and s.after is not None
                                               and s.lag > chain.steps[s.after].duration)] == [2, 2]
    for to_last in (True, False):
        exact = _chain_brute(chain, in_order=False, to_last_backward=to_last)
        pooled = chain_walk.least_chain_span(chain, 10**9, to_last)
        apart = _least_span(chain, 10**9, 1, to_last)
        if math.isinf(exact):
            assert pooled is None
            continue
        assert pooled <= exact + 1e-9
        assert pooled <= apart + 1e-9 or pooled == pytest.approx(apart)


@pytest.mark.parametrize("seed", range(8))
def test_numpy_chain_walk_is_the_python_walk(seed: int) -> None:
    """Where nothing pools (every pass of the chain costs differently), the layer-at-a-time walk of
    bounds/chain_walk.py and bounds/rank_sequence.py's walk with one state per count give the same span."""
    from zbsearch.search.bounds.chain_walk import least_chain_span

    rng = random.Random(700 + seed)
    chain = _v_chain(rng, rng.randint(3, 6), rng.choice([1.5, 2.0, 3.0, 4.0]))
    costs = [(s.duration, s.alloc, s.free) for s in chain.steps]
    if len(set(costs)) < len(costs):
        steps = tuple(Step(s.duration + 0.01 * k, s.alloc, s.free, s.after, s.lag) for k, s in enumerate(chain.steps))
        chain = RankChain(steps, chain.m, chain.cap)
    for to_last in (True, False):
        ours, theirs = least_chain_span(chain, 10**9, to_last), _least_span(chain, 10**9, 1, to_last)
        assert (ours is None) == (theirs is None)
        if ours is not None:
            assert ours == pytest.approx(theirs)


def test_v_shape_at_1p_is_proven_optimal_by_the_turn_rank_window() -> None:
    """The paper's 14.6B stage on the V-shape at 1p, p=4, m=8, span: the turn rank's window, nested in
    rank 0's, reaches the best heuristic start exactly; every handcrafted V schedule that fits is at or
    above it."""
    from dataclasses import replace

    from zbsearch.core.profile import load_profile
    from zbsearch.search.solve.starts import heuristic_start

    base = load_profile(ROOT / "profiles" / "zb-paper-14.6b-m48.json")
    prof = replace(base, stages=(base.stages[0],) * 4, comm=(base.comm[0],) * 3, microbatches=8)
    problem = make_problem(prof, "1p", "span", "v")
    bound = lower_bound(problem)
    tl = heuristic_start(problem).timeline
    assert bound == pytest.approx(Objective.SPAN.of(tl))
    assert bound > 1.04 * 8 * (base.stages[0].F + base.stages[0].B + base.stages[0].W)  # well above the work
    from zbsearch.search.greedy import candidates as heuristics

    checked = 0
    for name, sched, _ in heuristics.candidates(Problem(prof, problem.placement, 8, problem.limit, "span"),
                                                same_placement=True):
        tl = simulate(sched, prof)
        if all(tl.peak_memory(r) <= problem.limit.per_rank[r] * (1 + 1e-9) for r in range(4)):
            checked += 1
            assert Objective.SPAN.of(tl) >= bound - 1e-6, name
    assert checked > 1
