"""bounds/chain_walk.py: least_chain_span, the numpy walk over a rank's chain, one state per count. Exact
on chains computed by hand, never above every order (brute force: merging states is a relaxation), the
same number as rank_sequence's Python walk with one state per count on one chunk, and None where no
order fits the limit or the state cap or deadline is passed."""

from __future__ import annotations

import math
import random
import time

import pytest

from zbsearch.search.bounds.chain_walk import least_chain_span
from zbsearch.search.bounds.rank_chain import RankChain, RankPasses, Step
from zbsearch.search.bounds.rank_sequence import _least_span

BIG = 10**9  # a state cap no test chain reaches


def _every_order(chain: RankChain, to_last_backward: bool = False) -> float:
    """The least span over every order of the chain's passes, microbatches in any order, each pass as
    early as the machine, its lag and memory allow; inf when none fits. `to_last_backward`: the least
    time to the end of the last pass of a step that is not a weight pass (a step after another with no lag)."""
    steps, m = chain.steps, chain.m
    cap = chain.cap + 1e-9 * max(1.0, abs(chain.cap))
    counted = [k for k, s in enumerate(steps) if not to_last_backward or s.after is None or s.lag is not None]

    def walk(done: frozenset, starts: dict, t: float, level: float, end: float) -> float:
        if all((i, k) in done for i in range(m) for k in counted):
            return end
        best = math.inf
        for i in range(m):
            for k, s in enumerate(steps):
                if (i, k) in done or (s.after is not None and (i, s.after) not in done):
                    continue
                if level + s.alloc > cap or level + s.alloc - s.free > cap:
                    continue
                begin = t if s.lag is None else max(t, starts[(i, s.after)] + s.lag)
                finish = begin + s.duration
                best = min(best, walk(done | {(i, k)}, {**starts, (i, k): begin}, finish, level + s.alloc - s.free,
                                      finish if k in counted else end))
        return best

    return walk(frozenset(), {}, 0.0, 0.0, 0.0)


def _random_chunk(rng: random.Random, m: int) -> RankChain:
    keep = rng.choice([0.3, 0.5])
    return RankPasses(rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 4), (1.0, 0.0, 0.0),
                      (0.0, 1.0 - keep, keep),
                      rng.randint(0, 12), m, rng.choice([1.0, 1.5, 2.0, 3.0, math.inf])).chain()


@pytest.mark.parametrize("lag,span,to_last", [
    (5.0, 9.0, 8.0),  # F 0-2, B waits for 5: 5-8, W 8-9
    (1.0, 6.0, 5.0),  # a lag shorter than F never binds: back to back
])
def test_one_microbatch_runs_its_chain_in_a_row(lag: float, span: float, to_last: float) -> None:
    chain = RankPasses(2.0, 3.0, 1.0, (1.0, 0.0, 0.0), (0.0, 0.5, 0.5), lag, 1, math.inf).chain()
    assert least_chain_span(chain, BIG) == pytest.approx(span)
    assert least_chain_span(chain, BIG, to_last_backward=True) == pytest.approx(to_last)


def test_without_a_limit_or_a_binding_lag_the_machine_never_idles() -> None:
    # Every forward, then every backward (each waits only for its own forward, long done), then the
    # weights: 4 x (2 + 3 + 1) in all, 4 x (2 + 3) to the last backward; one machine cannot do less.
    chain = RankPasses(2.0, 3.0, 1.0, (1.0, 0.0, 0.0), (0.0, 0.5, 0.5), 2.0, 4, math.inf).chain()
    assert least_chain_span(chain, BIG) == pytest.approx(24.0)
    assert least_chain_span(chain, BIG, to_last_backward=True) == pytest.approx(20.0)


def test_a_limit_of_one_forward_runs_microbatches_one_at_a_time() -> None:
    # The limit holds one forward (1.0); after its B, 0.5 stays until W, so the next F (1.0 more) must
    # wait for that W: F 0-1, B 4-6, W 6-7, then F 7-8, B 11-13, W 13-14.
    chain = RankPasses(1.0, 2.0, 1.0, (1.0, 0.0, 0.0), (0.0, 0.5, 0.5), 4.0, 2, 1.0).chain()
    assert least_chain_span(chain, BIG) == pytest.approx(14.0)
    assert least_chain_span(chain, BIG, to_last_backward=True) == pytest.approx(13.0)
    # With room for two forwards the second starts at once: F 0-1, F 1-2, B 4-6, B 6-8 (its F's start + 4
    # is 5), then the Ws 8-10; to the last backward 8.
    roomy = RankChain(chain.steps, 2, 2.0)
    assert least_chain_span(roomy, BIG) == pytest.approx(10.0)
    assert least_chain_span(roomy, BIG, to_last_backward=True) == pytest.approx(8.0)


def test_a_limit_below_one_forward_fits_no_order() -> None:
    chain = RankPasses(1.0, 2.0, 1.0, (1.0, 0.0, 0.0), (0.0, 0.5, 0.5), 4.0, 2, 0.9).chain()
    assert least_chain_span(chain, BIG) is None
    assert least_chain_span(chain, BIG, to_last_backward=True) is None
    assert _every_order(chain) == math.inf


def test_the_state_cap_and_the_deadline_give_no_bound() -> None:
    chain = RankPasses(1.0, 2.0, 1.0, (1.0, 0.0, 0.0), (0.0, 0.5, 0.5), 6.0, 6, 3.0).chain()
    assert least_chain_span(chain, BIG) is not None
    assert least_chain_span(chain, 1) is None  # the first layer is already past one state
    assert least_chain_span(chain, BIG, deadline=time.monotonic() - 1.0) is None
    assert least_chain_span(chain, BIG, True, deadline=time.monotonic() - 1.0) is None
    assert least_chain_span(chain, BIG, deadline=time.monotonic() + 60.0) == least_chain_span(chain, BIG)


@pytest.mark.parametrize("seed", range(10))
def test_one_chunk_is_never_above_every_order_and_exact_for_one_microbatch(seed: int) -> None:
    rng = random.Random(900 + seed)
    for m in (1, 3):
        chain = _random_chunk(rng, m)
        for to_last in (False, True):
            exact, walked = _every_order(chain, to_last), least_chain_span(chain, BIG, to_last)
            if math.isinf(exact):
                assert walked is None
                continue
            assert walked is not None and walked <= exact + 1e-9
            # The machine runs every counted pass once: no order is shorter than their sum.
            counted = [s.duration for s in chain.steps if not to_last or s.after is None or s.lag is not None]
            assert walked >= m * sum(counted) - 1e-9
            if m == 1:
                assert walked == pytest.approx(exact)


@pytest.mark.parametrize("seed", range(12))
def test_one_chunk_matches_the_python_walk_with_one_state_per_count(seed: int) -> None:
    """rank_sequence's walk on one chunk (what least_span runs there) with its front capped at one state:
    the same dynamic program, so the same number, on more microbatches than the brute force reaches."""
    rng = random.Random(1000 + seed)
    chain = _random_chunk(rng, rng.randint(4, 8))
    for to_last in (False, True):
        walked, python = least_chain_span(chain, BIG, to_last), _least_span(chain, BIG, 1, to_last)
        assert (walked is None) == (python is None)
        if walked is not None:
            assert walked == pytest.approx(python)


@pytest.mark.parametrize("cap", [2.0, 3.0])
def test_weight_passes_of_one_cost_pool_without_changing_the_answer(cap: float) -> None:
    """Two chunks whose weight passes cost the same (pooled into one step) against the same chain with
    one of them a hair dearer (kept apart): on this V-shape rank both reach every order's least span,
    within the hair per microbatch."""
    def chain(w1: float) -> RankChain:
        steps = (Step(2.0, 1.0, 0.0), Step(1.0, 0.5, 0.0, 0, 4.0), Step(2.0, 0.0, 0.3, 1, 3.0),
                 Step(1.0, 0.0, 0.7, 2, 5.0), Step(1.0, 0.0, 0.2, 2), Step(w1, 0.0, 0.2, 3))
        return RankChain(steps, 2, cap)

    exact = _every_order(chain(1.0))
    assert least_chain_span(chain(1.0), BIG) == pytest.approx(exact)
    assert least_chain_span(chain(1.0 + 1e-6), BIG) == pytest.approx(exact, abs=2 * 1e-6 + 1e-9)
