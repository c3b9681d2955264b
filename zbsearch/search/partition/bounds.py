"""A lower bound on the objective that holds for every split of the layers on a placement: how far a
plan is from the best plan of any partition, not just of its own.

For one split, each rank r obeys bounds that depend only on its own layers and on the layers before
and after them on the route (times per microbatch; m microbatches):

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

The bound of a split is the largest rank bound. The smallest of that over all splits is found exactly
by dynamic programming: over prefixes of layers on the linear placement, and over nested layer ranges
on the V-shape (rank r holds the r-th range from the front and the r-th from the back, so what is
left for ranks r+1.. is always one contiguous middle range). On the interleaved placement a rank's v
chunks are spread over the route and no such DP is small, so the bound over every split is the
largest of relaxations, each at most the least split's bound (_interleaved_least): whole layers on p
ranks, the least largest head + work (exact for v = 2), and the first and last ranks' own least
bounds. DualPipe gets the work bound over ranks, total work / p and the heaviest layer. Every bound is
also at least total work / p.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ...core.ir import Placement
from ...core.layers import Layer
from ..bounds.analytic import blocks_that_fit, forwards_that_start, most_that_fits
from ...core.objective import Objective
from ..budget import BUDGET


@dataclass(frozen=True)
class SplitBoundInput:
    """What the bound reads: the layers, the pipeline and the memory rule."""

    layers: tuple[Layer, ...]
    placement: Placement
    microbatches: int
    objective: Objective
    min_hop: float  # the cheapest hop between two ranks
    byte_cap: float | None  # whole-rank cap (static + activations) of a byte limit; None: see multiple
    multiple: float | None  # N of an `Np` limit (activation room = N * p * the rank's mem_B); None: no limit
    paper_memory: bool = True  # the paper's memory model, where a chunk holds the sum of its layers' mem_W

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


def _linear_dp(data: SplitBoundInput) -> tuple[float, tuple[int, ...] | None]:
    """DP over (rank, layers used): the least max rank bound, and a split that has it (among those, a
    smaller sum of rank bounds first: a tie-break for the seed it gives the search)."""
    s, p = LayerSums(data.layers), data.placement.num_ranks
    n = s.n
    best: list[tuple[float, float]] = [(math.inf, math.inf)] * (n + 1)
    best[0] = (0.0, 0.0)
    parents: list[list[int]] = []
    for r in range(p):
        nxt, parent = [(math.inf, math.inf)] * (n + 1), [-1] * (n + 1)
        for j in ([n] if r == p - 1 else range(r + 1, n - (p - 1 - r) + 1)):
            for i in range(r, j):
                if best[i][0] < nxt[j][0]:
                    own = linear_rank(s, data, r, i, j)
                    cand = (max(best[i][0], own), best[i][1] + own)
                    if cand < nxt[j]:
                        nxt[j], parent[j] = cand, i
        best = nxt
        parents.append(parent)
    if math.isinf(best[n][0]):
        return math.inf, None
    cuts, j = [n], n
    for parent in reversed(parents):
        j = parent[j]
        cuts.append(j)
    cuts.reverse()
    return best[n][0], tuple(b - a for a, b in zip(cuts, cuts[1:]))


def v_rank(s: LayerSums, data: SplitBoundInput, r: int, outer: tuple[int, int], inner: tuple[int, int]) -> float:
    """The bound of V rank r holding layers outer[0]..inner[0]-1 and inner[1]..outer[1]-1. On the last
    rank inner is empty and outer holds both its chunks, cut where the DP does not know: the least
    over every cut."""
    if r < data.placement.num_ranks - 1:
        return v_chunks(s, data, r, [(outer[0], inner[0]), (inner[1], outer[1])])
    a, b = outer
    return min((v_chunks(s, data, r, [(a, cut), (cut, b)]) for cut in range(a + 1, b)), default=math.inf)


def v_chunks(s: LayerSums, data: SplitBoundInput, r: int, ranges: list[tuple[int, int]]) -> float:
    """The bound of V rank r holding its down chunk ranges[0] and its up chunk ranges[1]."""
    return chunks_bound(s, data, r, ranges, (r, 2 * data.placement.num_ranks - 1 - r))


@functools.lru_cache(maxsize=64)
def _crossings_to(placement: Placement) -> tuple[int, ...]:
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
    cross = _crossings_to(data.placement)
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
        span = max(span, wait + m * work - most_that_fits(slack, items))
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


def _round_trip_idle(s: LayerSums, data: SplitBoundInput, ranges: list[tuple[int, int]], crossings: int,
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


def _v_dp(data: SplitBoundInput) -> tuple[float, tuple[int, ...] | None]:
    """DP over the middle range left for ranks r..p-1: the least max rank bound, and a split that has
    it (ties: a smaller sum of rank bounds)."""
    s, p = LayerSums(data.layers), data.placement.num_ranks
    n = s.n
    # best[(a, b)]: (max, sum) over ranks 0..r-1 when layers a..b-1 are left for ranks r..p-1.
    best: dict[tuple[int, int], tuple[float, float]] = {(0, n): (0.0, 0.0)}
    parents: list[dict[tuple[int, int], tuple[int, int]]] = []
    for r in range(p - 1):
        nxt: dict[tuple[int, int], tuple[float, float]] = {}
        parent: dict[tuple[int, int], tuple[int, int]] = {}
        left = p - 1 - r  # ranks after r, each needing two layers (one per chunk)
        for (a, b), (val, total) in best.items():
            for a2 in range(a + 1, b):
                for b2 in range(b - 1, a2, -1):
                    if b2 - a2 < 2 * left:
                        break
                    if val >= nxt.get((a2, b2), (math.inf,))[0]:
                        continue
                    own = v_rank(s, data, r, (a, b), (a2, b2))
                    cand = (max(val, own), total + own)
                    if cand < nxt.get((a2, b2), (math.inf, math.inf)):
                        nxt[(a2, b2)], parent[(a2, b2)] = cand, (a, b)
        best = nxt
        parents.append(parent)
    ends = [((max(val, own), total + own), (a, b), cut) for (a, b), (val, total) in best.items()
            for cut in range(a + 1, b) for own in [v_chunks(s, data, p - 1, [(a, cut), (cut, b)])]]
    if not ends or math.isinf(min(ends)[0][0]):
        return math.inf, None
    (value, _), last, cut = min(ends)
    outer = [last]
    for parent in reversed(parents):
        outer.append(parent[outer[-1]])
    outer.reverse()
    return value, v_counts(outer, cut, n)


def v_counts(outer: Sequence[tuple[int, int]], cut: int, n: int) -> tuple[int, ...]:
    """Layers per route position of a V split from each rank's outer range (a_r, b_r), rank 0 first,
    and the cut between the last rank's two chunks."""
    a = [x for x, _ in outer] + [cut]
    b = [y for _, y in outer]
    p = len(outer)
    down = [a[k + 1] - a[k] for k in range(p)]
    up = [b[p - 1] - cut] + [b[r - 1] - b[r] for r in range(p - 1, 0, -1)]
    return tuple(down + up)


def one_stage_per_rank(placement: Placement) -> bool:
    return len(placement.routes) == 1 and placement.num_chunks == placement.num_ranks


def rank_positions(placement: Placement, r: int) -> tuple[int, ...]:
    """Route positions of rank r's chunks, in route order (one-route placements)."""
    route = placement.routes[0]
    return tuple(sorted(route.index(c) for c in placement.chunks_on(r)))


@functools.lru_cache(maxsize=16)
def _least(data: SplitBoundInput) -> tuple[float, tuple[int, ...] | None] | None:
    """The DP of the placement (least max rank bound over every split, and a split that has it); None
    where no DP covers the placement. Cached: the search's seed and its final bound read the same one."""
    if one_stage_per_rank(data.placement):
        return _linear_dp(data)
    return _v_dp(data) if data.placement.name == "v" else None


def least_bound_split(data: SplitBoundInput) -> tuple[int, ...] | None:
    """A split whose cheap bound is the least of any (linear and V-shape placements; None otherwise,
    or when none fits): under a tight cap it weighs the idle memory forces, which time DPs do not."""
    found = _least(data)
    return None if found is None else found[1]


def any_split_bound(data: SplitBoundInput) -> float:
    """The lower bound on the objective over every split of the layers on the placement (inf when no
    split fits the memory cap)."""
    if data.placement.name == "interleaved" and len(data.placement.routes) == 1:
        return _interleaved_least(data)  # its whole-layer floor holds the one below, at W's least
    p, m = data.placement.num_ranks, data.microbatches
    s = LayerSums(data.layers)
    floor = m * max(s.pre["work"][-1] / p, max(layer.work for layer in data.layers))
    found = _least(data)
    return floor if found is None else max(floor, found[0])


def split_bound(data: SplitBoundInput, counts: Sequence[int]) -> float:
    """The cheap bound of one split (layers per chunk in route order): the largest of its ranks'
    bounds, what the DPs above minimise (linear, V) and the interleaved bound relaxes; on DualPipe total
    work / p."""
    s, p = LayerSums(data.layers), data.placement.num_ranks
    edges = [0]
    for c in counts:
        edges.append(edges[-1] + c)
    floor = data.microbatches * s.pre["work"][-1] / p
    if one_stage_per_rank(data.placement):
        return max([floor] + [linear_rank(s, data, r, edges[r], edges[r + 1]) for r in range(p)])
    if data.placement.name not in ("v", "interleaved") or len(data.placement.routes) != 1:
        return floor  # other placements: only the work over ranks
    ranks = [chunks_bound(s, data, r, [(edges[k], edges[k + 1]) for k in pos], pos)
             for r in range(p) for pos in [rank_positions(data.placement, r)]]
    return max([floor] + ranks)


@functools.lru_cache(maxsize=16)
def _interleaved_least(data: SplitBoundInput) -> float:
    """A bound over every split of an interleaved placement (no exact DP: a rank's load is v chunks
    spread over the route). The largest of three relaxations, each at most the least split's bound:

    - whole layers: some rank holds ceil(q/p) of the q heaviest layers, for every q (m x that work);
    - with two chunks per rank, head + work: the least over every split of the largest rank's
      head + m * work, exactly (_two_round_bound), where the layers are few enough;
    - the first and the last rank: the least cheap bound of that rank over every chunk ranges it can
      hold, where there are few enough to try (_end_rank_least).
    Cached: the search and its final bound read the same one."""
    s, p = LayerSums(data.layers), data.placement.num_ranks
    if s.n < data.placement.num_chunks:
        return 0.0  # no split at all: nothing to bound
    floor = data.microbatches * max(s.pre["work"][-1] / p, _heaviest_layers(s, p))
    bounds = [floor, _end_rank_least(s, data, 0), _end_rank_least(s, data, p - 1)]
    if data.placement.chunks_per_rank == 2:
        bounds.append(_two_round_bound(s, data, floor))
    return max(bounds)


def _heaviest_layers(s: LayerSums, p: int) -> float:
    """The least largest rank work (one microbatch) over every assignment of whole layers to p ranks,
    contiguous or not: of the q heaviest layers some rank holds ceil(q/p), at least the ceil(q/p)
    lightest of them."""
    works = sorted((s("work", i, i + 1) for i in range(s.n)), reverse=True)
    return max((sum(works[q - math.ceil(q / p):q]) for q in range(1, s.n + 1)), default=0.0)


def head_and_work(s: LayerSums, data: SplitBoundInput, counts: Sequence[int]) -> float:
    """The largest over ranks of one split's head (makespan only) + m * work: what _two_round_bound
    minimises, at most the split's cheap bound."""
    edges = [0, *itertools.accumulate(counts)]
    cross = _crossings_to(data.placement)
    out = 0.0
    for r in range(data.placement.num_ranks):
        pos = rank_positions(data.placement, r)
        head = s("F", 0, edges[pos[0]]) + cross[pos[0]] * data.min_hop if data.objective is Objective.MAKESPAN \
            else 0.0
        out = max(out, head + data.microbatches * sum(s("work", edges[k], edges[k + 1]) for k in pos))
    return out


def _two_round_bound(s: LayerSums, data: SplitBoundInput, floor: float) -> float:
    """v = 2: the least over every split of head_and_work (0 where the layers are too many for the
    budget), by bisection on T from `floor` (at most that least) with an exact feasibility test.

    A split is its cuts e_0 = 0 < e_1 < ... < e_2p = n; rank r holds e_r..e_r+1 and e_p+r..e_p+r+1.
    With mid = e_p fixed, the state after rank r is (a, b) = (e_r+1, e_p+r+1), and rank r's term
    head(a') + m * (A(a) - A(a') + A(b) - A(b')) (A: prefix work) from the state (a', b') before is at
    most T iff m * A(a') + m * A(b') - head(a') >= m * A(a) + m * A(b) - T: a state is reachable iff a
    2-D prefix maximum over the reachable states before passes that test. Every mid at once: arrays
    over (mid, a, b), p * (n-2p+1) * (n-p+1)^2 cells a test."""
    m, p, n = data.microbatches, data.placement.num_ranks, s.n
    # Only cuts some split has: mid in p..n-p, a in 0..n-p, b in p..n.
    mids, cuts_a, cuts_b = np.arange(p, n - p + 1), np.arange(n - p + 1), np.arange(p, n + 1)
    if p * len(mids) * len(cuts_a) * len(cuts_b) > BUDGET.two_round_cells:
        return 0.0
    work = m * np.array(s.pre["work"])
    cross = _crossings_to(data.placement)
    makespan = data.objective is Objective.MAKESPAN
    mid, a, b = mids[:, None, None], cuts_a[None, :, None], cuts_b[None, None, :]
    # What each rank's state offers the next (the same for every mid) and the test's right side.
    offer = [work[a] + work[b] - (np.array(s.pre["F"])[a] + cross[r] * data.min_hop if makespan else 0.0)
             for r in range(p)]
    need = work[a] + work[b]
    inside = a <= mid  # the first round ends at mid
    start = (a == 0) & (b == mid)
    tol = 1e-9 * (work[-1] + s.pre["F"][-1] + 1.0)  # generous: a lower T passes, the bound stays valid

    def feasible(t: float) -> bool:
        reach = start
        for r in range(p):
            best = np.maximum.accumulate(np.maximum.accumulate(np.where(reach, offer[r], -np.inf), axis=1), axis=2)
            earlier = np.full(best.shape, -np.inf)
            earlier[:, 1:, 1:] = best[:, :-1, :-1]  # strictly earlier cuts: every chunk holds a layer
            reach = (earlier >= need - t - tol) & inside
            if not reach.any():
                return False
        return bool(reach[np.arange(len(mids)), mids, -1].any())  # the first round ends at mid, the second at n

    even = [n // (2 * p) + (k < n % (2 * p)) for k in range(2 * p)]
    lo, hi = floor, head_and_work(s, data, even)  # the least is at least the floor, at most any split's
    while hi - lo > 1e-9 * hi:
        t = (lo + hi) / 2
        lo, hi = (lo, t) if feasible(t) else (t, hi)
    return lo  # the floor or a T that fails: at most the least


def _rank_ranges(n: int, p: int, v: int, r: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every tuple of layer ranges rank r's v chunks (route positions r + k * p) take in some split of
    n layers into v * p non-empty chunks: r chunks before its first, p - 1 between, p - 1 - r after."""
    def extend(k: int, prev: int, acc: tuple[tuple[int, int], ...]) -> Iterator[tuple[tuple[int, int], ...]]:
        if k == v:
            yield acc
            return
        between = r if k == 0 else p - 1
        after = v * p - 1 - (r + k * p)
        starts = range(prev + between, n - after) if between else [prev]
        for i in starts:
            ends = [n] if after == 0 else range(i + 1, n - after + 1)
            for j in ends:
                yield from extend(k + 1, j, acc + ((i, j),))
    return extend(0, 0, ())


def _end_rank_least(s: LayerSums, data: SplitBoundInput, r: int) -> float:
    """The least cheap bound of rank r over every chunk ranges it can hold (0 when there are more than
    the budget's: a bound must not come from part of them)."""
    p, v = data.placement.num_ranks, data.placement.chunks_per_rank
    choices = list(itertools.islice(_rank_ranges(s.n, p, v, r), BUDGET.end_rank_ranges + 1))
    if len(choices) > BUDGET.end_rank_ranges:
        return 0.0
    pos = rank_positions(data.placement, r)
    return min((chunks_bound(s, data, r, ranges, pos) for ranges in choices), default=0.0)
