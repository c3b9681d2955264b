"""Lower bounds on the objective that hold for every valid schedule of a problem.

They make the reported gap meaningful where CP-SAT's own bound is weak (the span objective, large
instances). Each bound is computed from a list of passes, so the same code bounds the exact problem
and the solver's integer-grid relaxation.

- head: no pass of rank r can start before microbatch 0's forwards reach it.
- work: a rank runs its passes one at a time.
- start idle (one stage per rank): between rank r's first pass and its first B only forwards can run
  (no gradient has come back, and W needs B), at most n = limit // mem_B of them fit in memory, while
  microbatch 0 must go down to the last stage and back. The rest of that window is idle.
- end idle (one stage per rank): between the end of rank r's last F and the start of that
  microbatch's B, the gradient makes the same trip; only B and W of microbatches already in memory
  at that moment can fill the window, and memory caps how many there are.
- memory-time (any placement): a microbatch's activations on a chunk stay from the start of its F
  to the end of its B (mem_B - mem_W) and of its W (mem_W), and neither can be shorter than the
  longest dependency path between those passes. All of it lies inside the rank's window, where at
  most `limit` is held at any moment, so the window lasts at least the total memory-time over the
  limit. Under tight limits this is the bound that binds: activations wait out the round trip.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Sequence

from .ir import Action, Kind
from .problem import Pass, Problem
from .validate import MEMORY_RTOL


@dataclass(frozen=True)
class RankBound:
    rank: int
    head: float  # earliest start of the rank's first pass
    work: float
    start_idle: float
    end_idle: float
    disjoint: bool  # whether the two idle windows are known not to overlap
    memory_time: float = 0.0  # shortest window the rank's activations fit in under its limit

    @property
    def span(self) -> float:
        idle = self.start_idle + self.end_idle if self.disjoint else max(self.start_idle, self.end_idle)
        return max(self.work + idle, self.memory_time)

    @property
    def end(self) -> float:
        return self.head + self.span


def earliest_starts(passes: Sequence[Pass]) -> dict[Action, float]:
    """Longest path from time 0 to each pass's start, over data dependencies only."""
    by_action = {ps.action: ps for ps in passes}
    es: dict[Action, float] = {}
    for ps in passes:  # Problem.passes lists producers before consumers within each microbatch
        es[ps.action] = max((es[a] + by_action[a].duration + hop for a, hop in ps.inputs), default=0.0)
    return es


def hold_times(passes: Sequence[Pass]) -> dict[int, tuple[float, float]]:
    """For each chunk, the shortest time a microbatch's activations stay on it: (start of its F to
    the end of its B, start of its F to the end of its W), each the longest dependency path between
    the two. Costs do not depend on the microbatch, so the first microbatch through each chunk
    stands for all of them."""
    by_mb: dict[int, list[Pass]] = defaultdict(list)
    for ps in passes:
        by_mb[ps.action.microbatch].append(ps)
    out: dict[int, tuple[float, float]] = {}
    for mb_passes in by_mb.values():
        for ps in mb_passes:
            if ps.action.kind is not Kind.F or ps.action.chunk in out:
                continue
            since = _longest_from(mb_passes, ps.action)
            chunk, mb = ps.action.chunk, ps.action.microbatch
            out[chunk] = (since[Action(chunk, Kind.B, mb)], since[Action(chunk, Kind.W, mb)])
        if len(out) == len({ps.action.chunk for ps in passes}):
            break
    return out


def _longest_from(mb_passes: Sequence[Pass], origin: Action) -> dict[Action, float]:
    """Longest path from the start of `origin` to the end of each pass that depends on it (passes
    in dependency order)."""
    reach: dict[Action, float] = {}
    for ps in mb_passes:
        if ps.action == origin:
            reach[origin] = ps.duration
            continue
        ready = [reach[a] + hop for a, hop in ps.inputs if a in reach]
        if ready:
            reach[ps.action] = max(ready) + ps.duration
    return reach


def memory_time(passes: Sequence[Pass], limits: Sequence[float]) -> list[float]:
    """Per rank, the shortest window that holds all its activations' memory-time under its limit."""
    hold = hold_times(passes)
    keep = {ps.action.chunk: ps.free for ps in passes if ps.action.kind is Kind.W}
    need = [0.0] * len(limits)
    for ps in passes:
        if ps.action.kind is Kind.F:
            to_b, to_w = hold[ps.action.chunk]
            w = keep.get(ps.action.chunk, 0.0)
            need[ps.rank] += (ps.alloc - w) * to_b + w * to_w
    # The validator lets a peak exceed the limit by its relative tolerance; so does this bound.
    return [0.0 if math.isinf(cap) or cap <= 0 else n / (cap * (1 + MEMORY_RTOL)) for n, cap in zip(need, limits)]


def rank_bounds(problem: Problem, passes: Sequence[Pass]) -> list[RankBound]:
    p, m = problem.num_ranks, problem.num_microbatches
    es = earliest_starts(passes)
    work: dict[int, float] = defaultdict(float)
    head: dict[int, float] = {}
    for ps in passes:
        work[ps.rank] += ps.duration
        head[ps.rank] = min(head.get(ps.rank, math.inf), es[ps.action])
    linear = problem.placement.name == "linear" and len(problem.placement.routes) == 1
    by_action = {ps.action: ps for ps in passes}
    held = memory_time(passes, problem.limit.per_rank)
    out = []
    for r in range(p):
        start_idle = end_idle = 0.0
        disjoint = False
        if linear:
            F = by_action[Action(r, Kind.F, 0)]
            B = by_action[Action(r, Kind.B, 0)]
            W = by_action[Action(r, Kind.W, 0)]
            # F(r,0) start -> B(r,0) start along microbatch 0's round trip.
            trip = es[B.action] - es[F.action]
            limit = problem.limit.per_rank[r]
            n = m if math.isinf(limit) else min(m, int(limit // F.alloc + 1e-9))
            start_idle = max(0.0, trip - n * F.duration)
            end_idle = max(0.0, trip - F.duration - _fill_after_last_forward(F, B, W, limit, m))
            disjoint = m > n
        out.append(RankBound(r, head[r], work[r], start_idle, end_idle, disjoint, held[r]))
    return out


def _fill_after_last_forward(F: Pass, B: Pass, W: Pass, limit: float, m: int) -> float:
    """Most B+W work that can run between a rank's last F and that microbatch's B: a microbatches
    awaiting B (the last one among them) and b awaiting W, with a*mem_B + b*mem_W <= limit."""
    mb, mw = F.alloc, W.free
    best = 0.0
    a_max = m if math.isinf(limit) else min(m, int(limit // mb + 1e-9))
    for a in range(1, max(a_max, 1) + 1):
        room = limit - a * mb
        b = m - a if (mw == 0 or math.isinf(limit)) else min(m - a, max(0, int(room // mw + 1e-9)))
        best = max(best, (a - 1) * (B.duration + W.duration) + b * W.duration)
    return best


def objective_bound(bounds: Sequence[RankBound], objective: str) -> float:
    """The objective's lower bound from per-rank bounds: the largest span, or the latest end."""
    return max(b.span for b in bounds) if objective == "span" else max(b.end for b in bounds)


def lower_bound(problem: Problem, passes: Sequence[Pass] | None = None, objective: str | None = None) -> float:
    """The best analytic lower bound on the objective (makespan or span)."""
    bounds = rank_bounds(problem, passes if passes is not None else problem.passes)
    return objective_bound(bounds, objective or problem.objective)
