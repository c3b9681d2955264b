"""A lower bound on the objective that holds for every split of the layers on a placement: how far a
plan is from the best plan of any partition, not just of its own.

The bound of a split is the largest rank bound. The smallest of that over all splits is found exactly
by dynamic programming: over prefixes of layers on the linear placement, and over nested layer ranges
on the V-shape (rank r holds the r-th range from the front and the r-th from the back, so what is
left for ranks r+1.. is always one contiguous middle range). On the interleaved placement a rank's v
chunks are spread over the route and no such DP is small, so the bound over every split is the
largest of relaxations, each at most the least split's bound (interleaved.py): whole layers on p
ranks, the least largest head + work (exact for v = 2), and the first and last ranks' own least
bounds. DualPipe gets the work bound over ranks, total work / p and the heaviest layer. Every bound is
also at least total work / p.

The V DP runs under rising caps: a rank's bound is at least m x its work, so under a cap each rank has
only a few layer ranges to try, and a cap either yields the least split (when one stays within it) or
proves every split above it. Near the work floor that is fast: on the 70B-like model of
results/configure.md at p = 16 (82 layers) it finishes in a second, where the plain DP (the last cap,
none) had not finished in 40 s.

Each DP may be given a deadline (the search's share for it). Cut short, it still gives a bound over every
split, and names none: on the linear placement every split passes through one state of each rank the DP
finished, at a cost no more than its own, so the least cost over the last finished rank's states is at
most every split's; on the V-shape, the last cap passed. The work floor holds regardless.

The rank bound itself is rank_bound.py's.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from ..budget import past
from .interleaved import interleaved_least
from .rank_bound import (DoneCache, LayerSums, SplitBoundInput, chunks_bound, linear_rank, one_stage_per_rank,
    rank_positions, v_chunks)


class Least(NamedTuple):
    """What a DP over splits gives: the least max rank bound (or, cut short, a bound below it) and a split
    that has it (None when cut short, or when no split fits)."""

    value: float
    split: tuple[int, ...] | None


def _linear_dp(data: SplitBoundInput, deadline: float | None = None) -> tuple[Least, bool]:
    """DP over (rank, layers used): the least max rank bound, and a split that has it (among those, a
    smaller sum of rank bounds first: a tie-break for the seed it gives the search); whether it finished
    before `deadline` (cut short: the least over the last rank finished, see the module)."""
    s, p = LayerSums(data.layers), data.placement.num_ranks
    n = s.n
    best: list[tuple[float, float]] = [(math.inf, math.inf)] * (n + 1)
    best[0] = (0.0, 0.0)
    parents: list[list[int]] = []
    for r in range(p):
        if past(deadline):
            return Least(min(value for value, _ in best), None), False
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
        return Least(math.inf, None), True
    cuts, j = [n], n
    for parent in reversed(parents):
        j = parent[j]
        cuts.append(j)
    cuts.reverse()
    return Least(best[n][0], tuple(b - a for a, b in zip(cuts, cuts[1:]))), True


def v_rank(s: LayerSums, data: SplitBoundInput, r: int, outer: tuple[int, int], inner: tuple[int, int]) -> float:
    """The bound of V rank r holding layers outer[0]..inner[0]-1 and inner[1]..outer[1]-1. On the last
    rank inner is empty and outer holds both its chunks, cut where the DP does not know: the least
    over every cut."""
    if r < data.placement.num_ranks - 1:
        return v_chunks(s, data, r, [(outer[0], inner[0]), (inner[1], outer[1])])
    a, b = outer
    return min((v_chunks(s, data, r, [(a, cut), (cut, b)]) for cut in range(a + 1, b)), default=math.inf)


# The caps of the V DP, as multiples of the work floor: each either finds the least split (when some split
# stays within it) or proves every split above it; the last, inf, is the plain DP.
V_CAPS = (1 + 1 / 128, 1 + 1 / 64, 1 + 1 / 32, 1 + 1 / 16, 1 + 1 / 8, 1.25, 1.5, 2.0, math.inf)
TOLERANCE = 1e-9  # what the caps' comparisons forgive: sums of floats; pruning less only costs time


def work_floor(s: LayerSums, data: SplitBoundInput) -> float:
    """m x the larger of the work over ranks and the heaviest layer (W at its least: a fused backward may
    run a layer in less than F + B + W): every split's bound is at least this."""
    p, m = data.placement.num_ranks, data.microbatches
    return m * max(s.pre["work"][-1] / p, max((s("work", i, i + 1) for i in range(s.n)), default=0.0))


def _v_dp(data: SplitBoundInput, deadline: float | None = None) -> tuple[Least, bool]:
    """The least max rank bound over V splits, and a split that has it (ties: a smaller sum of rank
    bounds); whether it finished before `deadline`. The DP runs under rising caps (V_CAPS): a rank's bound
    is at least m x its work, so a cap leaves each rank few layer ranges to try and the DP is fast near
    the floor. Cut short, every split is above the last cap passed (or at the floor)."""
    s = LayerSums(data.layers)
    floor = work_floor(s, data)
    proven = floor
    for step in V_CAPS:
        cap = floor * step if floor > 0 else math.inf
        found, finished = _v_dp_capped(data, s, cap, deadline)
        if not finished:
            return Least(proven, None), False
        if found is not None:
            return found, True
        proven = max(proven, cap)
        if math.isinf(cap):
            break
    return Least(math.inf, None), True  # not even the plain DP found a split: none fits


def _v_moves(s: LayerSums, a: int, b: int, left: int, most: float) -> Iterator[tuple[int, int]]:
    """The middle ranges (a2, b2) a V rank holding outer range (a, b) may leave to the `left` ranks after
    it: each of those needs two layers, the rank's own work is at most `most` and theirs at most `left`
    x `most` (DP order: a2 ascending, b2 descending)."""
    work = s.pre["work"]
    for a2 in range(a + 1, b):
        down = work[a2] - work[a]
        if down > most:
            return
        # The largest b2 whose middle range the later ranks can hold, then down while the rank can.
        top = min(b - 1, bisect.bisect_right(work, work[a2] + left * most) - 1)
        for b2 in range(top, a2, -1):
            if b2 - a2 < 2 * left or down + work[b] - work[b2] > most:
                break
            yield a2, b2


def _v_dp_capped(data: SplitBoundInput, s: LayerSums, cap: float, deadline: float | None
                 ) -> tuple[Least | None, bool]:
    """The V DP over the middle range left for ranks r..p-1, only through ranks whose bound is at most
    `cap`: the least max rank bound and a split that has it, None where every split has a rank above the
    cap; whether it finished before `deadline`."""
    p, n = data.placement.num_ranks, s.n
    loose = cap * (1 + TOLERANCE)
    most = loose / data.microbatches if data.microbatches > 0 else math.inf
    # best[(a, b)]: (max, sum) over ranks 0..r-1 when layers a..b-1 are left for ranks r..p-1.
    best: dict[tuple[int, int], tuple[float, float]] = {(0, n): (0.0, 0.0)}
    parents: list[dict[tuple[int, int], tuple[int, int]]] = []
    for r in range(p - 1):
        nxt: dict[tuple[int, int], tuple[float, float]] = {}
        parent: dict[tuple[int, int], tuple[int, int]] = {}
        for (a, b), (val, total) in best.items():
            for a2, b2 in _v_moves(s, a, b, p - 1 - r, most):
                if past(deadline):
                    return None, False
                if val >= nxt.get((a2, b2), (math.inf,))[0]:
                    continue
                own = v_rank(s, data, r, (a, b), (a2, b2))
                cand = (max(val, own), total + own)
                if own <= loose and cand < nxt.get((a2, b2), (math.inf, math.inf)):
                    nxt[(a2, b2)], parent[(a2, b2)] = cand, (a, b)
        best = nxt
        parents.append(parent)
    if past(deadline):
        return None, False
    ends = [((max(val, own), total + own), (a, b), cut) for (a, b), (val, total) in best.items()
            for cut in range(a + 1, b) for own in [v_chunks(s, data, p - 1, [(a, cut), (cut, b)])]]
    (value, _), last, cut = min(ends, default=((math.inf, math.inf), (0, 0), 0))
    if math.isinf(value) or value > cap:  # above the cap within the tolerance only: a pruned split may be less
        return None, True
    outer = [last]
    for parent in reversed(parents):
        outer.append(parent[outer[-1]])
    outer.reverse()
    return Least(value, v_counts(outer, cut, n)), True


def v_counts(outer: Sequence[tuple[int, int]], cut: int, n: int) -> tuple[int, ...]:
    """Layers per route position of a V split from each rank's outer range (a_r, b_r), rank 0 first,
    and the cut between the last rank's two chunks."""
    a = [x for x, _ in outer] + [cut]
    b = [y for _, y in outer]
    p = len(outer)
    down = [a[k + 1] - a[k] for k in range(p)]
    up = [b[p - 1] - cut] + [b[r - 1] - b[r] for r in range(p - 1, 0, -1)]
    return tuple(down + up)


def _placement_dp(data: SplitBoundInput, deadline: float | None) -> tuple[Least | None, bool]:
    if one_stage_per_rank(data.placement):
        return _linear_dp(data, deadline)
    return _v_dp(data, deadline) if data.placement.name == "v" else (None, True)


# The DP of the placement (least max rank bound over every split, and a split that has it); None where no DP
# covers the placement. Kept once finished: the search's seed and its final bound read the same one.
_least = DoneCache(_placement_dp)


def least_bound_split(data: SplitBoundInput, deadline: float | None = None) -> tuple[int, ...] | None:
    """A split whose cheap bound is the least of any (linear and V-shape placements; None otherwise,
    when none fits, or when the DP did not finish by `deadline`): under a tight cap it weighs the idle
    memory forces, which time DPs do not."""
    found, _ = _least(data, deadline)
    return None if found is None else found.split


def any_split_bound(data: SplitBoundInput) -> float:
    """The lower bound on the objective over every split of the layers on the placement (inf when no
    split fits the memory cap)."""
    return cheap_bound(data, None)[0]


def cheap_bound(data: SplitBoundInput, deadline: float | None) -> tuple[float, bool]:
    """any_split_bound, and whether it finished by `deadline`: cut short, it is still a bound over every
    split (see the module), only a weaker one."""
    if data.placement.name == "interleaved" and len(data.placement.routes) == 1:
        return interleaved_least(data, deadline)  # its whole-layer floor holds the one below, at W's least
    floor = work_floor(LayerSums(data.layers), data)
    found, finished = _least(data, deadline)
    return (floor, finished) if found is None else (max(floor, found.value), finished)


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
