"""partition/enumerate.py: the walk over every split that tightens the bound. bound_input reads the user's
strings; the linear and V walks give exactly min over splits of max(cheap bound, own bound) when they
finish (brute force over every split, with a made-up own bound), also when their tables of suffix bounds
were cut short at a deadline; the incumbent caps them, an expired deadline leaves the work floor, and
refined_bound combines them (with an expired deadline: at once, no higher than with time)."""

from __future__ import annotations

import itertools
import math
import random
import time
from typing import Callable, Iterator, Sequence

import pytest

from zbsearch.core.ir import Placement, interleaved, linear, vshape
from zbsearch.core.layers import Layer
from zbsearch.core.objective import Objective
from zbsearch.core.profile import Profile
from zbsearch.search.partition import bounds as bounds_module, enumerate as enumerate_module
from zbsearch.search.partition.bounds import any_split_bound, split_bound
from zbsearch.search.partition.rank_bound import LayerSums, SplitBoundInput, linear_rank, v_chunks
from zbsearch.search.partition.enumerate import bound_input, linear_refined, refined_bound, v_refined

GiB = 2.0**30
LATER = 60.0  # seconds: a deadline no walk here reaches


def _splits(n: int, k: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cuts + (n,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def _data(n: int, placement: Placement, seed: int, objective: str = "makespan",
          byte_cap: float | None = None) -> SplitBoundInput:
    rng = random.Random(seed)
    layers = tuple(Layer(f"layers.{i}", rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 2),
                         mem_B=rng.randint(1, 3),
                         mem_W=1.0, static_bytes=rng.randint(1, 2)) for i in range(n))
    return SplitBoundInput(layers, placement, 4, Objective.parse(objective), 0.5, byte_cap, None)


def _rank_bounds(data: SplitBoundInput, counts: Sequence[int]) -> list[float]:
    """The cheap bound of each rank of a split (what the walks take the largest of)."""
    s, p = LayerSums(data.layers), data.placement.num_ranks
    e = [0] + list(itertools.accumulate(counts))
    if data.placement.name == "linear":
        return [linear_rank(s, data, r, e[r], e[r + 1]) for r in range(p)]
    return [v_chunks(s, data, r, [(e[r], e[r + 1]), (e[2 * p - 1 - r], e[2 * p - r])]) for r in range(p)]


def _made_up(data: SplitBoundInput, seed: int, spread: tuple[float, float]) -> Callable[[tuple[int, ...]], float]:
    """An own bound per split: its cheap bound times a random factor in `spread` (the walk must take it
    as given), counting the calls."""
    rng = random.Random(seed)
    table = {c: split_bound(data, c) * rng.uniform(*spread) for c in _splits(len(data.layers),
                                                                           len(data.placement.routes[0]))}

    def leaf(counts: tuple[int, ...]) -> float:
        leaf.calls += 1  # type: ignore[attr-defined]
        return table[tuple(counts)]

    leaf.calls = 0  # type: ignore[attr-defined]
    return leaf


def _brute(data: SplitBoundInput, *own: Callable[[tuple[int, ...]], float]) -> float:
    return min(max([max(_rank_bounds(data, c))] + [f(c) for f in own])
               for c in _splits(len(data.layers), len(data.placement.routes[0])))


def _layered(comm: float = 0.5, **extra: object) -> Profile:
    layers = [{"name": f"layers.{i}", "F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB / 2, "static_bytes": GiB,
               "out_bytes": float(2 * i + 2)} for i in range(5)]
    # Two stages, so that the scalar comm is one hop (one stage would leave no hop to hold it).
    stages = [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB}] * 2
    return Profile.from_dict({"name": "toy", "stages": stages, "microbatches": 6,
                              "memory_unit": "bytes", "comm": comm, "layers": layers, **extra,
                              "source": {"kind": "estimated", "method": "enumerate tests"}})


@pytest.mark.parametrize("limit,multiple,cap", [("2p", 2.0, None), ("p", 1.0, None), ("20GiB", None, 20 * GiB),
                                                (None, None, None)])
def test_bound_input_reads_the_limit_as_a_multiple_or_a_byte_cap(limit: str | None, multiple: float | None,
                                                                 cap: float | None) -> None:
    prof = _layered()
    data = bound_input(prof, vshape(2), limit, "span", 0.08)
    assert (data.multiple, data.byte_cap) == (multiple, cap)
    assert data.objective is Objective.SPAN and data.microbatches == 6 and data.placement == vshape(2)
    assert data.layers == tuple(prof.layers or ()) and data.min_hop == 0.5 and data.paper_memory


def test_bound_input_takes_the_cheapest_hop_from_the_layers_messages() -> None:
    # Over a link of 2 bytes per unit, the cuts after layers 0..3 carry 2, 4, 6, 8 bytes: 1 to 4 units.
    # The last layer's output crosses no cut.
    assert bound_input(_layered(link_bandwidth=2.0), linear(2), None, "makespan", 0.08).min_hop == pytest.approx(1.0)
    assert bound_input(_layered(comm=0.0), linear(2), None, "makespan", 0.08).min_hop == 0.0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("placement,n,cap", [(linear(2), 6, None), (linear(3), 7, 14.0), (vshape(2), 6, None),
                                             (vshape(2), 7, 16.0)], ids=["l2", "l3-cap", "v2", "v2-cap"])
def test_a_finished_walk_is_the_least_own_bound_over_every_split(seed: int, placement: Placement, n: int,
                                                                 cap: float | None) -> None:
    data = _data(n, placement, seed, byte_cap=cap)
    leaf = _made_up(data, seed, (0.9, 1.3))
    walk = linear_refined if placement.name == "linear" else v_refined
    value, visited, complete = walk(data, math.inf, leaf, time.monotonic() + LATER)
    assert leaf.calls == visited  # type: ignore[attr-defined]  # one own bound per split bounded
    assert 0 < visited <= len(list(_splits(n, len(placement.routes[0]))))
    assert complete and value == pytest.approx(_brute(data, leaf))
    # An incumbent below that: the walk has nothing to find and keeps it.
    low = _brute(data, leaf) * 0.9
    assert walk(data, low, leaf, time.monotonic() + LATER)[0] == pytest.approx(low)


@pytest.mark.parametrize("seed", range(3))
def test_the_v_walk_with_a_strong_bound_takes_the_larger_of_both(seed: int) -> None:
    data = _data(7, vshape(2), seed)
    leaf, strong = _made_up(data, seed, (0.9, 1.2)), _made_up(data, 100 + seed, (1.0, 1.4))
    value, _, complete = v_refined(data, math.inf, leaf, time.monotonic() + LATER, strong)
    assert complete and value == pytest.approx(_brute(data, leaf, strong))
    again = refined_bound(data, math.inf, leaf, time.monotonic() + LATER, strong)
    assert again[0] == pytest.approx(max(any_split_bound(data), _brute(data, leaf, strong)))


@pytest.mark.parametrize("placement", [linear(3), vshape(2)], ids=["linear", "v"])
def test_an_expired_deadline_leaves_a_bound_no_higher_than_the_finished_walks(placement: Placement) -> None:
    data = _data(7, placement, 5)
    leaf = _made_up(data, 5, (1.0, 1.3))
    walk = linear_refined if placement.name == "linear" else v_refined
    value, visited, complete = walk(data, math.inf, leaf, time.monotonic() - 1.0)
    assert not complete and visited == 0 and leaf.calls == 0  # type: ignore[attr-defined]
    # Its table of suffix bounds cut short too: the work floor, below the cheap DP over every split (no
    # split's cheap bound is lower) and the finished walk.
    least = min(max(_rank_bounds(data, c)) for c in _splits(7, len(placement.routes[0])))
    floor = data.microbatches * sum(x.F + x.B + x.W for x in data.layers) / placement.num_ranks
    assert value == pytest.approx(floor) and value <= least + 1e-9 and least <= _brute(data, leaf) + 1e-9


@pytest.mark.parametrize("placement", [linear(2), vshape(2)], ids=["linear", "v"])
def test_refined_bound_without_a_deadline_is_the_cheap_bound_capped_by_the_incumbent(placement: Placement) -> None:
    data = _data(6, placement, 1)
    leaf = _made_up(data, 1, (1.0, 1.3))
    cheap = any_split_bound(data)
    assert refined_bound(data, math.inf, leaf, None) == (cheap, 0, False)
    assert refined_bound(data, cheap * 0.9, leaf, None) == (cheap * 0.9, 0, True)  # the plan is at its bound
    # With time: the walk's answer, never below the cheap bound nor above the incumbent.
    value, _, complete = refined_bound(data, math.inf, leaf, time.monotonic() + LATER)
    assert complete and value == pytest.approx(max(cheap, _brute(data, leaf)))
    incumbent = (cheap + value) / 2
    capped = refined_bound(data, incumbent, leaf, time.monotonic() + LATER)[0]
    assert cheap - 1e-9 <= capped <= incumbent + 1e-9
    assert leaf.calls > 0  # type: ignore[attr-defined]


def test_refined_bound_on_a_placement_without_a_walk_is_the_cheap_bound() -> None:
    data = _data(6, interleaved(2, 2), 2)
    leaf = _made_up(data, 2, (1.0, 1.3))
    assert refined_bound(data, math.inf, leaf, time.monotonic() + LATER) == (any_split_bound(data), 0, False)
    assert leaf.calls == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("placement", [linear(3), vshape(2)], ids=["linear", "v"])
@pytest.mark.parametrize("seed", range(3))
def test_a_walk_whose_suffix_table_was_cut_short_finishes_at_the_same_bound(monkeypatch: pytest.MonkeyPatch,
                                                                          placement: Placement, seed: int) -> None:
    data = _data(7, placement, 20 + seed)
    leaf = _made_up(data, seed, (1.0, 1.3))
    walk = linear_refined if placement.name == "linear" else v_refined
    exact = _brute(data, leaf)
    for n in range(0, 400, 7):
        enumerate_module._v_suffix.done.clear()
        ticks = iter([False] * n)
        monkeypatch.setattr(enumerate_module, "past", lambda deadline: next(ticks, True))
        # The table cut after n checks (entries left at the work floor), the walk itself given time.
        value, _, complete = walk(data, math.inf, leaf, time.monotonic() + LATER)
        assert complete and value == pytest.approx(exact)
    enumerate_module._v_suffix.done.clear()


@pytest.mark.parametrize("placement", [linear(3), vshape(2)], ids=["linear", "v"])
def test_refined_bound_past_its_deadline_is_no_higher_than_with_time(placement: Placement) -> None:
    data = _data(7, placement, 31)
    leaf = _made_up(data, 31, (1.0, 1.3))
    bounds_module._least.done.clear()
    enumerate_module._v_suffix.done.clear()
    cut, visited, complete = refined_bound(data, math.inf, leaf, time.monotonic() - 1.0)
    assert not complete and visited == 0 and leaf.calls == 0  # type: ignore[attr-defined]
    # The cheap DP alone (walk False) stops at the deadline too, and says nothing is proven.
    assert refined_bound(data, math.inf, leaf, time.monotonic() - 1.0, walk=False) == (cut, 0, False)
    full, _, complete = refined_bound(data, math.inf, leaf, time.monotonic() + LATER)
    assert complete and cut <= any_split_bound(data) + 1e-9 and cut <= full + 1e-9
