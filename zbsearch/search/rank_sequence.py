"""The least span of one rank on its own: a relaxation solved exactly, one pass order at a time.

Keep rank r's passes (one chunk, one route: the linear placement) and drop every other rank's
capacity and memory, so that another rank only delays a microbatch: its backward on r can start no
earlier than `lag` after its forward on r started (the longest dependency path down the route and
back). What is left is one machine running m forwards, m backwards and m weight passes, each kind in
microbatch order (microbatches cost the same, so relabeling the k-th executed pass as microbatch k
keeps every schedule valid: cpsat.add_symmetry_breaking), under the rank's memory limit. Its least
span is a lower bound on that rank's span in every schedule of the whole problem.

It is exact where bounds.py's start and end idle only estimate: those fill the round trip at the
start and at the end of the rank separately, each with whatever memory allows at that moment (the
end, for example, with weight passes deferred until then), while here the weights deferred to the end
held memory throughout, and the backwards that could fill the end wait for their own round trips.
On random heterogeneous pipelines at 0.75p this lifted the bound by up to 4% (bench/solve_bench.py,
hetero-random #12 and #16).

The search walks pass orders as a dynamic program over (forwards, backwards, weights done). Each pass
starts as soon as the machine is free and its input is there (delaying a pass never helps: every later
time only grows), so a state is the time the machine is free and the start times of the forwards whose
backward is still to come. A state no earlier in all of these than another of the same counts
is dropped: every continuation of the other finishes no later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

# The search gives up (no bound) past this many states expanded: it stays well under a second per
# rank in CPython. Tight limits keep the state count small (few forwards in flight); a rank with
# room for many, where the start and end idle of bounds.py are already close, may run out.
MAX_EXPANSIONS = 20_000
# Where the limit holds this many round trips' worth of the rank's passes, the walk is skipped: memory
# then rarely holds a forward back, the walk is at its longest, and on the paper's Table 5 profiles and
# the hetero-random instances (0.5p to 2p) it raised no bound there (the largest ratio where it did: 1.54).
AMPLE = 2.0
# States kept per count: past this many, they merge into their earliest corner (see _add).
FRONT_CAP = 8


@dataclass(frozen=True)
class RankPasses:
    """One rank's forward, backward and weight pass: durations, memory taken at the start (alloc) and
    given back at the end (free) of each; the lag from a forward's start to its backward's start; the
    microbatch count and the rank's memory limit (inf for none)."""

    F: float
    B: float
    W: float
    alloc: tuple[float, float, float]
    free: tuple[float, float, float]
    lag: float
    m: int
    cap: float


def least_span(rank: RankPasses, max_expansions: int = MAX_EXPANSIONS, ample: float = AMPLE) -> float | None:
    """The least time from the rank's first forward's start to its last pass's end, or None when the
    search exceeds `max_expansions` states, the limit holds `ample` round trips, or no order fits the
    limit (then nothing is proven)."""
    if _counts_to_walk(rank) > max_expansions:
        return None  # give up at once rather than after walking max_expansions states
    in_flight = rank.cap / rank.alloc[0] if rank.alloc[0] > 0 else math.inf
    if in_flight * (rank.F + rank.B + rank.W) >= ample * (rank.lag + rank.B):
        return None
    return _least_span(rank, max_expansions)


def _counts_to_walk(rank: RankPasses) -> float:
    """How many (forwards, backwards, weights) counts memory lets the search reach, at most: the
    forwards in flight and the weights pending are each capped by the limit."""
    in_flight = rank.cap / rank.alloc[0] if rank.alloc[0] > 0 else math.inf
    held = rank.alloc[0] - rank.free[1]  # what a microbatch awaiting only its weight pass holds
    pending = rank.cap / held if held > 0 else math.inf
    return (rank.m + 1) * (min(in_flight, rank.m) + 1) * (min(pending, rank.m) + 1)


@lru_cache(maxsize=4096)
def _least_span(rank: RankPasses, max_expansions: int) -> float | None:
    m, dur = rank.m, (rank.F, rank.B, rank.W)
    net = tuple(a - f for a, f in zip(rank.alloc, rank.free))
    layer: dict[tuple[int, int, int], list[tuple[float, tuple[float, ...]]]] = {(0, 0, 0): [(0.0, ())]}
    expanded = 0
    for _ in range(3 * m):
        nxt: dict[tuple[int, int, int], list[tuple[float, tuple[float, ...]]]] = {}
        for counts, front in layer.items():
            expanded += len(front)
            if expanded > max_expansions:
                return None
            for t, starts in front:
                for key, state in _moves(rank, counts, t, starts, dur, net):
                    _add(nxt.setdefault(key, []), state)
        layer = nxt
    # No order fits when the limit holds less than one microbatch's passes run apart (a fused backward
    # may still fit, which these passes do not model): then nothing is proven here.
    return min((t for front in layer.values() for t, _ in front), default=None)


def _moves(rank: RankPasses, counts: tuple[int, int, int], t: float, starts: tuple[float, ...],
           dur: tuple[float, float, float], net: tuple[float, ...]):
    """The states one more pass leads to: the next forward (if memory allows), the next backward (its
    input back after `lag`), the next weight pass (its backward is done, on this machine)."""
    f, b, w = counts
    level = f * net[0] + b * net[1] + w * net[2]
    for kind, ready in ((0, f < rank.m), (1, b < f), (2, w < b)):
        # Memory only changes at a pass's start (alloc) and end (free), and runs one pass at a time.
        if not ready or level + rank.alloc[kind] > rank.cap or level + net[kind] > rank.cap:
            continue
        if kind == 0:
            yield (f + 1, b, w), (t + dur[0], starts + (t,))
        elif kind == 1:
            begin = max(t, starts[0] + rank.lag)
            yield (f, b + 1, w), (begin + dur[1], starts[1:])
        else:
            yield (f, b, w + 1), (t + dur[2], starts)


def _add(front: list[tuple[float, tuple[float, ...]]], state: tuple[float, tuple[float, ...]]) -> None:
    """Keep `front` the states no other one dominates (no later in time and in every forward's start)."""
    t, starts = state
    for t2, s2 in front:
        if t2 <= t and all(x <= y for x, y in zip(s2, starts)):
            return
    front[:] = [(t2, s2) for t2, s2 in front if not (t <= t2 and all(y <= x for x, y in zip(s2, starts)))]
    front.append(state)
    if len(front) > FRONT_CAP:
        # One state no later than any of them in every coordinate: it may not exist, so the search
        # is from here on a relaxation (its result still a lower bound), and the walk stays short.
        front[:] = [(min(t2 for t2, _ in front), tuple(map(min, *(s2 for _, s2 in front))) if starts else ())]
