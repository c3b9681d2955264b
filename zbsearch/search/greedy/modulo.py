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

Where a period overflows only some ranks (a V whose rank 0 holds both heavy ends), raising T for
every rank wastes the others' time. Instead the overflowing rank gets a cap on the microbatches it
holds on its first chunk: microbatch i's copy of the ring starts no earlier than the end of microbatch
i-k's backward there, one lower cap per try until it fits. On GPT-3-2.7B-like at p=8 under 10 GiB that
gave 647k us against 724k from the plain sweep; on the other study splits tried it tied.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import NamedTuple, Sequence

from ...core.errors import ScheduleError
from ...core.ir import Action, Kind, Schedule, build
from ...sim.simulate import simulate
from ...sim.validate import over_limit
from ..problem import Pass, Problem

# Periods tried: a coarse sweep over [1, 2] x the busiest rank's work per microbatch, then a finer
# one around the best of it.
COARSE, FINE, WIDEST = 16, 8, 2.0
# Tries at lowering ranks' in-flight caps before a period is given up.
MAX_REPAIRS = 32
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


def periodic_schedule(problem: Problem, period: float, weights_last: bool = True,
                      in_flight: Sequence[float] | None = None) -> Schedule | None:
    """The orders of the periodic schedule with this period (see the module docstring); None when some
    pass finds no free phase on its rank. `in_flight[r]`: at most that many microbatches between the
    start of rank r's first chunk's forward and the end of its backward (a release delay, below)."""
    ring = _ring_starts(problem, period, weights_last)
    if ring is None:
        return None
    first, start = ring
    release = _releases(problem, period, first, start, in_flight)
    m = problem.num_microbatches
    timed: list[list[tuple[float, int, Action]]] = [[] for _ in range(problem.num_ranks)]
    for ps in first:
        a = ps.action
        timed[ps.rank] += [(start[a] + release[i], i, Action(a.chunk, a.kind, i)) for i in range(m)]
    ranks = [[a for _, _, a in sorted(rank, key=lambda t: t[:2])] for rank in timed]
    return build(f"periodic(T={period:.6g})", problem.placement, m, ranks, heuristic="periodic")


def _ring_starts(problem: Problem, period: float, weights_last: bool) -> tuple[list[Pass], dict[Action, float]] | None:
    """Microbatch 0's passes in placement order and their starts on the rings of period T."""
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
    return first, start


def _releases(problem: Problem, period: float, first: list[Pass], start: dict[Action, float],
              in_flight: Sequence[float] | None) -> list[float]:
    """When each microbatch's copy of the ring starts: i*T, or later where rank r would otherwise hold
    more than in_flight[r] microbatches on its first chunk (microbatch i's forward there waits for the
    end of microbatch i-k's backward). Every microbatch keeps the ring's relative times, so the orders
    sorted by these times still meet every dependency and cannot deadlock."""
    m = problem.num_microbatches
    lives = []
    for r, k in enumerate(in_flight or ()):
        if k < m:
            chunk = _first_chunk(problem, r)
            b = next(ps for ps in first if ps.action == Action(chunk, Kind.B, 0))
            lives.append((int(k), start[b.action] + b.duration - start[Action(chunk, Kind.F, 0)]))
    release: list[float] = []
    for i in range(m):
        release.append(max([i * period] + [release[i - k] + life for k, life in lives if i >= k]))
    return release


class Periodic(NamedTuple):
    """A periodic schedule that fits the limit, and its objective by the simulator."""

    schedule: Schedule
    objective: float


def best_periodic(problem: Problem, deadline: float) -> Periodic | None:
    """The best periodic schedule within the memory limit over the sweep of periods, and its objective
    by the simulator, before `deadline` (time.monotonic()); None when none fits."""
    work: dict[int, float] = defaultdict(float)
    for ps in problem.passes:
        if ps.action.microbatch == 0:
            work[ps.rank] += ps.duration
    base = max(work.values(), default=0.0)
    if base <= 0:
        return None
    best: tuple[Periodic, float] | None = None  # and its period ratio
    step = (WIDEST - 1) / COARSE
    sweeps = [[1 + k * step for k in range(COARSE + 1)]]
    for n, ratios in enumerate(sweeps):
        for ratio in ratios:
            for weights_last in (True, False):
                if time.monotonic() >= deadline:
                    return None if best is None else best[0]
                found = _evaluate(problem, base * ratio, weights_last)
                if found is not None and (best is None or found.objective < best[0].objective):
                    best = (found, ratio)
        if n == 0 and best is not None:
            sweeps.append([best[1] + step * (k / FINE - 0.5) for k in range(FINE + 1)
                           if k != FINE // 2 and best[1] + step * (k / FINE - 0.5) >= 1])
    return None if best is None else best[0]


def _evaluate(problem: Problem, period: float, weights_last: bool) -> Periodic | None:
    """The periodic schedule of this period, or None when it cannot be made
    to fit the limit. A rank over the limit gets a cap on the microbatches it holds at once, one lower
    each try from what the ring gives it (its first chunk's lifetime over T), until every rank fits."""
    p, m = problem.num_ranks, problem.num_microbatches
    in_flight = [float(m)] * p
    for _ in range(MAX_REPAIRS):
        schedule = periodic_schedule(problem, period, weights_last, in_flight)
        if schedule is None:
            return None
        try:
            tl = simulate(schedule, problem.profile)
        except ScheduleError:
            return None
        over = [r for r in range(p) if over_limit(tl.peak_memory(r), problem.limit.per_rank[r])]
        if not over:
            return Periodic(schedule, problem.objective.of(tl))
        for r in over:
            in_flight[r] = min(in_flight[r], _held_on_ring(problem, schedule, r)) - 1
            if in_flight[r] < 1:
                return None
    return None


def _held_on_ring(problem: Problem, schedule: Schedule, rank: int) -> int:
    """The most microbatches between forward and backward on the rank's first chunk, by its order."""
    chunk = _first_chunk(problem, rank)
    held = most = 0
    for a in schedule.ranks[rank]:
        if a.chunk == chunk and a.kind in (Kind.F, Kind.B):
            held += 1 if a.kind is Kind.F else -1
            most = max(most, held)
    return most


def _first_chunk(problem: Problem, rank: int) -> int:
    """The rank's first chunk on the (single) route: where a microbatch enters the rank."""
    pl = problem.placement
    return next(c for c in pl.routes[0] if pl.chunk_to_rank[c] == rank)
