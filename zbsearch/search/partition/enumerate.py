"""Tighten the bound over every split by branch and bound: visit the splits whose cheap per-rank bound
(partition/bounds.py) is below the best plan found, and take for each the problem's own analytic bound
(bounds/analytic.py), which sees memory windows the cheap one cannot.

The result is min(incumbent, min over visited splits of their bound, min over the subtrees left
unvisited of their cheap bound): every split is either visited, or pruned because its cheap bound
(a valid bound for it) is no better than a split already counted, or left in a subtree whose cheap
bound is counted. So it stays a lower bound on the best plan of any split, whatever the time budget.

Every step stops at the caller's deadline: the cheap DP (bounds.py, cut short: a weaker bound over every
split), the V walk's table of least suffix bounds (cut short, an entry not computed is the work floor of its
ranks, m x their work / their count, which no rank bound is below: the walk then prunes less but counts
the same) and the walk itself.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass
from typing import Callable

from ...core.ir import Placement
from ...core.memory import byte_cap, p_multiple
from ...core.objective import Objective
from ...core.profile import Profile
from ..budget import BUDGET, Budget, past
from .bounds import cheap_bound, v_counts, v_rank
from .rank_bound import DoneCache, LayerSums, SplitBoundInput, linear_rank, one_stage_per_rank, v_chunks

LeafBound = Callable[[tuple[int, ...]], float]


@dataclass
class _Walk:
    threshold: float  # the best value counted so far (starts at the incumbent)
    deadline: float
    leaves: int = 0
    complete: bool = True

    def out_of_time(self) -> bool:
        if time.monotonic() >= self.deadline:
            self.complete = False
            return True
        return False


def _linear_suffix(s: LayerSums, data: SplitBoundInput,
                   deadline: float | None = None) -> list[list[float]]:
    """suffix[r][i]: the least max cheap bound of ranks r.. over splits of layers i.. among them (cut short
    at `deadline`, the entries not computed hold their ranks' work floor, as _floored)."""
    p, n = data.placement.num_ranks, s.n
    suffix = [[math.inf] * (n + 1) for _ in range(p + 1)]
    suffix[p][n] = 0.0
    for r in range(p - 1, -1, -1):
        ends = [n] if r == p - 1 else range(r + 1, n - (p - 1 - r) + 1)
        for i in range(r, n - (p - 1 - r)):
            if past(deadline):
                suffix[r][i] = data.microbatches * s("work", i, n) / (p - r)
                continue
            suffix[r][i] = min((max(linear_rank(s, data, r, i, j), suffix[r + 1][j]) for j in ends if j > i),
                               default=math.inf)
    return suffix


def linear_refined(data: SplitBoundInput, incumbent: float, leaf: LeafBound, deadline: float) -> tuple[float, int, bool]:
    """(bound, splits visited, whether the walk finished) on the one-chunk-per-rank placement."""
    s, p, n = LayerSums(data.layers), data.placement.num_ranks, len(data.layers)
    suffix = _linear_suffix(s, data, deadline)
    walk = _Walk(incumbent, deadline)

    def visit(r: int, i: int, partial: float, counts: tuple[int, ...]) -> float:
        node = max(partial, suffix[r][i])
        if node >= walk.threshold or walk.out_of_time():
            return node
        if r == p - 1:
            walk.leaves += 1
            value = max(partial, linear_rank(s, data, r, i, n), leaf(counts + (n - i,)))
            walk.threshold = min(walk.threshold, value)
            return value
        children = sorted((max(partial, linear_rank(s, data, r, i, j)), j) for j in range(i + 1, n - (p - 2 - r)))
        return min((visit(r + 1, j, cost, counts + (j - i,)) for cost, j in children), default=math.inf)

    return min(incumbent, visit(0, 0, 0.0, ())), walk.leaves, walk.complete


Suffix = list[dict[tuple[int, int], float]]


def _v_suffix_table(data: SplitBoundInput, deadline: float | None) -> tuple[Suffix, bool]:
    """g[r][(a, b)]: the least max cheap bound of V ranks r.. when layers a..b-1 are left for them; whether
    it finished by `deadline` (cut short, the entries not computed hold their ranks' work floor)."""
    s = LayerSums(data.layers)
    p, n = data.placement.num_ranks, s.n
    g: Suffix = [dict() for _ in range(p)]
    for a in range(n):
        if past(deadline):
            return _floored(s, data, g), False
        for b in range(a + 2, n + 1):
            g[p - 1][(a, b)] = v_rank(s, data, p - 1, (a, b), (b, b))
    for r in range(p - 2, -1, -1):
        need = 2 * (p - 1 - r)
        for a in range(n):
            for b in range(a + 2 + need, n + 1):
                if past(deadline):
                    return _floored(s, data, g), False
                g[r][(a, b)] = min((max(v_rank(s, data, r, (a, b), (a2, b2)), g[r + 1][(a2, b2)])
                                    for a2 in range(a + 1, b) for b2 in range(a2 + need, b)), default=math.inf)
    return g, True


def _floored(s: LayerSums, data: SplitBoundInput, g: Suffix) -> Suffix:
    """`g` with every entry not computed set to m x the work of its layers over its ranks: a rank's bound
    is at least m x its own work, and one of the ranks holds at least their share."""
    p, n = data.placement.num_ranks, s.n
    for r in range(p):
        need = 0 if r == p - 1 else 2 * (p - 1 - r)
        for a in range(n):
            for b in range(a + 2 + need, n + 1):
                g[r].setdefault((a, b), data.microbatches * s("work", a, b) / (p - r))
    return g


# Kept once finished: the walk with the strong split bound reads the table the plain walk built.
_v_suffix = DoneCache(_v_suffix_table, size=4)


def v_refined(data: SplitBoundInput, incumbent: float, leaf: LeafBound, deadline: float,
              strong: LeafBound | None = None) -> tuple[float, int, bool]:
    """(bound, splits visited, whether the walk finished) on the V-shape placement.

    Best first: the open node with the least cheap bound is expanded next, so the bound over every
    split (the least open node, or a visited split's own bound when lower) rises as the walk goes,
    rather than only once a whole subtree is done. With `strong` (a tighter, dearer bound of one
    split), a split goes back on the heap at its own bound and gets the strong one only when it comes
    up again: only the splits that could still set the answer pay for it."""
    s, p, n = LayerSums(data.layers), data.placement.num_ranks, len(data.layers)
    g, _ = _v_suffix(data, deadline)
    walk = _Walk(incumbent, deadline)
    order = itertools.count()
    # (bound, tie, rank, outer range left, max over earlier ranks, earlier outer ranges, apex cut,
    # whether the split's own bound is in `bound` already)
    open_nodes: list[tuple[float, int, int, tuple[int, int], float, tuple[tuple[int, int], ...], int, bool]] = [
        (g[0].get((0, n), math.inf), next(order), 0, (0, n), 0.0, (), 0, False)]
    while open_nodes and open_nodes[0][0] < walk.threshold and not walk.out_of_time():
        node, _, r, (a, b), partial, outer, cut, own = heapq.heappop(open_nodes)
        if cut and strong is not None and not own:
            value = max(node, leaf(v_counts(outer, cut, n)))
            heapq.heappush(open_nodes, (value, next(order), r, (a, b), partial, outer, cut, True))
        elif cut:  # a whole split: its own bound
            walk.leaves += 1
            split = v_counts(outer, cut, n)
            walk.threshold = min(walk.threshold, max(node, (strong or leaf)(split)))
        elif r == p - 1:
            for c in range(a + 1, b):
                value = max(partial, v_chunks(s, data, r, [(a, c), (c, b)]))
                heapq.heappush(open_nodes, (value, next(order), r, (a, b), value, outer + ((a, b),), c, False))
        else:
            need = 2 * (p - 2 - r)
            for a2 in range(a + 1, b):
                for b2 in range(a2 + 2 + need, b):
                    cost = max(partial, v_rank(s, data, r, (a, b), (a2, b2)))
                    child = max(cost, g[r + 1].get((a2, b2), math.inf))
                    if child < walk.threshold:
                        heapq.heappush(open_nodes, (child, next(order), r + 1, (a2, b2), cost, outer + ((a, b),), 0,
                                                    False))
    rest = open_nodes[0][0] if open_nodes else math.inf
    walk.complete = not open_nodes or rest >= walk.threshold
    return min(walk.threshold, rest), walk.leaves, walk.complete


def bound_input(profile: Profile, placement: Placement, mem_limit: str | None, objective: Objective | str,
                headroom: float, budget: Budget = BUDGET) -> SplitBoundInput:
    """What the bound over every split reads, from the strings a user typed (and the budget's caps)."""
    multiple = p_multiple(mem_limit)
    comm = profile.comm if profile.message_time(0.0) is None else tuple(
        profile.message_time(layer.out_bytes) or 0.0 for layer in (profile.layers or ())[:-1])
    return SplitBoundInput(tuple(profile.layers or ()), placement, profile.microbatches, Objective.parse(objective),
                           min(comm, default=0.0), byte_cap(mem_limit, profile, headroom), multiple,
                           profile.memory_model == "paper", budget)


def refined_bound(data: SplitBoundInput, incumbent: float, leaf: LeafBound, deadline: float | None,
                  strong: LeafBound | None = None, walk: bool = True) -> tuple[float, int, bool]:
    """(bound, splits bounded one by one, whether every split was accounted for exactly): the cheap DP
    bound, tightened by the walk until `deadline` when there is one and it is below the incumbent
    (on the V-shape, `strong` is the dearer bound of a split the walk gives only the splits that come
    up at their own bound). With `walk` False the cheap DP alone, stopped at `deadline`. A DP or walk cut
    short at the deadline leaves a weaker bound over every split, and the third item False."""
    found, _ = cheap_bound(data, deadline)
    cheap = min(incumbent, found)
    if deadline is None or not walk or cheap >= incumbent:
        return cheap, 0, cheap >= incumbent
    p = data.placement
    if one_stage_per_rank(p):
        value, visited, complete = linear_refined(data, incumbent, leaf, deadline)
    elif p.name == "v":
        value, visited, complete = v_refined(data, incumbent, leaf, deadline)
        if strong is not None and time.monotonic() < deadline:
            # Again with the strong bound in the time left: both are bounds over every split, so the
            # larger holds; run alone, its dearer splits could leave nodes unexpanded below the first.
            again, more, _ = v_refined(data, incumbent, leaf, deadline, strong)
            value, visited = max(value, again), visited + more
    else:
        return cheap, 0, False
    return max(cheap, value), visited, complete
