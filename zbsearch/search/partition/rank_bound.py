"""The bound of one rank for one split of the layers (times per microbatch; m microbatches): what the
bounds over every split (bounds.py, interleaved.py) minimise or relax. Each rank r obeys bounds that
depend only on its own layers and on the layers before and after them on the route:

- work: the rank runs its passes one at a time, so it is busy m * (F + B + W) of its layers.
- memory-forced idle: from its first forward to its first backward the rank can only run forwards,
  and no memory is freed before that backward, so only as many as its activation room holds; the
  first backward cannot start before microbatch 0 has gone down the rest of the route and its
  gradient has come back to the rank's last chunk on the route (forwards and backwards of the later
  layers, one hop per rank crossing). The rank's span is at least that wait plus the work it could
  not do during it. On the V-shape the up chunk's forwards count only from when microbatch 0 reaches
  it: a rank 0 holding the embedding and the head can run little but embedding forwards until then.
- memory-time: a microbatch's activations on a chunk stay from the start of its F to the end of its
  B, at least the forwards and backwards of the chunk and every later layer of the route and each
  rank crossing on the way there and back; under the paper's memory model mem_W of them stays until
  the chunk's W has run too. At most the rank's activation room is held at once, so its span is at
  least m * sum(held memory * hold) / room.
- head (makespan only): nothing runs on rank r before microbatch 0's forwards of the earlier layers.
- backward chain (makespan only): once the rank has done all its forwards and backwards (the last
  of them a B of its first chunk on the route), that microbatch's gradient still crosses every
  earlier layer, and rank 0 then runs the weight gradient of layer 0.

Times are at their least: a W counts what a fused backward leaves after B when that is shorter.

The same rank bound serves every one-route placement (chunks_bound): a rank's chunks in route order,
a hop for each rank crossing on the route (every chunk boundary on the interleaved placement; all but
the turn on the V-shape).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ...core.ir import Placement
from ...core.layers import Layer
from ...core.objective import Objective
from ..bounds.analytic import blocks_that_fit, forwards_that_start, most_that_fits
from ..budget import BUDGET, Budget

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class DoneCache(Generic[K, T]):
    """The last `size` answers of a computation that may be cut short at a deadline, kept only when it
    finished: the search's seed and its final bound read the same one, and a later call with more time
    tries again what an earlier one could not finish. `run(key, deadline)` gives (answer, finished)."""

    def __init__(self, run: Callable[[K, float | None], tuple[T, bool]], size: int = 16) -> None:
        self.run, self.size = run, size
        # By the key's hash, with the key: evicting the oldest then hashes no old key again (a key holds
        # the layers and a Budget, whose hash reads every field of a budget another search passed).
        self.done: dict[int, tuple[K, T]] = {}

    def __call__(self, key: K, deadline: float | None) -> tuple[T, bool]:
        digest = hash(key)
        found = self.done.get(digest)
        if found is not None and found[0] == key:
            return found[1], True
        answer, finished = self.run(key, deadline)
        if finished:
            if len(self.done) >= self.size:
                del self.done[next(iter(self.done))]
            self.done[digest] = (key, answer)
        return answer, finished


@dataclass(frozen=True)
class SplitBoundInput:
    """What the bound reads: the layers, the pipeline, the memory rule, and the budget whose caps
    bound the exact fills and the interleaved relaxations' enumerations."""

    layers: tuple[Layer, ...]
    placement: Placement
    microbatches: int
    objective: Objective
    min_hop: float  # the cheapest hop between two ranks
    byte_cap: float | None  # whole-rank cap (static + activations) of a byte limit; None: see multiple
    multiple: float | None  # N of an `Np` limit (activation room = N * p * the rank's mem_B); None: no limit
    paper_memory: bool = True  # the paper's memory model, where a chunk holds the sum of its layers' mem_W
    budget: Budget = BUDGET

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", Objective.parse(self.objective))


class LayerSums:
    """Prefix sums of the layers' F, B, W, work, mem_B, mem_W and static bytes; W at its least (what a
    fused backward leaves after B, when that is shorter than W), so the bounds hold for fused schedules."""

    def __init__(self, layers: Sequence[Layer]) -> None:
        self.n = len(layers)
        self.pre: dict[str, list[float]] = {f: [0.0] for f in ("F", "B", "W", "work", "mem_B", "mem_W", "static_bytes")}
        for layer in layers:
            w = min(layer.W, max(0.0, layer.BW - layer.B))
            values = {"F": layer.F, "B": layer.B, "W": w, "work": layer.F + layer.B + w, "mem_B": layer.mem_B,
                      "mem_W": min(layer.mem_W, layer.mem_B), "static_bytes": layer.static_bytes}
            for f, value in values.items():
                self.pre[f].append(self.pre[f][-1] + value)
        self.w0 = self("W", 0, 1) if layers else 0.0

    def __call__(self, field: str, i: int, j: int) -> float:
        return self.pre[field][j] - self.pre[field][i]


def _room(s: LayerSums, data: SplitBoundInput, ranges: Sequence[tuple[int, int]]) -> float:
    """Activation room of a rank holding these layer ranges (inf: no limit)."""
    if data.byte_cap is not None:
        return data.byte_cap - sum(s("static_bytes", i, j) for i, j in ranges)
    if data.multiple is not None:
        return data.multiple * data.placement.num_ranks * sum(s("mem_B", i, j) for i, j in ranges)
    return math.inf


def _memory_time(s: LayerSums, data: SplitBoundInput, ranges: Sequence[tuple[int, int]], hops: Sequence[int]) -> float:
    """The shortest span in which a rank's activations fit its room (see the module's docstring): each
    range is one chunk, `hops[k]` rank crossings before the route's end, waited for once each way."""
    room = _room(s, data, ranges)
    if math.isinf(room):
        return 0.0
    held = sum(_held(s, data, i, j, h) for (i, j), h in zip(ranges, hops))
    return math.inf if room <= 0 else data.microbatches * held / room


def _held(s: LayerSums, data: SplitBoundInput, i: int, j: int, hops: int) -> float:
    """Memory-time of one microbatch's activations on a chunk of layers i..j-1: mem_B from its F's start
    to its B's end, the rest of the route down and back; under the paper's model mem_W of it stays
    until its W has run too."""
    if i >= j:
        return 0.0
    to_b = s("F", i, s.n) + s("B", i, s.n) + 2 * hops * data.min_hop
    return s("mem_B", i, j) * to_b + (s("mem_W", i, j) * s("W", i, j) if data.paper_memory else 0.0)


def _in_flight(s: LayerSums, data: SplitBoundInput, i: int, j: int) -> float:
    """How many microbatches' activations rank layers i..j-1 can hold before any backward frees one."""
    mem, room = s("mem_B", i, j), _room(s, data, [(i, j)])
    if mem <= 0 or math.isinf(room):
        return math.inf
    return max(0.0, math.floor(room / mem * (1 + 1e-9)))


def linear_rank(s: LayerSums, data: SplitBoundInput, r: int, i: int, j: int) -> float:
    """The bound of rank r holding layers i..j-1 of a one-chunk-per-rank pipeline."""
    m, p, hop = data.microbatches, data.placement.num_ranks, data.min_hop
    work, F = s("work", i, j), s("F", i, j)
    k = min(m, _in_flight(s, data, i, j))
    if k < 1:
        return math.inf  # nothing fits: no schedule of this split exists
    wait = F + s("F", j, s.n) + s("B", j, s.n) + 2 * (p - 1 - r) * hop
    span = max(m * work, wait + m * work - k * F, _memory_time(s, data, [(i, j)], [p - 1 - r]))
    if data.objective is not Objective.MAKESPAN:
        return span
    head = s("F", 0, i) + r * hop
    chain = head + m * (F + s("B", i, j)) + s("B", 0, i) + r * hop + (s.w0 if r > 0 else 0.0)
    return max(head + span, chain)


def v_chunks(s: LayerSums, data: SplitBoundInput, r: int, ranges: list[tuple[int, int]]) -> float:
    """The bound of V rank r holding its down chunk ranges[0] and its up chunk ranges[1]."""
    return chunks_bound(s, data, r, ranges, (r, 2 * data.placement.num_ranks - 1 - r))


@functools.lru_cache(maxsize=64)
def crossings_to(placement: Placement) -> tuple[int, ...]:
    """Rank crossings on the (one) route from its start to each position: a hop is paid only where
    consecutive chunks sit on different ranks (not at the V's turn)."""
    route, rank = placement.routes[0], placement.chunk_to_rank
    out = [0]
    for a, b in itertools.pairwise(route):
        out.append(out[-1] + (rank[a] != rank[b]))
    return tuple(out)


def chunks_bound(s: LayerSums, data: SplitBoundInput, r: int, ranges: Sequence[tuple[int, int]],
                 positions: Sequence[int]) -> float:
    """The bound of rank r of a one-route placement holding the layer ranges `ranges` as the chunks at
    route `positions` (in route order; the V-shape's two, or interleaved's v)."""
    m, hop = data.microbatches, data.min_hop
    cross = crossings_to(data.placement)
    to_end = [cross[-1] - cross[k] for k in positions]  # crossings from each chunk to the route's end
    (first, _), (_, last_end) = ranges[0], ranges[-1]
    work = sum(s("work", i, j) for i, j in ranges)
    room = _room(s, data, ranges)
    mems = [s("mem_B", i, j) for i, j in ranges]
    if room < sum(mems):
        return math.inf  # not even one microbatch fits beside the static bytes
    # Before its first backward (its last chunk's, once microbatch 0 has gone down the whole route and
    # its gradient back to that chunk) the rank runs forwards only, as many as its room holds.
    forwards = [s("F", i, j) for i, j in ranges]
    wait = s("F", first, s.n) + s("B", last_end, s.n) + (to_end[0] + to_end[-1]) * hop
    span = max(m * work, _memory_time(s, data, ranges, to_end),
               m * work + _round_trip_idle(s, data, ranges, 2 * to_end[0], room))
    # A later chunk's first forward comes only once microbatch 0 has gone down the layers between, so
    # only its forwards that start before the backward count.
    counts = [m] + [forwards_that_start(wait, s("F", first, i) + (cross[k] - cross[positions[0]]) * hop, f, m)
                    for (i, _), k, f in zip(ranges[1:], positions[1:], forwards[1:])]
    # The fill is at least one chunk's forwards alone; the exact one (whole microbatches of each
    # chunk) only where that can make the wait bind: this runs for every rank the walks visit.
    items, slack = list(zip(mems, forwards, counts)), room * (1 + 1e-9)
    alone = max(f * (n if math.isinf(slack) else blocks_that_fit(slack, mem, n)) for mem, f, n in items)
    if wait + m * work - alone > span:
        span = max(span, wait + m * work - most_that_fits(slack, items, data.budget.exact_combinations))
    if data.objective is not Objective.MAKESPAN:
        return span
    before = cross[positions[0]]  # crossings before the rank's first chunk
    head = s("F", 0, first) + before * hop
    # The rank's last forward or backward is a B of its first chunk (every later pass of that microbatch
    # on the rank comes before it on the way back); its gradient then crosses the layers before the
    # chunk, and rank 0 runs layer 0's W.
    chain = head + m * (sum(forwards) + sum(s("B", i, j) for i, j in ranges)) + s("B", 0, first) \
        + before * hop + (s.w0 if positions[0] > 0 else 0.0)
    return max(head + span, chain)


def _round_trip_idle(s: LayerSums, data: SplitBoundInput, ranges: Sequence[tuple[int, int]], crossings: int,
                     room: float) -> float:
    """Idle the rank's first chunk on the route forces: until that chunk's first B nothing of it is
    freed, so at most room / its mem_B microbatches have started there, and each brings the rank only
    its F there and its passes on the rank's later chunks; that B starts a whole round trip (every
    later layer's F and B, each rank crossing twice) after the rank's first F."""
    (i, j), later = ranges[0], ranges[1:]
    mem = s("mem_B", i, j)
    if math.isinf(room) or mem <= 0:
        return 0.0
    k = min(data.microbatches, math.floor(room / mem * (1 + 1e-9)))
    trip = s("F", i, s.n) + s("B", j, s.n) + crossings * data.min_hop  # to the start of its first B
    return trip - k * (s("F", i, j) + sum(s("work", a, b) for a, b in later))


def one_stage_per_rank(placement: Placement) -> bool:
    return len(placement.routes) == 1 and placement.num_chunks == placement.num_ranks


def rank_positions(placement: Placement, r: int) -> tuple[int, ...]:
    """Route positions of rank r's chunks, in route order (one-route placements)."""
    route = placement.routes[0]
    return tuple(sorted(route.index(c) for c in placement.chunks_on(r)))
