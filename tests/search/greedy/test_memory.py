"""When one more forward may run on a rank holding several chunks (zbsearch/search/greedy/memory.py):
the level a rank holds, the memory that will be freed without further forwards, the room `admits` keeps
for the oldest microbatch in flight, the in-flight caps from the round trip, and when the inputs of a
route position's next passes arrive. Every case is a tiny V-shape worked out by hand."""

from __future__ import annotations

import math

import pytest

from zbsearch.core.ir import Kind
from zbsearch.core.stage_cost import StageCost
from zbsearch.search.greedy.memory import RouteArrivals, admits, freeable, inflight_caps, level
from zbsearch.sim.rank_state import ChunkProgress

# A V on p=2: route positions 0, 1, 2, 3; rank 0 holds positions 0 and 3, rank 1 holds 1 and 2.
RANK0 = (0, 3)
COST = StageCost(F=1.0, B=1.0, W=1.0, mem_B=1.0, mem_W=0.5)


def _chunks(counts: list[tuple[int, int, int]], m: int = 8, cost: StageCost = COST) -> list[ChunkProgress]:
    """One ChunkProgress per route position with these (forwards, backwards, weights) counts."""
    out = []
    for f, b, w in counts:
        c = ChunkProgress(cost, m)
        c.forwards, c.backwards, c.weights = f, b, w
        out.append(c)
    return out


@pytest.mark.parametrize("counts,held", [
    ([(0, 0, 0)] * 4, 0.0),
    # Position 0: 3 forwards, 1 backward, no weight: 2 x mem_B + 1 x mem_W; position 3: 1 forward.
    ([(3, 1, 0), (3, 1, 0), (1, 1, 0), (1, 0, 0)], 2 * 1.0 + 0.5 + 1.0),
    # Everything done on rank 0's chunks: nothing held.
    ([(2, 2, 2), (2, 2, 2), (2, 2, 2), (2, 2, 2)], 0.0),
])
def test_level_sums_what_the_ranks_chunks_hold(counts: list[tuple[int, int, int]], held: float) -> None:
    assert level(_chunks(counts), RANK0) == held


@pytest.mark.parametrize("counts,free", [
    # No microbatch has reached the last position: nothing it holds is sure to be freed.
    ([(2, 0, 0), (2, 0, 0), (1, 0, 0), (0, 0, 0)], 0.0),
    # Microbatch 0 has run every forward: its mem_B on positions 0 and 3 will go without another forward;
    # microbatch 1 (at position 0 only) still owes forwards, so its mem_B stays.
    ([(2, 0, 0), (1, 0, 0), (1, 0, 0), (1, 0, 0)], 2 * 1.0),
    # Backwards run, weights not yet: their mem_W will be freed too.
    ([(2, 1, 0), (1, 1, 0), (1, 1, 0), (1, 1, 0)], 0.5 + 0.5),
])
def test_freeable_counts_microbatches_past_every_forward(counts: list[tuple[int, int, int]], free: float) -> None:
    assert freeable(_chunks(counts), RANK0) == free


@pytest.mark.parametrize("counts,k,cap,ok", [
    # Nothing in flight: a new microbatch needs room for both of its forwards on rank 0 (2 x mem_B).
    ([(0, 0, 0)] * 4, 0, 2.0, True),
    ([(0, 0, 0)] * 4, 0, 1.5, False),
    # Microbatch 0 has run position 0 (level 1) and owes its forward at position 3. That forward may use
    # the room: 1 + 1 <= 2. A new microbatch must leave it: 1 + its own 1 + the room 1 = 3 > 2.
    ([(1, 0, 0), (1, 0, 0), (1, 0, 0), (0, 0, 0)], 3, 2.0, True),
    ([(1, 0, 0), (1, 0, 0), (1, 0, 0), (0, 0, 0)], 0, 2.0, False),
    ([(1, 0, 0), (1, 0, 0), (1, 0, 0), (0, 0, 0)], 0, 3.0, True),
    # Level 3 on rank 0 either way, cap 4. Here microbatch 0 has run every forward (its 2 on rank 0 will
    # be freed) and microbatch 1 owes position 3: the room it needs (1) is lent from the freeable 2, so a
    # new microbatch needs only its own 1: 3 + 1 = 4 fits.
    ([(2, 0, 0), (1, 0, 0), (1, 0, 0), (1, 0, 0)], 0, 4.0, True),
    # Same level held by three microbatches that all owe position 3, none of it freeable: 3 + 1 + 1 > 4.
    ([(3, 0, 0), (1, 0, 0), (1, 0, 0), (0, 0, 0)], 0, 4.0, False),
])
def test_admits_keeps_room_for_the_oldest_microbatchs_forwards(counts: list[tuple[int, int, int]], k: int,
                                                              cap: float, ok: bool) -> None:
    assert admits(_chunks(counts), RANK0, k, cap) is ok


def test_admits_counts_memory_about_to_be_freed() -> None:
    # The case refused above (level 1, a new microbatch needs 3 under a cap of 2) fits once 1 is freed.
    chunks = _chunks([(1, 0, 0), (1, 0, 0), (1, 0, 0), (0, 0, 0)])
    assert not admits(chunks, RANK0, 0, 2.0)
    assert admits(chunks, RANK0, 0, 2.0, freed=1.0)
    assert not admits(chunks, RANK0, 0, 2.0, freed=0.5)


def test_admits_follows_each_chunks_own_memory() -> None:
    # Position 3 holds three times what position 0 does: a new microbatch on an empty rank needs 1 + 3.
    chunks = _chunks([(0, 0, 0)] * 3) + _chunks([(0, 0, 0)], cost=StageCost(1.0, 1.0, 1.0, mem_B=3.0, mem_W=1.0))
    assert admits(chunks, RANK0, 0, 4.0)
    assert not admits(chunks, RANK0, 0, 3.9)


@pytest.mark.parametrize("factor,caps", [
    # By hand: every chunk F = B = 1 (W = 1), hops 1 across ranks and 0 within rank 1 (positions 1, 2).
    # Round trips from a rank's first position: tail[3] = 2, tail[2] = 2 + 2 + 2 x 1 = 6,
    # tail[1] = 6 + 2 + 0 = 8, tail[0] = 8 + 2 + 2 x 1 = 12. Busiest rank per microbatch: 2 x 3 = 6.
    (1.0, [2, 2]),            # ceil(12 / 6), ceil(8 / 6)
    (0.5, [1, 1]),            # ceil(1), ceil(0.67)
    (2.0, [4, 3]),            # ceil(4), ceil(2.67)
    (0.01, [1, 1]),           # never below one
])
def test_inflight_caps_on_a_v_are_each_ranks_round_trip_over_the_busiest_rank(factor: float, caps: list[int]) -> None:
    chunks = _chunks([(0, 0, 0)] * 4)
    assert inflight_caps(chunks, [1.0, 0.0, 1.0, 0.0], [[0, 3], [1, 2]], 8, factor) == caps


def test_inflight_caps_are_unbounded_when_no_rank_has_work() -> None:
    chunks = _chunks([(0, 0, 0)] * 4, cost=StageCost(0.0, 0.0, 0.0))
    assert inflight_caps(chunks, [0.0] * 4, [[0, 3], [1, 2]], 8, 1.0) == [math.inf, math.inf]


class _Route(RouteArrivals):
    def __init__(self, chunks: list[ChunkProgress], hop: list[float], m: int) -> None:
        self.chunks, self.hop, self.m = chunks, hop, m


def test_arrivals_follow_the_route_down_and_the_gradient_back() -> None:
    # Two positions, m = 2, a hop of 0.5 between them.
    route = _Route(_chunks([(0, 0, 0), (0, 0, 0)], m=2), [0.5, 0.0], 2)
    first, last = route.chunks
    assert route.f_arrival(0) == 0.0               # the first position's input is there from the start
    assert route.f_arrival(1) is None              # not produced yet
    assert route.b_arrival(0) is None and route.b_arrival(1) is None    # no forward to go back through
    first.record(Kind.F, 1.0)
    assert route.f_arrival(1) == 1.5               # microbatch 0's F ended at 1, plus the hop
    last.record(Kind.F, 3.0)
    assert route.b_arrival(1) == 3.0               # the loss position goes back once its own F ends
    assert route.b_arrival(0) is None              # the gradient for position 0 is not produced yet
    last.record(Kind.B, 5.0)
    assert route.b_arrival(0) == 5.5               # the gradient's end plus the hop
    assert route.b_arrival(1) is None              # no second forward there to go back through
    first.record(Kind.F, 2.0)
    assert route.f_arrival(0) is None              # both microbatches have entered
    assert route.f_arrival(1) == 2.5               # microbatch 1's input

