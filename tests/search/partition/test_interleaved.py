"""partition/bounds.py on the interleaved placement, by brute force over every split of small random
layer lists: the bound over every split is at most the least split's cheap bound, the two-round DP is
exactly the least largest head + work, the ranges a rank's chunks can take are those the splits
give, and the relaxations cut short at a deadline anywhere stay below the finished bound. (test_search.py checks both bounds against proven optima.)"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

import pytest

from zbsearch.core.ir import interleaved
from zbsearch.core.layers import Layer
from zbsearch.search.partition.bounds import any_split_bound, split_bound
from zbsearch.search.partition import interleaved as interleaved_module
from zbsearch.search.partition.interleaved import _rank_ranges, _two_round_bound, head_and_work, interleaved_least
from zbsearch.search.partition.rank_bound import LayerSums, SplitBoundInput, rank_positions


def _splits(n: int, k: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cuts + (n,)
        yield tuple(b - a for a, b in itertools.pairwise(edges))


def _instance(seed: int, v: int = 2) -> SplitBoundInput:
    """p 2-3 (2 at v=3), v chunks per rank, vp..9 layers (some with a fused backward cheaper than
    B + W), m 2-6, either objective, no cap, a byte cap or an `Np` limit, hop 0 or 0.5."""
    rng = random.Random(seed)
    p = rng.choice([2, 3]) if v == 2 else 2
    n = rng.randint(v * p, 9)
    layers = tuple(Layer(f"l{i}", rng.randint(1, 3), rng.randint(1, 4), rng.randint(0, 2), mem_B=rng.randint(1, 3),
                         mem_W=rng.choice([0.5, 1.0]), static_bytes=rng.randint(1, 2),
                         full_backward=rng.choice([None, 2])) for i in range(n))
    cap = rng.choice([None, 12.0, 16.0, 24.0])
    multiple = rng.choice([None, 1.0, 2.0]) if cap is None else None
    return SplitBoundInput(layers, interleaved(p, v), rng.randint(2, 6), rng.choice(["makespan", "span"]),
                           rng.choice([0.0, 0.5]), cap, multiple, rng.choice([True, False]))  # type: ignore[arg-type]


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("seed", range(40))
def test_the_bound_over_every_split_is_below_the_least_splits_cheap_bound(seed: int, v: int) -> None:
    data = _instance(seed, v)
    every = [split_bound(data, c) for c in _splits(len(data.layers), data.placement.num_chunks)]
    assert any_split_bound(data) <= min(every) * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_the_two_round_dp_is_the_least_largest_head_and_work(seed: int) -> None:
    data = _instance(seed)
    s = LayerSums(data.layers)
    least = min(head_and_work(s, data, c) for c in _splits(len(data.layers), data.placement.num_chunks))
    assert _two_round_bound(s, data, 0.0) == pytest.approx(least, rel=1e-8)


@pytest.mark.parametrize("n,p,v", [(6, 2, 2), (8, 3, 2), (7, 2, 3), (9, 3, 3)])
def test_a_ranks_ranges_are_those_the_splits_give(n: int, p: int, v: int) -> None:
    pl = interleaved(p, v)
    for r in range(p):
        seen = set()
        for counts in _splits(n, v * p):
            edges = [0] + list(itertools.accumulate(counts))
            seen.add(tuple((edges[k], edges[k + 1]) for k in rank_positions(pl, r)))
        assert set(_rank_ranges(n, p, v, r)) == seen


def test_the_bound_is_strictly_above_the_old_floor_on_random_instances() -> None:
    # The old bound was m x max(total work / p, heaviest layer) (the layer's F + B + W, which a fused
    # backward can beat: here at W's least); the new one beats it on most lists.
    above = 0
    for seed in range(40):
        data = _instance(seed)
        s = LayerSums(data.layers)
        old = data.microbatches * max(s.pre["work"][-1] / data.placement.num_ranks,
                                      max(s("work", i, i + 1) for i in range(s.n)))
        new = any_split_bound(data)
        assert new >= old
        above += new > old * (1 + 1e-9) and not math.isinf(new)
    assert above >= 20


@pytest.mark.parametrize("seed", range(8))
def test_the_relaxations_cut_short_anywhere_stay_below_the_finished_bound(monkeypatch: pytest.MonkeyPatch,
                                                                         seed: int) -> None:
    data = _instance(seed)
    interleaved_module._finished.done.clear()
    finished_value, done = interleaved_least(data)
    assert done
    for n in range(10_000):
        interleaved_module._finished.done.clear()
        ticks = iter([False] * n)
        monkeypatch.setattr(interleaved_module, "past", lambda deadline: next(ticks, True))
        value, done = interleaved_least(data, 0.0)
        assert value <= finished_value * (1 + 1e-9)
        if done:
            assert value == pytest.approx(finished_value)
            break
    else:
        pytest.fail("the relaxations never finished")
    interleaved_module._finished.done.clear()
