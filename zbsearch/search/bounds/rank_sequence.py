"""The least span of one rank on its own: a relaxation solved exactly, one pass order at a time.

Keep rank r's passes and drop every other rank's capacity and memory, so that another rank only
delays a microbatch: each of the rank's passes can start no earlier than a fixed lag after the pass of
the same microbatch before it on the rank started (the longest dependency path between them, through
the other ranks). On one chunk (the linear placement) that is a forward, its backward a round trip
later and its weight pass; on a rank holding several chunks of one route (the V-shape, interleaved)
it is a chain: the forwards in route order, each a trip down the ranks after the previous one, the
backwards in reverse order, and a weight pass after each backward. What is left is one machine
running m microbatches of that chain, each step in microbatch order (microbatches cost the same, so
relabeling the k-th executed pass of each step as microbatch k keeps every schedule valid:
cpsat.add_symmetry_breaking), under the rank's memory limit. Its least span is a lower bound on that
rank's span in every schedule of the whole problem.

It is exact where bounds/analytic.py's start and end idle only estimate: those fill the round trip at the
start and at the end of the rank separately, each with whatever memory allows at that moment (the
end, for example, with weight passes deferred until then), while here the weights deferred to the end
held memory throughout, and the backwards that could fill the end wait for their own round trips.
On random heterogeneous pipelines at 0.75p this lifted the bound by up to 4% (bench/solve_bench.py,
hetero-random #12 and #16); on a V-shape under a byte cap where two chunks share a rank's memory,
by up to 8% (a DeepSeek-V2-Lite-like split at p=8, 42 GiB).

The search walks pass orders as a dynamic program over the counts of each step done. Each pass starts
as soon as the machine is free and its input is there (delaying a pass never helps: every later time
only grows), so a state is the time the machine is free and the start times of the passes whose
lagged successor is still to come. A state no earlier in all of these than another of the same counts
is dropped: every continuation of the other finishes no later. On a chain of several chunks the states
of one count merge into their earliest corner, and the walk runs a layer at a time in numpy
(bounds/chain_walk.py).
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..budget import BUDGET
from .chain_walk import least_chain_span
from .rank_chain import RankChain, RankPasses

# Where the limit holds this many round trips' worth of the rank's passes, the walk is skipped: memory
# then rarely holds a forward back, the walk is at its longest, and on the paper's Table 5 profiles and
# the hetero-random instances (0.5p to 2p) it raised no bound there (the largest ratio where it did: 1.54).
AMPLE = 2.0
# The same for chains of several chunks, whose walk grows much faster with the room: past one round
# trip's worth it ran out of budget on every V-shape rank tried (a second each), and raised none.
CHAIN_AMPLE = 1.0
# States kept per count: past this many, they merge into their earliest corner (see _add).
FRONT_CAP = 8


def least_span(rank: RankPasses | RankChain, max_expansions: int = BUDGET.rank_walk_states,
               ample: float | None = None) -> float | None:
    """The least time from the rank's first pass's start to its last pass's end, or None when the
    search exceeds `max_expansions` states, the limit holds `ample` round trips, or no order fits the
    limit (then nothing is proven). `ample`: AMPLE on one chunk, CHAIN_AMPLE on longer chains."""
    chain = rank.chain() if isinstance(rank, RankPasses) else rank
    if ample is None:
        ample = AMPLE if len(chain.steps) <= 3 else CHAIN_AMPLE
    if _counts_to_walk(chain) > max_expansions:
        return None  # give up at once rather than after walking max_expansions states
    if chain.room_in_trips() >= ample:
        return None
    if len(chain.steps) > 3:
        return _chain_span(chain, max_expansions, False)
    return _least_span(chain, max_expansions, FRONT_CAP)


def _counts_to_walk(chain: RankChain) -> float:
    """How many step counts memory lets the search reach, at most, on one chunk (forwards in flight and
    weights pending are each capped by the limit); on longer chains the budget alone decides."""
    if len(chain.steps) != 3:
        return 0.0
    f, b, _ = chain.steps
    in_flight = chain.cap / f.alloc if f.alloc > 0 else math.inf
    held = f.alloc - b.free  # what a microbatch awaiting only its weight pass holds
    pending = chain.cap / held if held > 0 else math.inf
    return (chain.m + 1) * (min(in_flight, chain.m) + 1) * (min(pending, chain.m) + 1)


State = tuple[float, tuple[tuple[float, ...], ...]]  # machine free at; per timed step, pending starts


def least_to_last_backward(chain: RankChain, max_expansions: int = BUDGET.rank_walk_states,
                           deadline: float | None = None) -> float | None:
    """The least time from the rank's first pass's start to the end of its last forward or backward
    (weight passes after it not counted), or None when the search exceeds `max_expansions` states, the
    `deadline` (time.monotonic(), chains only) passes or no order fits the limit. Unlike least_span
    there is no `ample` cut: bounds/window_nesting.py, its reader, budgets the walks itself."""
    if _counts_to_walk(chain) > max_expansions:
        return None  # give up at once rather than after walking max_expansions states
    if len(chain.steps) <= 3:
        return _least_span(chain, max_expansions, FRONT_CAP, True)
    if deadline is None:
        return _chain_span(chain, max_expansions, True)
    return least_chain_span(chain, max_expansions, True, deadline)


@lru_cache(maxsize=4096)
def _chain_span(chain: RankChain, max_expansions: int, to_last_backward: bool) -> float | None:
    """A chain of several chunks: the walk in numpy (bounds/chain_walk.py), one state per count (the earliest
    corner of all that reach it), which keeps it in budget; on the V-shape ranks tried that lost at most
    0.7% of the bound against keeping eight."""
    return least_chain_span(chain, max_expansions, to_last_backward)


@lru_cache(maxsize=4096)
def _least_span(chain: RankChain, max_expansions: int, front_cap: int, to_last_backward: bool = False) -> float | None:
    steps = chain.steps
    # The steps whose passes a later, lagged step waits on: their start times are the state.
    timed = tuple(k for k in range(len(steps)) if any(s.after == k and s.lag is not None for s in steps))
    net = tuple(s.alloc - s.free for s in steps)
    # Forwards and backwards (a weight pass follows its backward on the machine, with no lag): where
    # the walk stops at the last backward, a state that has run all of them is an answer.
    core = tuple(k for k, s in enumerate(steps) if s.after is None or s.lag is not None) if to_last_backward else ()
    layer: dict[tuple[int, ...], list[State]] = {(0,) * len(steps): [(0.0, ((),) * len(timed))]}
    expanded, done = 0, math.inf
    for _ in range(len(steps) * chain.m):
        nxt: dict[tuple[int, ...], list[State]] = {}
        for counts, front in layer.items():
            expanded += len(front)
            if expanded > max_expansions:
                return None
            level = sum(c * x for c, x in zip(counts, net))
            for state in front:
                for key, after in _moves(chain, timed, counts, level, state, net):
                    if core and all(key[k] == chain.m for k in core):
                        done = min(done, after[0])  # the last backward has just ended
                        continue
                    _add(nxt.setdefault(key, []), after, front_cap)
        layer = nxt
    if core:
        return None if math.isinf(done) else done
    # No order fits when the limit holds less than one microbatch's passes run apart (a fused backward
    # may still fit, which these passes do not model): then nothing is proven here.
    return min((t for front in layer.values() for t, _ in front), default=None)


def _moves(chain: RankChain, timed: tuple[int, ...], counts: tuple[int, ...], level: float, state: State,
           net: tuple[float, ...]):
    """The states one more pass leads to: the next pass of any step whose earlier step has run more
    often (its input back after the lag) and whose memory fits."""
    t, pending = state
    # The level is a sum of counts times each step's net memory: allow its round-off, so that a limit
    # met exactly is met (more room only makes the bound lower, never wrong).
    cap = chain.cap + 1e-9 * max(1.0, abs(chain.cap))
    for k, step in enumerate(chain.steps):
        ready = counts[k] < chain.m if step.after is None else counts[k] < counts[step.after]
        # Memory only changes at a pass's start (alloc) and end (free), and runs one pass at a time.
        if not ready or level + step.alloc > cap or level + net[k] > cap:
            continue
        begin, after = t, list(pending)
        if step.after is not None and step.lag is not None:
            j = timed.index(step.after)
            begin = max(t, pending[j][0] + step.lag)
            after[j] = pending[j][1:]
        if k in timed:
            j = timed.index(k)
            after[j] = after[j] + (begin,)
        yield counts[:k] + (counts[k] + 1,) + counts[k + 1:], (begin + step.duration, tuple(after))


def _add(front: list[State], state: State, cap: int) -> None:
    """Keep `front` the states no other one dominates (no later in time and in every pending start)."""
    t, pending = state
    flat = [x for starts in pending for x in starts]

    def no_later(a: State) -> bool:  # a is no later than state everywhere
        return a[0] <= t and all(x <= y for x, y in zip((x for s in a[1] for x in s), flat))

    def no_earlier(a: State) -> bool:
        return t <= a[0] and all(y <= x for x, y in zip((x for s in a[1] for x in s), flat))

    if any(no_later(other) for other in front):
        return
    front[:] = [other for other in front if not no_earlier(other)]
    front.append(state)
    if len(front) > cap:
        # One state no later than any of them in every coordinate: it may not exist, so the search
        # is from here on a relaxation (its result still a lower bound), and the walk stays short.
        front[:] = [_corner(front)]


def _corner(states: list[State]) -> State:
    """A state no later than each of `states` (two or more, of the same counts) in every coordinate."""
    return min(s[0] for s in states), tuple(tuple(map(min, *starts)) for starts in zip(*(s[1] for s in states)))
