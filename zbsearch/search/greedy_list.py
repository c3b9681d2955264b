"""The "list" greedy engine: event-driven list scheduling on any single-route placement (linear,
interleaved, V-shape).

A heap of (time, rank) decision points; at each, the rank runs a ready B or F (B first or F first, by
the `b_first` switch), else a W (memory-forced, gap-filling or drain), else sleeps until its next input
arrives. A new microbatch is admitted on a rank only while the memory limit leaves room for all of that
microbatch's forward chunks there, so chunked placements cannot deadlock on memory; with `warmup` set,
also only while fewer than warmup*(p-r) microbatches are in flight on rank r. Passes are identified by
route position k; passes of one kind run in microbatch order per chunk.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from ..core.errors import PreconditionError
from ..core.ir import Kind, Placement
from ..core.memory import MemoryLimit
from ..core.profile import Profile
from ..sim.rank_state import ChunkProgress, RankClock
from .greedy_options import CannotFit, EngineResult, GreedyOptions, fits


class ListEngine:
    """One run of the list engine: one `ChunkProgress` per route position, one `RankClock` per rank,
    each rank's pending W passes (route positions, in B order) and the heap of decision points."""

    def __init__(self, profile: Profile, m: int, limit: MemoryLimit, placement: Placement,
                 options: GreedyOptions) -> None:
        if len(placement.routes) != 1:
            raise PreconditionError(
                f"the list greedy needs a placement with a single route; {placement.name!r} has "
                f"{len(placement.routes)}: use a linear, interleaved or V-shape placement")
        p = placement.num_ranks
        self.m, self.opt = m, options
        self.route = route = placement.routes[0]
        n = len(route)
        self.rank_of = [placement.chunk_to_rank[c] for c in route]            # by route position
        self.chunks = [ChunkProgress(profile.chunk_cost(placement, c), m) for c in route]
        self.hop = [profile.hop(placement, route[k], route[k + 1]) for k in range(n - 1)]
        self.on_rank = [[k for k in range(n) if self.rank_of[k] == r] for r in range(p)]
        self.cap = list(limit.per_rank)
        self.inflight_cap = [math.inf] * p
        if options.warmup is not None:
            self.inflight_cap = [max(1, options.warmup * (p - r)) for r in range(p)]
        # All of one microbatch's forward chunks on a rank: what admitting it there must leave room for.
        self.full_mb = [sum(self.chunks[k].cost.mem_B for k in ks) for ks in self.on_rank]
        self.clocks = [RankClock() for _ in range(p)]
        self.pending_w: list[deque[int]] = [deque() for _ in range(p)]
        self.order: list[list[tuple[int, Kind, int]]] = [[] for _ in range(p)]
        self.peak = [0.0] * p
        self.heap: list[tuple[float, int]] = [(0.0, r) for r in range(p)]
        self.total = 3 * n * m
        self.done = 0

    def run(self) -> EngineResult:
        while self.heap and self.done < self.total:
            t, r = heapq.heappop(self.heap)
            if t >= self.clocks[r].free:
                self.decide(r, t)
        if self.done < self.total:
            raise CannotFit
        return EngineResult.from_clocks(self.order, self.clocks, self.peak)

    def decide(self, r: int, now: float) -> None:
        """Rank r is free at `now`: run a ready B or F, else a W when memory forces it, when it fills a
        gap or with w_fill, else sleep until the next known arrival."""
        chunks = self.chunks
        ready_b = [k for k in self.on_rank[r] if (a := self.b_arrival(k)) is not None and a <= now]
        ready_f = [k for k in self.on_rank[r] if (a := self.f_arrival(k)) is not None and a <= now]
        ok_f = [k for k in ready_f if self.admissible(r, k)]
        # Deepest chunk first (finish microbatches already admitted), then the lowest microbatch.
        ready_b.sort(key=lambda k: (chunks[k].backwards, k))
        ok_f.sort(key=lambda k: (-k, chunks[k].forwards))
        if self.opt.b_first and ready_b:
            self.run_pass(r, ready_b[0], Kind.B, now)
        elif ok_f:
            self.run_pass(r, ok_f[0], Kind.F, now)
        elif ready_b:
            self.run_pass(r, ready_b[0], Kind.B, now)
        elif not self.pending_w[r]:
            self.sleep(r, now)
        elif any(self.admissible_after_w(r, k) for k in ready_f):
            self.run_pass(r, self.pending_w[r][0], Kind.W, now)      # memory forces a W before the next F
        elif self.opt.w_fill or self._w_fits_gap(r):
            self.run_pass(r, self.pending_w[r][0], Kind.W, now)      # fill the gap
        else:
            self.sleep(r, now)

    # -- arrivals ---------------------------------------------------------------------------------

    def f_arrival(self, k: int) -> float | None:
        """When the input of position k's next F arrives; None if unknown yet or none is left."""
        i = self.chunks[k].forwards
        if i >= self.m:
            return None
        if k == 0:
            return 0.0
        t = self.chunks[k - 1].f_end[i]
        return None if t < 0 else t + self.hop[k - 1]

    def b_arrival(self, k: int) -> float | None:
        """When the inputs of position k's next B (its own F, the gradient from k+1) have arrived."""
        chunk = self.chunks[k]
        i = chunk.backwards
        if i >= chunk.forwards:
            return None
        own = chunk.f_end[i]
        if k == len(self.chunks) - 1:
            return own
        t = self.chunks[k + 1].b_end[i]
        return None if t < 0 else max(own, t + self.hop[k])

    def lower_bound_arrival(self, r: int) -> float:
        """Earliest a F or B of rank r can become ready: known arrivals, or a producer's rank free
        time plus the producer's own duration plus the hop."""
        best, chunks = math.inf, self.chunks
        for k in self.on_rank[r]:
            a = self.f_arrival(k)
            if a is not None:
                best = min(best, a)
            elif chunks[k].forwards < self.m and k > 0:
                best = min(best, self.clocks[self.rank_of[k - 1]].free + chunks[k - 1].cost.F + self.hop[k - 1])
            a = self.b_arrival(k)
            if a is not None:
                best = min(best, a)
            elif chunks[k].backwards < chunks[k].forwards and k < len(chunks) - 1:
                best = min(best, self.clocks[self.rank_of[k + 1]].free + chunks[k + 1].cost.B + self.hop[k])
        return best

    def _w_fits_gap(self, r: int) -> bool:
        w = self.chunks[self.pending_w[r][0]].cost.W
        return self.clocks[r].free + w <= self.lower_bound_arrival(r)

    # -- memory -----------------------------------------------------------------------------------

    def level(self, r: int) -> float:
        return sum(self.chunks[k].held() for k in self.on_rank[r])

    def reserved(self, r: int) -> float:
        """Admitted microbatches still owe forwards on this rank's later chunks: hold their memory."""
        ks = self.on_rank[r]
        entered = self.chunks[ks[0]].forwards
        return sum((entered - self.chunks[k].forwards) * self.chunks[k].cost.mem_B for k in ks[1:])

    def admissible(self, r: int, k: int) -> bool:
        """Whether position k's next F may run on rank r now (a later chunk's memory is reserved)."""
        first = self.on_rank[r][0]
        if k != first:
            return True
        if self.chunks[k].forwards - self.chunks[k].backwards >= self.inflight_cap[r]:
            return False
        return fits(self.level(r) + self.reserved(r) + self.full_mb[r], self.cap[r])

    def admissible_after_w(self, r: int, k: int) -> bool:
        """Whether position k's next F would be admissible once every pending W of rank r has run."""
        first = self.on_rank[r][0]
        if k != first or self.chunks[k].forwards - self.chunks[k].backwards >= self.inflight_cap[r]:
            return False
        room = self.level(r) - sum(self.chunks[q].cost.mem_W for q in self.pending_w[r])
        return fits(room + self.reserved(r) + self.full_mb[r], self.cap[r])

    # -- placing passes ---------------------------------------------------------------------------

    def run_pass(self, r: int, k: int, kind: Kind, now: float) -> None:
        """Append a pass to rank r and time it as the simulator will: as soon as the rank is free
        and its input has arrived (a W's input, its B, ended before the rank became free). A W
        chosen at `now` to fill a gap therefore starts where the gap began."""
        if kind is Kind.W:
            k = self.pending_w[r].popleft()
            ready = 0.0
        else:
            ready = self.f_arrival(k) if kind is Kind.F else self.b_arrival(k)
        chunk = self.chunks[k]
        _, end = self.clocks[r].run(ready, chunk.duration(kind))
        i = chunk.record(kind, end)
        if kind is Kind.F:
            self.peak[r] = max(self.peak[r], self.level(r))
            if k + 1 < len(self.chunks):
                heapq.heappush(self.heap, (end + self.hop[k], self.rank_of[k + 1]))
        elif kind is Kind.B:
            self.pending_w[r].append(k)
            if k > 0:
                heapq.heappush(self.heap, (end + self.hop[k - 1], self.rank_of[k - 1]))
        self.order[r].append((self.route[k], kind, i))
        # Decide again when the rank is free, but never before `now`: what arrived by `now` has
        # been seen, and its wake-up event may already be spent.
        heapq.heappush(self.heap, (max(end, now), r))
        self.done += 1

    def sleep(self, r: int, now: float) -> None:
        """Nothing to run: wake at the next known arrival (unknown ones push their own event when
        their producer is placed)."""
        known = [a for k in self.on_rank[r] for a in (self.f_arrival(k), self.b_arrival(k))
                 if a is not None and a > now]
        if known:
            heapq.heappush(self.heap, (min(known), r))
