"""partition/candidates.py: the candidate splits. even_counts (ends on the end chunks, blocks spread), the
balanced chunk DP and the memory-capped DP against enumeration, rank_work by hand, one-layer moves
(neighbours, transfers), rank_balanced reaching a local optimum, and parse_rule's accepted rules."""

from __future__ import annotations

import itertools
import math
import random
from typing import Iterator, Sequence

import pytest

from zbsearch.core.ir import Placement, interleaved, linear, vshape
from zbsearch.core.layers import Layer
from zbsearch.search.partition.candidates import (RULES, balanced_counts, even_counts, memory_capped_counts,
                                                  neighbours, parse_rule, rank_balanced, rank_work, transfers)


def _layers(kinds: Sequence[str]) -> list[Layer]:
    return [Layer(f"l{i}", 1.0, 1.0, 1.0, kind=kind) for i, kind in enumerate(kinds)]


def _random_layers(n: int, seed: int) -> list[Layer]:
    rng = random.Random(seed)
    return [Layer(f"layers.{i}", rng.randint(1, 4), rng.randint(1, 5), rng.randint(0, 3), mem_B=rng.randint(1, 4),
                  static_bytes=rng.randint(1, 3)) for i in range(n)]


def _worked(works: Sequence[float]) -> list[Layer]:
    """Layers whose F + B + W are `works` (all in F)."""
    return [Layer(f"l{i}", w, 0.0, 0.0) for i, w in enumerate(works)]


def _splits(n: int, k: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cuts + (n,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def _chunk_works(layers: Sequence[Layer], counts: Sequence[int]) -> list[float]:
    out, start = [], 0
    for c in counts:
        out.append(sum(layer.work for layer in layers[start:start + c]))
        start += c
    return out


@pytest.mark.parametrize("kinds,k,counts", [
    (["other"] * 10, 4, (3, 3, 2, 2)),  # no kinds: every layer spread, earlier chunks take the remainder
    (["embedding"] * 2 + ["decoder"] * 6 + ["output"], 3, (4, 2, 3)),  # both embeddings lead, the head trails
    (["embedding", "decoder", "decoder", "output"], 3, (2, 1, 1)),  # fewer blocks than chunks: spread all
    (["embedding"] * 3, 2, (2, 1)),  # nothing but leading layers: spread all
    (["embedding"] + ["decoder"] * 5 + ["output"] * 2, 1, (8,)),
    (["decoder"] * 4 + ["output"], 4, (1, 1, 1, 2)),
])
def test_even_counts(kinds: list[str], k: int, counts: tuple[int, ...]) -> None:
    assert even_counts(_layers(kinds), k) == counts


@pytest.mark.parametrize("seed", range(6))
def test_balanced_counts_minimise_the_heaviest_chunk(seed: int) -> None:
    layers = _random_layers(7, seed)
    for k in (2, 3, 4):
        counts = balanced_counts(layers, k)
        assert sum(counts) == 7 and len(counts) == k and min(counts) >= 1
        best = min(max(_chunk_works(layers, c)) for c in _splits(7, k))
        assert max(_chunk_works(layers, counts)) == pytest.approx(best)


@pytest.mark.parametrize("placement,counts,work", [
    (linear(3), (2, 3, 1), [3.0, 12.0, 6.0]),
    # V: rank 0 holds route positions 0 and 3 (works 1 and 6), rank 1 positions 1 and 2 (2 + 3 and 4 + 5).
    (vshape(2), (1, 2, 2, 1), [7.0, 14.0]),
    # Interleaved: rank 0 holds positions 0 and 2, rank 1 positions 1 and 3.
    (interleaved(2, 2), (1, 2, 2, 1), [10.0, 11.0]),
])
def test_rank_work_sums_each_ranks_chunks(placement: Placement, counts: tuple[int, ...], work: list[float]) -> None:
    assert rank_work(_worked([1, 2, 3, 4, 5, 6]), counts, placement) == pytest.approx(work)


def test_neighbours_move_one_boundary_layer_keeping_every_chunk() -> None:
    # (2, 1, 3): chunk 0 may give a layer to chunk 1, chunk 1 may take one from chunk 2; chunk 1 gives none.
    assert sorted(neighbours((2, 1, 3))) == [(1, 2, 3), (2, 2, 2)]
    assert neighbours((1, 1)) == [] and neighbours((5,)) == []
    for counts in _splits(8, 4):
        moved = neighbours(counts)
        # Brute force: every split of the same layers that differs by one layer across one boundary.
        near = [c for c in _splits(8, 4) if sum(abs(x - y) for x, y in zip(c, counts)) == 2
                and any(abs(c[i] - counts[i]) == 1 and abs(c[i + 1] - counts[i + 1]) == 1 for i in range(3))]
        assert sorted(moved) == sorted(near)


def test_transfers_move_one_layer_from_any_chunk_to_any_other() -> None:
    assert sorted(transfers((1, 2, 1))) == [(1, 1, 2), (2, 1, 1)]
    assert sorted(transfers((2, 2))) == [(1, 3), (3, 1)]
    assert transfers((1, 1, 1)) == []
    for counts in _splits(7, 3):
        moved = transfers(counts)
        donors = sum(c >= 2 for c in counts)
        assert len(moved) == len(set(moved)) == donors * 2
        for c in moved:
            assert sum(c) == 7 and min(c) >= 1
            assert sorted(x - y for x, y in zip(c, counts) if x != y) == [-1, 1]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("placement", [vshape(2), interleaved(2, 2), vshape(3)], ids=["v2", "interleaved", "v3"])
def test_rank_balanced_stops_where_no_boundary_move_helps(seed: int, placement: Placement) -> None:
    layers = _random_layers(9, 10 + seed)
    start = balanced_counts(layers, placement.num_chunks)

    def key(c: Sequence[int]) -> tuple[float, float]:
        work = rank_work(layers, c, placement)
        return max(work), sum(w * w for w in work)

    found = rank_balanced(layers, start, placement)
    assert sum(found) == 9 and min(found) >= 1
    assert key(found) <= key(start)
    assert all(key(c) >= key(found) for c in neighbours(found))  # a local optimum
    assert rank_balanced(layers, start, placement, max_steps=0) == start


def test_rank_balanced_sees_what_the_chunk_dp_cannot() -> None:
    # V on 2 ranks, works 6 1 5 2 4 4 (22 in all). The chunk DP's (1, 2, 2, 1) has chunks 6, 6, 6, 4, the
    # least heaviest chunk, but ranks 6 + 4 = 10 and 6 + 6 = 12; one boundary move, (2, 1, 2, 1), gives
    # chunks 7, 5, 6, 4 and ranks 11 and 11: half the work each, the best any split can do.
    layers = _worked([6, 1, 5, 2, 4, 4])
    start = balanced_counts(layers, 4)
    assert start == (1, 2, 2, 1) and rank_work(layers, start, vshape(2)) == [10.0, 12.0]
    found = rank_balanced(layers, start, vshape(2))
    assert found == (2, 1, 2, 1) and rank_work(layers, found, vshape(2)) == [11.0, 11.0]


def _fits(layers: Sequence[Layer], counts: Sequence[int], caps: Sequence[float], in_flight: Sequence[int]) -> bool:
    start = 0
    for c, cap, held in zip(counts, caps, in_flight):
        group = layers[start:start + c]
        start += c
        if sum(x.static_bytes for x in group) + held * sum(x.mem_B for x in group) > cap:
            return False
    return True


@pytest.mark.parametrize("seed", range(8))
def test_memory_capped_counts_is_the_lightest_heaviest_chunk_that_fits(seed: int) -> None:
    rng = random.Random(seed)
    layers = _random_layers(7, 20 + seed)
    k = rng.choice([2, 3])
    in_flight = [k - i for i in range(k)]  # 1F1B's: p - r microbatches on rank r
    caps = [rng.uniform(10, 30)] * k
    found = memory_capped_counts(layers, linear(k), caps, in_flight)
    fitting = [c for c in _splits(7, k) if _fits(layers, c, caps, in_flight)]
    if not fitting:
        assert found is None
        return
    assert found is not None and _fits(layers, found, caps, in_flight)
    assert max(_chunk_works(layers, found)) == pytest.approx(min(max(_chunk_works(layers, c)) for c in fitting))


def test_memory_capped_counts_without_caps_is_the_balanced_split_and_with_no_room_none() -> None:
    layers = _random_layers(5, 3)
    assert memory_capped_counts(layers, linear(2), [0.5, 0.5], [1, 1]) is None  # every layer holds more
    free = memory_capped_counts(layers, linear(2), [math.inf, math.inf], [2, 1])
    assert free is not None
    assert max(_chunk_works(layers, free)) == pytest.approx(max(_chunk_works(layers, balanced_counts(layers, 2))))


def test_parse_rule_reads_every_rule() -> None:
    layers = _layers(["embedding"] + ["decoder"] * 6 + ["output"])
    pl = vshape(2)
    assert RULES == ("auto", "even", "balanced")
    assert parse_rule("auto", layers, pl) == ("auto", None)
    # 6 blocks over 4 chunks: 2, 2, 1, 1; the embedding joins the first, the head the last.
    assert parse_rule(" Even ", layers, pl) == ("even", (3, 2, 1, 2))
    assert parse_rule("BALANCED", layers, pl) == ("balanced", balanced_counts(layers, 4))
    assert parse_rule("fixed:1,3,3,1", layers, pl) == ("fixed", (1, 3, 3, 1))
