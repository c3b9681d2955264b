"""bounds/rank_chain.py: one rank as a chain of steps. RankPasses.chain on one chunk, RankChain.round_trip
along the lags and room_in_trips (how many round trips' worth of passes the limit holds), on chains
computed by hand."""

from __future__ import annotations

import math

import pytest

from zbsearch.search.bounds.rank_chain import RankChain, RankPasses, Step


def _one_chunk(cap: float = 2.5) -> RankPasses:
    # F 2, B 3, W 1; F takes 1, B gives back 0.6 and W 0.4; B starts at least 7 after its F.
    return RankPasses(2.0, 3.0, 1.0, (1.0, 0.0, 0.0), (0.0, 0.6, 0.4), 7.0, 4, cap)


def _v_rank(cap: float) -> RankChain:
    """A V-shape rank by hand: F of chunk 0, F of chunk 1 a trip of 5 later, B of chunk 1 4 after that
    forward, B of chunk 0 6 after that backward, then a W after each B."""
    steps = (Step(2.0, 1.0, 0.0), Step(1.0, 0.5, 0.0, 0, 5.0), Step(3.0, 0.0, 0.3, 1, 4.0),
             Step(2.0, 0.0, 0.6, 2, 6.0), Step(1.0, 0.0, 0.2, 2), Step(1.0, 0.0, 0.4, 3))
    return RankChain(steps, 3, cap)


def test_one_chunk_is_a_chain_of_forward_backward_weight() -> None:
    chain = _one_chunk().chain()
    assert chain == RankChain((Step(2.0, 1.0, 0.0), Step(3.0, 0.0, 0.6, 0, 7.0), Step(1.0, 0.0, 0.4, 1)), 4, 2.5)
    # Only the backward waits a lag; the W follows its B whenever the machine is free.
    assert [s.after for s in chain.steps] == [None, 0, 1] and [s.lag for s in chain.steps] == [None, 7.0, None]


def test_a_chain_is_a_value_so_equal_chains_share_a_cache_entry() -> None:
    a, b = _one_chunk().chain(), _one_chunk().chain()
    assert a == b and hash(a) == hash(b)
    assert a != _one_chunk(cap=3.0).chain()


@pytest.mark.parametrize("chain,trip", [
    (_one_chunk().chain(), 7.0 + 3.0),  # B starts 7 after F, and the trip ends with it
    (_v_rank(2.0), 5.0 + 4.0 + 6.0 + 2.0),  # along the three lags to B of chunk 0's start, plus that B
    (RankChain((Step(4.0, 1.0, 0.0), Step(2.0, 0.0, 1.0, 0)), 2, 1.0), 4.0),  # no lag: the first step alone
    (RankChain((Step(1.0, 1.0, 0.0), Step(1.0, 0.0, 0.5, 0, 0.0), Step(1.0, 0.0, 0.5, 1)), 2, 1.0), 1.0),
])
def test_the_round_trip_runs_along_the_lags_to_the_end_of_the_last_lagged_step(chain: RankChain, trip: float) -> None:
    assert chain.round_trip() == pytest.approx(trip)


@pytest.mark.parametrize("chain,room", [
    # cap 2.5 over the 1 a microbatch takes: 2.5 in flight, each 6 of work, over a trip of 10.
    (_one_chunk().chain(), 2.5 * 6.0 / 10.0),
    (_one_chunk(cap=10.0).chain(), 10.0 * 6.0 / 10.0),
    # 1.5 taken per microbatch (both forwards), cap 3: 2 in flight, 10 of work, over a trip of 17.
    (_v_rank(3.0), 2.0 * 10.0 / 17.0),
    (_one_chunk(cap=math.inf).chain(), math.inf),  # no limit
    (RankChain((Step(1.0, 0.0, 0.0), Step(1.0, 0.0, 0.0, 0, 3.0)), 2, 1.0), math.inf),  # nothing held
    (RankChain((Step(0.0, 1.0, 0.0), Step(0.0, 0.0, 1.0, 0, 0.0)), 2, 1.0), math.inf),  # no trip
])
def test_room_in_trips_is_round_trips_worth_of_passes_the_limit_holds(chain: RankChain, room: float) -> None:
    assert chain.room_in_trips() == pytest.approx(room)


def test_room_grows_with_the_limit_and_falls_with_a_longer_trip() -> None:
    rooms = [_one_chunk(cap).chain().room_in_trips() for cap in (1.0, 2.0, 4.0)]
    assert rooms == pytest.approx([0.6, 1.2, 2.4])
    longer = RankPasses(2.0, 3.0, 1.0, (1.0, 0.0, 0.0), (0.0, 0.6, 0.4), 17.0, 4, 2.0).chain()
    assert longer.room_in_trips() == pytest.approx(2.0 * 6.0 / 20.0)  # trip 17 + 3
    assert longer.room_in_trips() < rooms[1]


def test_zero_length_passes_with_nothing_held_give_nan() -> None:
    chain = RankChain((Step(0.0, 0.0, 0.0), Step(0.0, 0.0, 0.0, 0, 2.0)), 2, 1.0)
    assert chain.round_trip() == pytest.approx(2.0)
    assert math.isnan(chain.room_in_trips())
