"""partition/bounds.py: the cheap bound of a split and over every split. LayerSums (W and mem_W at their
least), a linear rank's bound by hand (work, the wait for its first backward, memory), v_counts, DualPipe
(the work floor) and interleaved (above it: whole layers and the head), the least-bound split by enumeration
under span and `Np` limits, bounds that never fall with fewer microbatches' room or rise with more
memory, the V DP under its caps (the least split by enumeration), and the DPs cut short at a deadline (anywhere:
still a bound, no higher than the finished one; the V DP's at the last cap it passed)."""

from __future__ import annotations

import itertools
import math
import random
import time
from typing import Iterator, Sequence

import pytest

from zbsearch.core.ir import Placement, dualpipe, interleaved, linear, vshape
from zbsearch.core.layers import Layer
from zbsearch.core.objective import Objective
from zbsearch.search.partition import bounds as bounds_module, interleaved as interleaved_module
from zbsearch.search.partition.bounds import any_split_bound, cheap_bound, least_bound_split, split_bound, v_counts
from zbsearch.search.partition.rank_bound import LayerSums, SplitBoundInput, linear_rank, one_stage_per_rank


def _splits(n: int, k: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cuts + (n,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def _uniform(n: int) -> tuple[Layer, ...]:
    return tuple(Layer(f"layers.{i}", 1.0, 1.0, 1.0, mem_B=1.0, mem_W=0.5, static_bytes=1.0) for i in range(n))


def _random(n: int, seed: int) -> tuple[Layer, ...]:
    rng = random.Random(seed)
    return tuple(Layer(f"layers.{i}", rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 2), mem_B=rng.randint(1, 3),
                       mem_W=1.0, static_bytes=rng.randint(1, 2)) for i in range(n))


def _data(layers: Sequence[Layer], placement: Placement, m: int = 3, objective: str = "makespan", hop: float = 0.5,
          byte_cap: float | None = None, multiple: float | None = None) -> SplitBoundInput:
    return SplitBoundInput(tuple(layers), placement, m, objective, hop, byte_cap, multiple)  # type: ignore[arg-type]


def test_layer_sums_take_w_and_mem_w_at_their_least() -> None:
    layers = [
        Layer("a", 1, 2, 3, mem_B=5, mem_W=7, static_bytes=1, full_backward=4),  # W: 4 - 2 = 2 < 3; mem_W: 5
        Layer("b", 2, 1, 1, mem_B=2, mem_W=1, static_bytes=3),  # no full backward: B + W, W stays 1
        Layer("c", 1, 3, 2, mem_B=1, mem_W=0.5, full_backward=2),  # a full backward below B: W 0
    ]
    s = LayerSums(layers)
    assert s.n == 3
    assert s.pre["W"] == pytest.approx([0, 2, 3, 3])
    assert s.pre["work"] == pytest.approx([0, 5, 9, 13])
    assert s.pre["mem_W"] == pytest.approx([0, 5, 6, 6.5])
    assert s.pre["static_bytes"] == pytest.approx([0, 1, 4, 4])
    assert s("F", 1, 3) == pytest.approx(3) and s("B", 0, 2) == pytest.approx(3) and s("mem_B", 2, 2) == 0.0
    assert s.w0 == pytest.approx(2)  # layer 0's W at its least
    empty = LayerSums([])
    assert empty.n == 0 and empty.w0 == 0.0 and empty("work", 0, 0) == 0.0


@pytest.mark.parametrize("placement,one", [(linear(3), True), (vshape(2), False), (interleaved(2, 2), False),
                                           (dualpipe(2), False)])
def test_one_stage_per_rank(placement: Placement, one: bool) -> None:
    assert one_stage_per_rank(placement) is one


def test_the_objective_is_read_from_its_word() -> None:
    assert _data(_uniform(4), linear(2), objective="span").objective is Objective.SPAN


# Four layers F = B = W = 1 (mem_B 1, mem_W 0.5), p=2, m=3, hop 0.5, rank r holding two layers.
@pytest.mark.parametrize("r,objective,multiple,bound", [
    # Rank 1 (layers 2-3): its first forward waits for layers 0-1 and a hop (2.5), then 3 x 6 of work.
    (1, "makespan", None, 2.5 + 18.0),
    (1, "span", None, 18.0),
    # Rank 0 (layers 0-1): its first backward comes 7 after its first forward (its F 2, then F and B of
    # layers 2-3: 4, and two hops: 1); the 3 forwards fill 6 of it: 1 idle on top of the 18 of work.
    (0, "makespan", None, 19.0),
    # At 1p it holds 2 x p x mem_B = 4: two forwards in flight, 4 of the wait filled, 3 idle.
    (0, "makespan", 1.0, 21.0),
    (0, "span", 1.0, 21.0),
])
def test_a_linear_ranks_bound_by_hand(r: int, objective: str, multiple: float | None, bound: float) -> None:
    data = _data(_uniform(4), linear(2), objective=objective, multiple=multiple)
    assert linear_rank(LayerSums(data.layers), data, r, 2 * r, 2 * r + 2) == pytest.approx(bound)


def test_a_rank_that_holds_no_microbatch_beside_its_static_bytes_has_no_schedule() -> None:
    data = _data(_uniform(4), linear(2), byte_cap=2.5)  # two layers' static bytes (2) leave 0.5 < mem_B 2
    assert linear_rank(LayerSums(data.layers), data, 0, 0, 2) == math.inf
    assert split_bound(data, (2, 2)) == math.inf
    assert linear_rank(LayerSums(data.layers), data, 0, 0, 1) < math.inf  # one layer: 1.5 left, mem_B 1


@pytest.mark.parametrize("outer,cut,n,counts", [
    ([(0, 6), (1, 5)], 3, 6, (1, 2, 2, 1)),
    # Rank 0 holds 0-1 and 9, rank 1 holds 2 and 7-8, rank 2 (the turn) 3-4 and 5-6.
    ([(0, 10), (2, 9), (3, 7)], 5, 10, (2, 1, 2, 2, 2, 1)),
])
def test_v_counts_from_each_ranks_outer_range(outer: list[tuple[int, int]], cut: int, n: int,
                                              counts: tuple[int, ...]) -> None:
    assert v_counts(outer, cut, n) == counts


def test_without_a_dp_the_bound_is_the_work_floor() -> None:
    # DualPipe. Works 12, 3, 3, 3, 3 (15 + 12 = 24 in all) over 2 ranks, m=2: total / p = 12 per
    # microbatch, but the heaviest layer alone is 12 too; with a heavier layer it sets the floor.
    placement = dualpipe(2)
    layers = [Layer("big", 4, 4, 4)] + [Layer(f"l{i}", 1, 1, 1) for i in range(4)]
    data = _data(layers, placement, m=2)
    assert least_bound_split(data) is None
    assert any_split_bound(data) == pytest.approx(2 * 12.0)
    heavier = _data([Layer("big", 6, 6, 6)] + layers[1:], placement, m=2)
    assert any_split_bound(heavier) == pytest.approx(2 * 18.0)  # the heaviest layer: above (18 + 12) / 2
    for counts in _splits(5, 2):
        assert split_bound(data, counts) == pytest.approx(2 * 24.0 / 2)  # only the work over ranks


def test_the_interleaved_bound_sees_whole_layers_and_the_head() -> None:
    # Ten layers F = B = W = 1 on interleaved p=4, v=2, m=3, hop 0.5: the old floor was 3 x 30 / 4 =
    # 22.5. Eight chunks of whole layers leave two ranks three layers (27) or one four (36); one of
    # the two is not rank 0 and waits at least a layer's F and a hop first: 28.5.
    data = _data(_uniform(10), interleaved(4, 2), m=3)
    assert least_bound_split(data) is None
    assert any_split_bound(data) >= 28.5  # the old floor: 22.5
    assert any_split_bound(data) <= min(split_bound(data, c) for c in _splits(10, 8)) + 1e-9
    assert any_split_bound(_data(_uniform(10), interleaved(4, 2), m=3, objective="span")) >= 27.0


@pytest.mark.parametrize("placement,n", [(linear(2), 6), (linear(3), 7), (vshape(2), 7)], ids=["l2", "l3", "v2"])
@pytest.mark.parametrize("multiple,byte_cap", [(None, None), (1.0, None), (None, 14.0)], ids=["none", "1p", "cap"])
def test_the_least_bound_split_under_span_is_the_least_by_enumeration(placement: Placement, n: int,
                                                                     multiple: float | None,
                                                                     byte_cap: float | None) -> None:
    data = _data(_random(n, n + placement.num_ranks), placement, m=4, objective="span", multiple=multiple,
                 byte_cap=byte_cap)
    every = {c: split_bound(data, c) for c in _splits(n, len(placement.routes[0]))}
    least = least_bound_split(data)
    if least is None:
        assert all(math.isinf(b) for b in every.values())
        assert any_split_bound(data) == math.inf
        return
    assert every[least] == pytest.approx(min(every.values()))
    assert any_split_bound(data) == pytest.approx(min(every.values()))


@pytest.mark.parametrize("placement,n", [(linear(2), 6), (linear(3), 6), (vshape(2), 6)], ids=["l2", "l3", "v2"])
@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_more_memory_never_raises_a_bound_and_more_microbatches_never_lower_it(placement: Placement, n: int,
                                                                               objective: str) -> None:
    layers = _random(n, 40 + n)
    for counts in _splits(n, len(placement.routes[0])):
        by_cap = [split_bound(_data(layers, placement, objective=objective, byte_cap=cap), counts)
                  for cap in (10.0, 14.0, 20.0, None)]
        assert all(a >= b - 1e-9 for a, b in zip(by_cap, by_cap[1:])), (counts, by_cap)
        by_m = [split_bound(_data(layers, placement, m=m, objective=objective, multiple=1.0), counts)
                for m in (2, 3, 5)]
        assert all(a <= b + 1e-9 for a, b in zip(by_m, by_m[1:])), (counts, by_m)
    caps = [any_split_bound(_data(layers, placement, objective=objective, byte_cap=c)) for c in (10.0, 14.0, None)]
    assert caps[0] >= caps[1] - 1e-9 >= caps[2] - 2e-9


@pytest.mark.parametrize("objective", ["makespan", "span"])
@pytest.mark.parametrize("seed", range(6))
def test_the_v_dp_under_its_caps_finds_the_least_split_by_enumeration(objective: str, seed: int) -> None:
    """The caps prune ranks by their work only (a rank's bound is at least m x its work): whatever cap
    first admits a split, the DP's answer is the least over every split."""
    n, placement = 10, vshape(3)
    data = _data(_random(n, 70 + seed), placement, m=5, objective=objective, byte_cap=rng_cap(seed))
    every = {c: split_bound(data, c) for c in _splits(n, 6)}
    least = least_bound_split(data)
    if least is None:
        assert all(math.isinf(b) for b in every.values()) and any_split_bound(data) == math.inf
        return
    assert every[least] == pytest.approx(min(every.values()))
    assert any_split_bound(data) == pytest.approx(min(every.values()))


class _Ticks:
    """A stand-in for budget.past (as each module imports it): a deadline passes after `n` checks (no deadline never does), so a
    DP is cut short at every point it checks, with no clock in the test."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, deadline: float | None) -> bool:
        if deadline is None:
            return False
        self.n -= 1
        return self.n < 0


@pytest.fixture(autouse=True)
def _fresh_dp_cache() -> Iterator[None]:
    caches = (bounds_module._least, interleaved_module._finished)
    for cache in caches:
        cache.done.clear()  # a finished DP is kept: each test starts without one
    yield
    for cache in caches:
        cache.done.clear()


@pytest.mark.parametrize("placement", [linear(3), vshape(2), vshape(3)], ids=["linear", "v2", "v3"])
@pytest.mark.parametrize("seed", range(4))
def test_a_dp_cut_short_anywhere_is_a_bound_no_higher_than_the_finished_one(monkeypatch: pytest.MonkeyPatch,
                                                                           placement: Placement, seed: int) -> None:
    data = _data(_random(9, seed), placement, byte_cap=rng_cap(seed))
    finished_value, finished = cheap_bound(data, None)
    assert finished and finished_value == any_split_bound(data)
    every = min(split_bound(data, c) for c in _splits(9, len(placement.routes[0])))
    for n in range(2000):
        bounds_module._least.done.clear()
        monkeypatch.setattr(bounds_module, "past", _Ticks(n))
        value, done = cheap_bound(data, 0.0)
        assert value <= finished_value + 1e-9 and value <= every + 1e-9
        if done:
            assert value == pytest.approx(finished_value)
            break
        assert least_bound_split(data, 0.0) is None  # cut short: no split named
    else:
        pytest.fail("the DP never finished")


def test_a_v_dp_cut_short_past_its_first_caps_bounds_above_the_work_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each cap the DP passes proves every split above it: cut short later, the bound is that cap, not
    the floor (the 80-layer models of results/configure.md stop there)."""
    data = _data(_random(12, 3), vshape(3), m=6, byte_cap=16.0)
    floor = bounds_module.work_floor(LayerSums(data.layers), data)
    exact = any_split_bound(data)
    assert exact > floor * 1.01  # memory binds: the least split is well above the floor
    seen = set()
    for n in range(100000):
        bounds_module._least.done.clear()
        monkeypatch.setattr(bounds_module, "past", _Ticks(n))
        value, done = cheap_bound(data, 0.0)
        if done:
            break
        seen.add(value)
        assert value <= exact + 1e-9
    assert max(seen) > floor and max(seen) == pytest.approx(max(floor * c for c in bounds_module.V_CAPS
                                                                  if floor * c < exact))


def rng_cap(seed: int) -> float | None:
    return [None, 12.0, 16.0, 24.0][seed % 4]


@pytest.mark.parametrize("placement", [linear(3), vshape(2), interleaved(2, 2)], ids=["linear", "v", "interleaved"])
def test_a_deadline_already_past_gives_a_weaker_bound_at_once_and_keeps_nothing(placement: Placement) -> None:
    data = _data(_random(9, 1), placement)
    value, done = cheap_bound(data, time.monotonic() - 1.0)
    assert not done and least_bound_split(data, time.monotonic() - 1.0) is None
    # What was cut short is not kept: with time the DP finishes, at or above the cut-short bound.
    full, done = cheap_bound(data, time.monotonic() + 60.0)
    assert done and value <= full + 1e-9 and full == pytest.approx(any_split_bound(data))
    assert cheap_bound(data, time.monotonic() - 1.0) == (full, True)  # finished: kept, whatever the deadline
