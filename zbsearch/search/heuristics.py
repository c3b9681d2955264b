"""Heuristic schedules: fast list schedulers that give CP-SAT its warm start and that zbsearch never
does worse than.

Two engines, both driven by `GreedyOptions`:

- "rounds" (linear placement only) follows the Zero Bubble paper's automatic scheduler (Qi et al.,
  ICLR 2024, arXiv 2401.10241, Section 3 and the appendix): microbatch i's B is placed on every rank in
  round i, each rank decides in that round whether it also runs one more F, pending W passes are
  inserted before an F or B while the memory limit would be exceeded and to fill idle gaps, and a rank
  may leave a gap idle when it is no longer than the largest bubble some rank already has (the span
  is a maximum over ranks, so a smaller bubble elsewhere costs nothing). Its three switches are the
  paper's: a bubble before the first B or not, prioritising B over F or not, greedy W filling or not.
  Unlike the paper's runtime, which replaced per-stage times by their medians and ignored memory
  differences between stages, every time, hop and memory figure is the profile's own for that stage.
- "list" works on any single-route placement (linear, interleaved, V-shape): an event-driven list
  scheduler that simulates every rank's clock and, whenever a rank is free, runs the best ready pass
  (B or F first, by the `b_first` switch), fills idle gaps with W, and admits a new microbatch on a
  rank only while the memory limit leaves room for all of that microbatch's forward chunks on the
  rank (so chunked placements cannot deadlock on memory).

Memory follows zbsearch.sim.simulate exactly: F allocates mem_B at its start, B frees mem_B - mem_W at its
end and W frees mem_W at its end; the limit is the `MemoryLimit` per rank in the profile's memory unit.
Levels are computed from pass counts (not by summing floats), so a schedule that sits exactly on its
limit is accepted and never one above it.

`candidates` runs every greedy variant plus every applicable handcrafted schedule, validates each with
zbsearch.sim.validate, and `best` returns the best by the objective.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal

from ..core.errors import InfeasibleError, PreconditionError, ScheduleError
from ..core.ir import Action, Kind, Placement, Schedule, build, linear
from ..core.memory import MemoryLimit, check_feasible, min_feasible_limit
from ..core.profile import Profile, StageCost
from ..sim.simulate import Timeline, simulate
from ..sim.validate import validate

Objective = Literal["makespan", "span"]
OBJECTIVES = ("makespan", "span")

# Relative slack when comparing a memory level to a limit. Levels are rebuilt from integer pass counts
# times the profile's figures, so the only round-off is one multiply-add per chunk; the validator
# allows 1e-9, we allow far less so a greedy schedule always passes it.
_MEM_RTOL = 1e-12


def _fits(level: float, cap: float) -> bool:
    return level <= cap * (1 + _MEM_RTOL) + 1e-15


@dataclass(frozen=True)
class GreedyOptions:
    """One greedy variant.

    engine: "rounds" (the paper's round-by-round scheduler, linear placement) or "list" (event-driven,
        any single-route placement).
    bubble_before_first_b: rounds engine: while choosing how many warm-up forwards rank r runs before
        microbatch 0's B arrives, stop at the last forward that still ends before the B arrives (a gap
        is left) instead of running forwards until the rank is busy past the B's arrival (the B waits).
    b_first: when both an F and a B could run, prefer the B (it frees memory and releases the rank
        upstream). In the rounds engine this lets a rank that is two or more forwards ahead of its
        successor skip a round's F when that F would delay the coming B.
    w_fill: what to do with an idle gap that no pending W fits into (W passes that fit, that memory
        forces, and the drain are always run). On: run a W anyway, and the next F or B waits for it.
        Off: the list engine leaves the gap idle; the rounds engine leaves it idle only when it is no
        larger than the largest bubble some rank already has (the paper's rule), else runs the W.
    warmup: rounds engine: None for the paper's estimate of warm-up forwards; an integer k caps rank
        r's warm-up forwards at k*(p-1-r) (k=1 is ZB-H1's warm-up, 2 is ZB-H2's), always within the
        memory limit. List engine: caps the microbatches in flight on rank r at k*(p-r) (None: memory
        only).
    """

    engine: Literal["rounds", "list"] = "rounds"
    bubble_before_first_b: bool = False
    b_first: bool = False
    w_fill: bool = True
    warmup: int | None = None

    @property
    def label(self) -> str:
        parts = [self.engine]
        if self.engine == "rounds":
            parts.append("bubble-ok" if self.bubble_before_first_b else "no-bubble")
        parts.append("b-first" if self.b_first else "f-first")
        parts.append("w-fill" if self.w_fill else "w-fit")
        if self.warmup is not None:
            parts.append(f"warmup={self.warmup}")
        return ",".join(parts)


def greedy_variants(placement: Placement | None = None, *, extra: bool = True) -> list[GreedyOptions]:
    """The variants `candidates` tries for a placement: the paper's 8 switches of the rounds engine
    (linear placement only), capped warm-ups when `extra`, and the list engine's variants."""
    out: list[GreedyOptions] = []
    if placement is None or _is_linear(placement):
        for bubble, bfirst, fill in itertools.product((False, True), repeat=3):
            out.append(GreedyOptions("rounds", bubble, bfirst, fill))
        if extra:
            for k in (1, 2):
                for bfirst, fill in itertools.product((False, True), repeat=2):
                    out.append(GreedyOptions("rounds", False, bfirst, fill, warmup=k))
    for bfirst, fill in itertools.product((True, False), repeat=2):
        out.append(GreedyOptions("list", False, bfirst, fill))
    if extra:
        # Capping the microbatches in flight (1F1B's p-r, or twice that) often beats admitting as
        # many as memory allows: measured on random heterogeneous profiles, these four win most.
        for bfirst, fill, k in ((True, False, 1), (True, False, 2), (True, True, 1), (False, True, 1)):
            out.append(GreedyOptions("list", False, bfirst, fill, warmup=k))
    return out


# -- limits --------------------------------------------------------------------------------------

# One definition of the feasible minimum for every step (memory.py); the names stay for callers.
min_limit = min_feasible_limit
check_limit = check_feasible


# -- the rounds engine (the paper's scheduler, per-stage costs) ---------------------------------

class _CannotFit(Exception):
    """A variant painted itself into a corner (no pending W left to free memory)."""


@dataclass
class _Result:
    """An engine's per-rank orders and its own as-soon-as-possible timing of them (the same times
    zbsearch.sim.simulate computes), used to rank variants before paying for validation."""

    order: list[list[tuple[int, Kind, int]]]    # per rank: (chunk, kind, microbatch)
    first_start: list[float]
    last_end: list[float]
    peak: list[float]       # highest activation level per rank, in the profile's memory unit

    def cost(self, objective: str) -> float:
        if objective == "makespan":
            return max(self.last_end)
        return max(e - s for s, e in zip(self.first_start, self.last_end))


def _rounds(profile: Profile, m: int, limit: MemoryLimit, opt: GreedyOptions) -> _Result:
    """The paper's scheduler on rank = stage. Passes of one kind run in microbatch order on every
    rank, so the state is three counters per rank plus each placed pass's end time; each pass is
    timed as soon as its rank is free and its input has arrived, as the simulator will time it."""
    p = profile.num_stages
    st = profile.stages
    Fc = [s.F for s in st]
    Bc = [s.B for s in st]
    Wc = [s.W for s in st]
    mB = [s.mem_B for s in st]
    mW = [s.mem_W for s in st]
    cap = list(limit.per_rank)
    # hop[j]: activation j -> j+1 and its gradient j+1 -> j (the profile's link time between them).
    hop = [profile.comm[j] if profile.comm else 0.0 for j in range(p - 1)]

    f = [0] * p
    b = [0] * p
    w = [0] * p
    e = [0.0] * p          # when the rank's last placed pass ends
    endF = [[0.0] * m for _ in range(p)]
    endB = [[0.0] * m for _ in range(p)]
    bubble = [0.0] * p     # idle time after the rank's first F: what a later gap is weighed against
    order: list[list[tuple[int, Kind, int]]] = [[] for _ in range(p)]
    first_start = [0.0] * p
    peak = [0.0] * p
    dur = {Kind.F: Fc, Kind.B: Bc, Kind.W: Wc}

    def level(j: int, extra_f: int = 0, minus_w: int = 0) -> float:
        return (f[j] + extra_f - b[j]) * mB[j] + (b[j] - w[j] - minus_w) * mW[j]

    def put(j: int, kind: Kind) -> None:
        if kind is Kind.F:
            i = f[j]
            ready = endF[j - 1][i] + hop[j - 1] if j > 0 else 0.0
            if not _fits(level(j, 1), cap[j]):
                raise _CannotFit
        elif kind is Kind.B:
            i = b[j]
            ready = endB[j + 1][i] + hop[j] if j < p - 1 else endF[j][i]
        else:
            i = w[j]
            ready = 0.0
        start = max(e[j], ready)
        if f[j] > 0:
            bubble[j] += start - e[j]
        else:
            first_start[j] = start
        e[j] = start + dur[kind][j]
        if kind is Kind.F:
            endF[j][i] = e[j]
            f[j] += 1
            peak[j] = max(peak[j], level(j))
        elif kind is Kind.B:
            endB[j][i] = e[j]
            b[j] += 1
        else:
            w[j] += 1
        order[j].append((j, kind, i))

    def fill_gap(j: int, arrival: float) -> None:
        """W passes before a pass whose input arrives at `arrival`: every W that ends by then, then
        one more if the remaining gap is larger than the bubble this rank may still afford (or
        always, with w_fill)."""
        while w[j] < b[j] and e[j] + Wc[j] <= arrival:
            put(j, Kind.W)
        if w[j] < b[j] and e[j] < arrival:
            affordable = max(bubble) - bubble[j]
            if arrival - e[j] > affordable or opt.w_fill:
                put(j, Kind.W)

    def make_room(j: int, extra_f: int) -> None:
        while not _fits(level(j, extra_f), cap[j]):
            if w[j] >= b[j]:
                raise _CannotFit
            put(j, Kind.W)

    # Round 0: microbatch 0 goes down, every rank runs its warm-up forwards, then its B comes back.
    for j in range(p):
        put(j, Kind.F)
    req = [0] * p
    back = endF[p - 1][0] + Bc[p - 1]     # estimated end of B0 on the rank below
    for j in range(p - 2, -1, -1):
        t, n = e[j], 0
        limit_n = m - f[j]
        if opt.warmup is not None:
            limit_n = min(limit_n, opt.warmup * (p - 1 - j))
        while n < limit_n and _fits(level(j, n + 1), cap[j]):
            if opt.bubble_before_first_b:
                if t + Fc[j] > back + hop[j]:
                    break
            elif t >= back + hop[j]:
                break
            t += Fc[j]
            n += 1
        req[j] = n
        back = max(t, back + hop[j]) + Bc[j]
    # A rank runs fewer warm-up forwards than the one above it (it is one hop closer to the loss),
    # unless it already holds every microbatch; never more than its predecessor has produced.
    for j in range(1, p):
        while req[j] > 0 and req[j] >= req[j - 1] and f[j] + req[j] < m:
            req[j] -= 1
        req[j] = min(req[j], f[j - 1] + req[j - 1] - f[j])
    for j in range(p):
        for _ in range(req[j]):
            put(j, Kind.F)
    for j in range(p - 1, -1, -1):
        put(j, Kind.B)

    for i in range(1, m):
        req = [0] * p
        for j in range(p):
            if f[j] >= m:
                continue
            req[j] = 1
            if opt.b_first and j + 1 < p and f[j] >= f[j + 1] + 2:
                # This rank is ahead; the B of this round reaches it about here:
                coming = e[j + 1] + Fc[j + 1] + Bc[j + 1] + hop[j]
                if e[j] >= coming:
                    req[j] = 0
                    continue
                w_cost, k = 0.0, 0
                while not _fits(level(j, 1, k), cap[j]) and w[j] + k < b[j]:
                    w_cost += Wc[j]
                    k += 1
                if e[j] + Fc[j] + w_cost <= coming:
                    continue
                if coming - e[j] <= max(bubble) - bubble[j]:
                    req[j] = 0
        # A rank runs a forward only if the one below does too: otherwise it would run further ahead.
        for j in range(p - 2, -1, -1):
            req[j] = min(req[j], req[j + 1])
        for j in range(p):
            if not req[j]:
                continue
            make_room(j, 1)
            if j > 0:
                fill_gap(j, endF[j - 1][f[j]] + hop[j - 1])
            put(j, Kind.F)
        for j in range(p - 1, -1, -1):
            if b[j] != i or f[j] <= i:
                raise _CannotFit
            if j + 1 < p:
                fill_gap(j, endB[j + 1][i] + hop[j])
            if j == 0 and f[j] == m:
                # Rank 0 has nothing left to forward: every gap until its last B is drain, so
                # clear the held W now rather than leave them all to the tail of its span.
                while w[j] < b[j]:
                    put(j, Kind.W)
            put(j, Kind.B)
    for j in range(p):
        while w[j] < m:
            put(j, Kind.W)
    return _Result(order, first_start, e, peak)


# -- the list engine (event-driven, any single-route placement) ---------------------------------

def _list(profile: Profile, m: int, limit: MemoryLimit, placement: Placement,
          opt: GreedyOptions) -> _Result:
    """Event-driven list scheduling: a heap of (time, rank) decision points; at each, the rank runs
    a ready B or F (by `b_first`), else a W (memory-forced, gap-filling or drain), else sleeps until
    its next input arrives. Passes are identified by route position k; passes of one kind run in
    microbatch order per chunk."""
    p = placement.num_ranks
    if len(placement.routes) != 1:
        raise PreconditionError(f"the list greedy needs a single-route placement, not {placement.name!r}")
    route = placement.routes[0]
    n = len(route)
    rank_of = [placement.chunk_to_rank[c] for c in route]             # by route position
    cost: list[StageCost] = [profile.chunk_cost(placement, c) for c in route]
    hop = [profile.hop(placement, route[k], route[k + 1]) for k in range(n - 1)]
    on_rank = [[k for k in range(n) if rank_of[k] == r] for r in range(p)]
    first = [ks[0] for ks in on_rank]                                  # where a microbatch enters rank r
    cap = list(limit.per_rank)
    inflight_cap = [math.inf] * p
    if opt.warmup is not None:
        inflight_cap = [max(1, opt.warmup * (p - r)) for r in range(p)]

    nF = [0] * n       # next microbatch to run F at position k (F passes of a chunk run in order)
    nB = [0] * n
    nW = [0] * n
    endF = [[-1.0] * m for _ in range(n)]
    endB = [[-1.0] * m for _ in range(n)]
    pendW: list[deque[int]] = [deque() for _ in range(p)]              # positions, in B order
    free = [0.0] * p
    first_start = [-1.0] * p
    peak = [0.0] * p
    order: list[list[tuple[int, Kind, int]]] = [[] for _ in range(p)]
    heap: list[tuple[float, int]] = [(0.0, r) for r in range(p)]
    total = 3 * n * m
    done = 0

    def level(r: int) -> float:
        return sum((nF[k] - nB[k]) * cost[k].mem_B + (nB[k] - nW[k]) * cost[k].mem_W for k in on_rank[r])

    def reserved(r: int) -> float:
        # Admitted microbatches still owe forwards on this rank's later chunks: hold their memory.
        return sum((nF[first[r]] - nF[k]) * cost[k].mem_B for k in on_rank[r][1:])

    full_mb = [sum(cost[k].mem_B for k in ks) for ks in on_rank]

    def f_arrival(k: int) -> float | None:
        i = nF[k]
        if i >= m:
            return None
        if k == 0:
            return 0.0
        t = endF[k - 1][i]
        return None if t < 0 else t + hop[k - 1]

    def b_arrival(k: int) -> float | None:
        i = nB[k]
        if i >= nF[k]:
            return None
        own = endF[k][i]
        if k == n - 1:
            return own
        t = endB[k + 1][i]
        return None if t < 0 else max(own, t + hop[k])

    def admissible(r: int, k: int) -> bool:
        if k != first[r]:
            return True        # its memory is reserved
        if nF[k] - nB[k] >= inflight_cap[r]:
            return False
        return _fits(level(r) + reserved(r) + full_mb[r], cap[r])

    def admissible_after_w(r: int, k: int) -> bool:
        if k != first[r] or nF[k] - nB[k] >= inflight_cap[r]:
            return False
        room = level(r) - sum(cost[q].mem_W for q in pendW[r])
        return _fits(room + reserved(r) + full_mb[r], cap[r])

    def lower_bound_arrival(r: int) -> float:
        """Earliest a F or B of rank r can become ready: known arrivals, or a producer's rank free
        time plus the producer's own duration plus the hop."""
        best = math.inf
        for k in on_rank[r]:
            a = f_arrival(k)
            if a is not None:
                best = min(best, a)
            elif nF[k] < m and k > 0:
                best = min(best, free[rank_of[k - 1]] + cost[k - 1].F + hop[k - 1])
            a = b_arrival(k)
            if a is not None:
                best = min(best, a)
            elif nB[k] < nF[k] and k < n - 1:
                best = min(best, free[rank_of[k + 1]] + cost[k + 1].B + hop[k])
        return best

    def run(r: int, k: int, kind: Kind, now: float) -> None:
        """Append a pass to rank r and time it as the simulator will: as soon as the rank is free
        and its input has arrived (a W's input, its B, ended before the rank became free). A W
        chosen at `now` to fill a gap therefore starts where the gap began."""
        nonlocal done
        if kind is Kind.F:
            start = max(free[r], f_arrival(k))
        elif kind is Kind.B:
            start = max(free[r], b_arrival(k))
        else:
            start = free[r]
        dur = {Kind.F: cost[k].F, Kind.B: cost[k].B, Kind.W: cost[k].W}[kind]
        end = start + dur
        if kind is Kind.F:
            i = nF[k]
            nF[k] += 1
            endF[k][i] = end
            peak[r] = max(peak[r], level(r))
            if k + 1 < n:
                heapq.heappush(heap, (end + hop[k], rank_of[k + 1]))
        elif kind is Kind.B:
            i = nB[k]
            nB[k] += 1
            endB[k][i] = end
            pendW[r].append(k)
            if k > 0:
                heapq.heappush(heap, (end + hop[k - 1], rank_of[k - 1]))
        else:
            k = pendW[r].popleft()
            i = nW[k]
            nW[k] += 1
        order[r].append((route[k], kind, i))
        if first_start[r] < 0:
            first_start[r] = start
        free[r] = end
        # Decide again when the rank is free, but never before `now`: what arrived by `now` has
        # been seen, and its wake-up event may already be spent.
        heapq.heappush(heap, (max(end, now), r))
        done += 1

    def sleep(r: int, now: float) -> None:
        """Nothing to run: wake at the next known arrival (unknown ones push their own event when
        their producer is placed)."""
        known = [a for k in on_rank[r] for a in (f_arrival(k), b_arrival(k)) if a is not None and a > now]
        if known:
            heapq.heappush(heap, (min(known), r))

    while heap and done < total:
        t, r = heapq.heappop(heap)
        if t < free[r]:
            continue
        ready_b = [k for k in on_rank[r] if (a := b_arrival(k)) is not None and a <= t]
        ready_f = [k for k in on_rank[r] if (a := f_arrival(k)) is not None and a <= t]
        ok_f = [k for k in ready_f if admissible(r, k)]
        # Deepest chunk first (finish microbatches already admitted), then the lowest microbatch.
        ready_b.sort(key=lambda k: (nB[k], k))
        ok_f.sort(key=lambda k: (-k, nF[k]))
        pick: tuple[int, Kind] | None = None
        if opt.b_first and ready_b:
            pick = (ready_b[0], Kind.B)
        elif ok_f:
            pick = (ok_f[0], Kind.F)
        elif ready_b:
            pick = (ready_b[0], Kind.B)
        if pick is not None:
            run(r, pick[0], pick[1], t)
        elif not pendW[r]:
            sleep(r, t)
        elif any(admissible_after_w(r, k) for k in ready_f):
            run(r, pendW[r][0], Kind.W, t)     # memory forces a W before the next forward
        elif opt.w_fill or free[r] + cost[pendW[r][0]].W <= lower_bound_arrival(r):
            run(r, pendW[r][0], Kind.W, t)     # fill the gap
        else:
            sleep(r, t)
    if done < total:
        raise _CannotFit
    return _Result(order, first_start, free, peak)


# -- public entry points ---------------------------------------------------------------------------

def _is_linear(placement: Placement) -> bool:
    p = placement.num_ranks
    return placement.chunk_to_rank == tuple(range(p)) and placement.routes == (tuple(range(p)),)


def _engine(profile: Profile, m: int, limit: MemoryLimit, placement: Placement,
            options: GreedyOptions) -> _Result:
    if placement.num_ranks != profile.num_stages:
        raise PreconditionError(
            f"placement {placement.name!r} has {placement.num_ranks} ranks but profile {profile.name!r} has "
            f"{profile.num_stages} stages"
        )
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise PreconditionError(f"greedy needs m >= 1 microbatches, got {m!r}")
    check_limit(profile, placement, limit)
    try:
        if options.engine == "rounds":
            if not _is_linear(placement):
                raise PreconditionError(
                    f"the rounds greedy needs a linear placement, not {placement.name!r}: use engine='list'")
            return _rounds(profile, m, limit, options)
        if options.engine == "list":
            return _list(profile, m, limit, placement, options)
        raise PreconditionError(f"unknown greedy engine {options.engine!r}: use 'rounds' or 'list'")
    except _CannotFit:
        raise InfeasibleError(
            f"greedy({options.label}) could not keep within memory limit {limit.text} for m={m}: "
            "try another variant or a larger limit"
        ) from None


def _schedule(res: _Result, placement: Placement, m: int, limit: MemoryLimit, options: GreedyOptions) -> Schedule:
    ranks = [[Action(c, k, i) for c, k, i in rank] for rank in res.order]
    return build(f"greedy({options.label})", placement, m, ranks, heuristic="greedy",
                 variant=asdict(options), mem_limit=limit.text)


def greedy(
    profile: Profile, m: int, limit: MemoryLimit, *, placement: Placement | None = None,
    options: GreedyOptions = GreedyOptions(),
) -> Schedule:
    """One greedy schedule for `m` microbatches under `limit` (default placement: linear).

    The schedule is named "greedy(<variant>)" and its meta records the variant's options. Raises
    InfeasibleError when the limit cannot hold one microbatch on some rank (the message names the
    minimum) or when this variant cannot keep within the limit; PreconditionError when the engine does
    not support the placement (the rounds engine needs a linear one)."""
    placement = placement or linear(profile.num_stages)
    return _schedule(_engine(profile, m, limit, placement, options), placement, m, limit, options)


def _costs_apply(profile: Profile, placement: Placement) -> bool:
    """A chunked placement is costed from the profile only when the profile gives no per-chunk costs
    (each stage split evenly) or gives them for exactly this many chunks; otherwise its numbers would
    be made up."""
    if placement.num_ranks != profile.num_stages:
        return False
    return (placement.num_chunks == placement.num_ranks or profile.chunks is None
            or len(profile.chunks) == placement.num_chunks)


def _handcrafted(p: int, m: int, placement_names: set[str] | None = None) -> Iterator[tuple[str, Schedule]]:
    """Every registered generator whose module exists yet and that is defined for (p, m); chunked
    ones with their default chunk count and a few others. `placement_names`: only generators whose
    schedules use one of these placements (generating a V-shape schedule for p=32, m=256 takes
    seconds, wasted when the search is on another placement)."""
    from .. import schedules

    for name, gen in schedules.REGISTRY.items():
        if placement_names is not None and gen.placement not in placement_names:
            continue
        chunk_options: list[int | None] = [None]
        if gen.takes_chunks:
            chunk_options = sorted({c for c in (gen.default_chunks, 2, 3, 4) if c})
        for v in chunk_options:
            try:
                sched = schedules.generate(name, p, m, v)
            except PreconditionError:
                continue
            except (ImportError, AttributeError):
                break      # a colleague's module is not written yet: it is picked up once it lands
            yield (name if v is None else f"{name}(v={v})"), sched


def _quick(schedule: Schedule, profile: Profile, limit: MemoryLimit) -> tuple[float, float, float] | None:
    """(makespan, span, peak in stage-M_B units) of a schedule by the simulator, or None when it
    deadlocks, does not fit this profile, or exceeds the limit by the validator's own tolerance. Only
    ranks candidates: whatever `candidates` and `best` return has been through zbsearch.sim.validate,
    which also checks completeness (skipped here because it costs as much as the timing)."""
    from ..sim.validate import MEMORY_RTOL

    if schedule.placement.num_ranks != profile.num_stages:
        return None
    try:
        tl = simulate(schedule, profile)
    except (ScheduleError, KeyError, IndexError, ValueError):
        return None  # malformed for this placement: the validator says why, if it is ever chosen
    peaks = [tl.peak_memory(r) for r in range(tl.num_ranks)]
    if any(peak > cap * (1 + MEMORY_RTOL) + 1e-12 for peak, cap in zip(peaks, limit.per_rank)):
        return None
    return tl.makespan, tl.span, max(peak / profile.stage_mem_B(r) for r, peak in enumerate(peaks))


@dataclass
class _Pending:
    """A candidate before validation, with its cheap (cost, peak) key for ordering."""

    name: str
    key: tuple[float, float]
    make: Callable[[], Schedule]
    ident: Any = None
    aliases: list[str] = field(default_factory=list)

    def schedule(self) -> Schedule:
        s = self.make()
        if self.aliases:
            s.meta["same_as"] = list(self.aliases)
        return s


def _peak_units(profile: Profile, peaks: Iterable[float]) -> float:
    return max(x / profile.stage_mem_B(r) for r, x in enumerate(peaks))


def _collect(profile: Profile, m: int, limit: MemoryLimit, objective: str, handcrafted: bool,
             placements: Iterable[Placement] | None, extra: bool, same_placement: bool = False) -> list[_Pending]:
    """Every distinct candidate, ranked cheaply: greedy ones by their engine's own timing, handcrafted
    ones by `_quick`. A schedule that several greedy variants produce is kept once (first name), the
    other names in its meta['same_as']."""
    if objective not in OBJECTIVES:
        raise PreconditionError(f"objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    p = profile.num_stages
    check_limit(profile, linear(p), limit)
    out: list[_Pending] = []
    seen: dict[Any, _Pending] = {}
    if handcrafted:
        wanted = {pl.name for pl in (placements or [linear(p)])} if same_placement else None
        for name, sched in _handcrafted(p, m, wanted):
            if not _costs_apply(profile, sched.placement):
                continue
            if same_placement and sched.placement not in list(placements or [linear(p)]):
                continue
            quick = _quick(sched, profile, limit)
            if quick is None:
                continue       # deadlocks or over the limit: validation would reject it
            cost = quick[0] if objective == "makespan" else quick[1]
            out.append(_Pending(name, (cost, quick[2]), lambda s=sched: s))
    for placement in (placements or [linear(p)]):
        if not _costs_apply(profile, placement):
            continue
        for opt in greedy_variants(placement, extra=extra):
            try:
                res = _engine(profile, m, limit, placement, opt)
            except (InfeasibleError, PreconditionError):
                continue
            name = f"greedy({opt.label})" + ("" if _is_linear(placement) else f"@{placement.name}")
            ident = (placement, tuple(tuple(r) for r in res.order))
            if ident in seen:
                seen[ident].aliases.append(name)
                continue
            key = (res.cost(objective), _peak_units(profile, res.peak))
            seen[ident] = c = _Pending(
                name, key, lambda res=res, placement=placement, opt=opt: _schedule(res, placement, m, limit, opt),
                ident)
            out.append(c)
    out.sort(key=lambda c: c.key)
    return out


def _rank_key(tl: Timeline, objective: str) -> tuple[float, float]:
    cost = tl.makespan if objective == "makespan" else tl.span
    return cost, _peak_units(tl.profile, (tl.peak_memory(r) for r in range(tl.num_ranks)))


def candidates(
    profile: Profile, m: int, limit: MemoryLimit, objective: Objective = "span", *,
    handcrafted: bool = True, placements: Iterable[Placement] | None = None, extra: bool = True,
    top: int | None = None, same_placement: bool = False,
) -> list[tuple[str, Schedule, Timeline]]:
    """Every applicable handcrafted schedule and every greedy variant that passes
    zbsearch.sim.validate.validate under `limit`, each with its validated timeline, best first by
    `objective` ('makespan' or 'span'; ties: lower peak memory in stage-M_B units). A schedule that
    several variants produce appears once (the others are named in its meta['same_as']).

    `placements`: those the greedy variants run on (default: linear only; handcrafted schedules keep
    their own); `extra`: also the variants beyond the paper's eight; `top`: validate (and return)
    only the `top` best by the cheap ranking, since validating a large schedule takes seconds;
    `same_placement`: keep only handcrafted schedules on one of `placements` (a solver start must be).
    Raises InfeasibleError when the limit cannot hold one microbatch (the message names the minimum).
    """
    found: list[tuple[str, Schedule, Timeline]] = []
    placements = list(placements) if placements is not None else None
    for c in _collect(profile, m, limit, objective, handcrafted, placements, extra, same_placement):
        if top is not None and len(found) >= top:
            break
        sched = c.schedule()
        try:
            tl = validate(sched, profile, limit)
        except ScheduleError:
            continue
        assert tl is not None
        found.append((c.name, sched, tl))
    found.sort(key=lambda c: _rank_key(c[2], objective))
    return found


def best(
    profile: Profile, m: int, limit: MemoryLimit, objective: Objective = "span", *,
    handcrafted: bool = True, placements: Iterable[Placement] | None = None, extra: bool = True,
) -> tuple[str, Schedule, Timeline]:
    """The best of `candidates` by `objective`, ties broken by lower peak memory: the same answer as
    candidates(...)[0] (the cheap ranking times passes exactly as the simulator does), but only the
    winner is validated unless it fails. Raises InfeasibleError when nothing fits."""
    found = candidates(profile, m, limit, objective, handcrafted=handcrafted, placements=placements,
                       extra=extra, top=1)
    if not found:
        raise InfeasibleError(
            f"no heuristic schedule fits memory limit {limit.text} for p={profile.num_stages}, m={m}: "
            "raise the limit"
        )
    return found[0]
