"""A periodic start for chunked placements under tight memory: one microbatch's passes placed on a
circle of period T per rank, every other microbatch the same shifted by a whole number of periods.

Why: on a V-shape whose middle ranks hold only a few chunk-microbatches (byte caps that leave 0.4p of
room), the round-by-round and list greedies fill memory early and then wait on the long round trips;
a steady state that admits one microbatch per period keeps every rank's in-flight count at what its
round trips need. On the partition study's tight V splits (bench/partition_study.py: DeepSeek-V2-Lite-
like at 42 GiB, Llama-3-8B-like at 49 and 61 GiB, GPT-3-2.7B-like at 10 GiB) it beat the best
heuristic on the same split by 3% to 13%; at 0.5p on solve_bench's V rows and on one stage per rank
it did not, and there the other starts stay.

The method is iterative modulo scheduling (Rau, MICRO 1994) without its backtracking: passes of
microbatch 0 in dependency order (forwards and backwards first and weight passes after, or each
weight pass right after its backward), each at the earliest time its inputs allow whose phase modulo T
is free on its rank. Microbatch i runs
the same passes i*T later, so each rank's order is all of them sorted by time; the simulator then
times that order as early as possible. The infinite periodic schedule meets every dependency and
never overlaps two passes on a rank, so its orders never deadlock for any m; memory depends only on
a rank's order, and the simulator checks it. A sweep over T (from the busiest rank's work per
microbatch up to twice that: a longer period holds fewer microbatches at once) keeps the best.
"""

from __future__ import annotations

import time
from collections import defaultdict

from ..core.ir import Action, Kind, Schedule, build
from .problem import Problem

# Periods tried: a coarse sweep over [1, 2] x the busiest rank's work per microbatch, then a finer
# one around the best of it.
COARSE, FINE, WIDEST = 16, 8, 2.0
_EPS = 1e-9


class _Ring:
    """The busy phases of one rank on a circle of length T."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.busy: list[tuple[float, float]] = []

    def _pieces(self, phase: float, d: float) -> list[tuple[float, float]]:
        end = phase + d
        return [(phase, end)] if end <= self.period + _EPS else [(phase, self.period), (0.0, end - self.period)]

    def _free(self, phase: float, d: float) -> bool:
        return all(not (a < y - _EPS and x < b - _EPS) for a, b in self._pieces(phase, d) for x, y in self.busy)

    def earliest(self, ready: float, d: float) -> float | None:
        """The least start at or after `ready` whose phase interval is free (None: no gap holds d)."""
        if d > self.period + _EPS:
            return None
        first = ready % self.period
        phases = [first] + sorted((b % self.period for _, b in self.busy), key=lambda x: (x - first) % self.period)
        for phase in phases:
            if self._free(phase, d):
                return ready + (phase - first) % self.period
        return None

    def take(self, start: float, d: float) -> None:
        self.busy += self._pieces(start % self.period, d)


def periodic_schedule(problem: Problem, period: float, weights_last: bool = True) -> Schedule | None:
    """The orders of the periodic schedule with this period (see the module docstring); None when some
    pass finds no free phase on its rank."""
    first = [ps for ps in problem.passes if ps.action.microbatch == 0]
    duration = {ps.action: ps.duration for ps in first}
    # Problem.passes lists a microbatch's forwards, then its backwards, then its weight passes; the
    # other order places each weight pass right after its own backward (it needs only that one).
    if not weights_last:
        w_of = {ps.action.chunk: ps for ps in first if ps.action.kind is Kind.W}
        first = [x for ps in first if ps.action.kind is not Kind.W
                 for x in ([ps, w_of[ps.action.chunk]] if ps.action.kind is Kind.B else [ps])]
    rings: dict[int, _Ring] = defaultdict(lambda: _Ring(period))
    start: dict[Action, float] = {}
    for ps in first:
        ready = max((start[a] + duration[a] + hop for a, hop in ps.inputs), default=0.0)
        at = rings[ps.rank].earliest(ready, ps.duration) if ps.duration > 0 else ready
        if at is None:
            return None
        rings[ps.rank].take(at, ps.duration)
        start[ps.action] = at
    m = problem.num_microbatches
    timed: list[list[tuple[float, Action]]] = [[] for _ in range(problem.num_ranks)]
    for ps in first:
        a = ps.action
        timed[ps.rank] += [(start[a] + i * period, Action(a.chunk, a.kind, i)) for i in range(m)]
    ranks = [[a for _, a in sorted(rank, key=lambda t: t[0])] for rank in timed]
    return build(f"periodic(T={period:.6g})", problem.placement, m, ranks, heuristic="periodic")


def best_periodic(problem: Problem, deadline: float) -> tuple[Schedule, float] | None:
    """The best periodic schedule within the memory limit over the sweep of periods, and its objective
    by the simulator, before `deadline` (time.monotonic()); None when none fits."""
    work: dict[int, float] = defaultdict(float)
    for ps in problem.passes:
        if ps.action.microbatch == 0:
            work[ps.rank] += ps.duration
    base = max(work.values(), default=0.0)
    if base <= 0:
        return None
    best: tuple[float, float, Schedule] | None = None  # objective, period ratio, schedule
    step = (WIDEST - 1) / COARSE
    sweeps = [[1 + k * step for k in range(COARSE + 1)]]
    for n, ratios in enumerate(sweeps):
        for ratio in ratios:
            for weights_last in (True, False):
                if time.monotonic() >= deadline:
                    return None if best is None else (best[2], best[0])
                found = _evaluate(problem, base * ratio, weights_last)
                if found is not None and (best is None or found[0] < best[0]):
                    best = (found[0], ratio, found[1])
        if n == 0 and best is not None:
            sweeps.append([best[1] + step * (k / FINE - 0.5) for k in range(FINE + 1)
                           if k != FINE // 2 and best[1] + step * (k / FINE - 0.5) >= 1])
    return None if best is None else (best[2], best[0])


def _evaluate(problem: Problem, period: float, weights_last: bool) -> tuple[float, Schedule] | None:
    """(objective, schedule) of one periodic schedule, or None when it does not fit the limit."""
    from .heuristics import _quick

    schedule = periodic_schedule(problem, period, weights_last)
    quick = None if schedule is None else _quick(schedule, problem.profile, problem.limit)
    if quick is None:
        return None
    return (quick[0] if problem.objective == "makespan" else quick[1]), schedule
