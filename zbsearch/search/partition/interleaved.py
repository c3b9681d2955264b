"""The bound over every split of the layers on an interleaved placement. A rank's v chunks are spread
over the route, so no dynamic program over splits is small (linear and V-shape have exact ones,
bounds.py); the bound is the largest of relaxations, each at most the least split's bound: whole layers
on p ranks, the least largest head + work (exact for v = 2), and the first and last ranks' own least
bounds (rank_bound.py). Each may be cut short at a deadline and still be a bound: the bisection keeps
a T that fails (or the floor), the end ranks count only when every range was tried."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from ...core.objective import Objective
from ..budget import past
from .rank_bound import DoneCache, LayerSums, SplitBoundInput, chunks_bound, crossings_to, rank_positions


def interleaved_least(data: SplitBoundInput, deadline: float | None = None) -> tuple[float, bool]:
    """_interleaved_least, and whether it finished by `deadline`. Kept once finished: the search and its
    final bound read the same one."""
    return _finished(data, deadline)


def _interleaved_least(data: SplitBoundInput, deadline: float | None) -> tuple[float, bool]:
    """A bound over every split of an interleaved placement (no exact DP: a rank's load is v chunks
    spread over the route). The largest of three relaxations, each at most the least split's bound:

    - whole layers: some rank holds ceil(q/p) of the q heaviest layers, for every q (m x that work);
    - with two chunks per rank, head + work: the least over every split of the largest rank's
      head + m * work, exactly (_two_round_bound), where the layers are few enough;
    - the first and the last rank: the least cheap bound of that rank over every chunk ranges it can
      hold, where there are few enough to try (_end_rank_least).
    Cut short at `deadline`, a relaxation not finished counts for nothing (or, the bisection, what it
    has proven); the largest of the others still holds."""
    s, p = LayerSums(data.layers), data.placement.num_ranks
    if s.n < data.placement.num_chunks:
        return 0.0, True  # no split at all: nothing to bound
    floor = data.microbatches * max(s.pre["work"][-1] / p, _heaviest_layers(s, p))
    bounds = [floor, _end_rank_least(s, data, 0, deadline), _end_rank_least(s, data, p - 1, deadline)]
    if data.placement.chunks_per_rank == 2:
        bounds.append(_two_round_bound(s, data, floor, deadline))
    return max(bounds), not past(deadline)


_finished = DoneCache(_interleaved_least)


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
    cross = crossings_to(data.placement)
    out = 0.0
    for r in range(data.placement.num_ranks):
        pos = rank_positions(data.placement, r)
        head = s("F", 0, edges[pos[0]]) + cross[pos[0]] * data.min_hop if data.objective is Objective.MAKESPAN \
            else 0.0
        out = max(out, head + data.microbatches * sum(s("work", edges[k], edges[k + 1]) for k in pos))
    return out


def _two_round_bound(s: LayerSums, data: SplitBoundInput, floor: float, deadline: float | None = None) -> float:
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
    if p * len(mids) * len(cuts_a) * len(cuts_b) > data.budget.two_round_cells:
        return 0.0
    work = m * np.array(s.pre["work"])
    cross = crossings_to(data.placement)
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
    while hi - lo > 1e-9 * hi and not past(deadline):
        t = (lo + hi) / 2
        lo, hi = (lo, t) if feasible(t) else (t, hi)
    return lo  # the floor or a T that fails: at most the least (also when cut short at the deadline)


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


def _end_rank_least(s: LayerSums, data: SplitBoundInput, r: int, deadline: float | None = None) -> float:
    """The least cheap bound of rank r over every chunk ranges it can hold (0 when there are more than
    the budget's, or when `deadline` passes before every one is tried: a bound must not come from part of
    them)."""
    p, v = data.placement.num_ranks, data.placement.chunks_per_rank
    choices = list(itertools.islice(_rank_ranges(s.n, p, v, r), data.budget.end_rank_ranges + 1))
    if len(choices) > data.budget.end_rank_ranges:
        return 0.0
    pos = rank_positions(data.placement, r)
    least = math.inf
    for k, ranges in enumerate(choices):
        if k % 256 == 0 and past(deadline):
            return 0.0
        least = min(least, chunks_bound(s, data, r, ranges, pos))
    return least if choices else 0.0
