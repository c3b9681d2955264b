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

Each DP may be given a deadline (the search's share for it). Cut short, it still gives a bound over every
split: every split passes through one state of each rank the DP finished, at a cost no more than its own,
so the least cost over the last finished rank's states is at most every split's (and the work floor holds
regardless); it then names no split.

The rank bound itself is rank_bound.py's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from .interleaved import interleaved_least
from .rank_bound import (DoneCache, LayerSums, SplitBoundInput, chunks_bound, linear_rank, one_stage_per_rank, past,
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


def _v_dp(data: SplitBoundInput, deadline: float | None = None) -> tuple[Least, bool]:
    """DP over the middle range left for ranks r..p-1: the least max rank bound, and a split that has
    it (ties: a smaller sum of rank bounds); whether it finished before `deadline` (cut short: the least
    over the last rank finished, see the module)."""
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
                if past(deadline):
                    return Least(min((value for value, _ in best.values()), default=math.inf), None), False
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
    if past(deadline):
        return Least(min((value for value, _ in best.values()), default=math.inf), None), False
    ends = [((max(val, own), total + own), (a, b), cut) for (a, b), (val, total) in best.items()
            for cut in range(a + 1, b) for own in [v_chunks(s, data, p - 1, [(a, cut), (cut, b)])]]
    if not ends or math.isinf(min(ends)[0][0]):
        return Least(math.inf, None), True
    (value, _), last, cut = min(ends)
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
    p, m = data.placement.num_ranks, data.microbatches
    s = LayerSums(data.layers)
    # The heaviest layer at W's least too: a fused backward may run it in less than F + B + W.
    floor = m * max(s.pre["work"][-1] / p, max(s("work", i, i + 1) for i in range(s.n)))
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
