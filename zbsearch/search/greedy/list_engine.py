"""The "list" greedy engine: event-driven list scheduling on any placement (linear, interleaved, V-shape,
and DualPipe's two routes).

A heap of (time, rank) decision points; at each, the rank runs a ready B or F (B first or F first, by
the `b_first` switch), else a W (memory-forced, gap-filling or drain), else sleeps until its next input
arrives. On a rank whose W mode is "fused" every backward is one fused pass (B and W together), which
never holds more than its F took. Should the heap run dry with passes left, every rank decides again,
then runs a pending W it would sleep on (`ListEngine._unstall`); only when none can move is the variant
dropped (CannotFit).
With `pairs` (only offered when the profile gives an F&B overlap time), a ready F and a ready B run
together as one overlapped pair whenever both are there. A new microbatch is admitted on a rank
only while the memory limit leaves room for all of that microbatch's forward chunks there, so chunked
placements cannot deadlock on memory (two routes in opposite directions can, unless `by_route` admits
each microbatch at its route's start for every rank at once: see `ListEngine.gate`); with `warmup` set,
also only while fewer than warmup*(p-k) microbatches of its route are in flight on the rank, k the
rank's first position on the route (1F1B's p-r for route 0, r+1 for DualPipe's second route, which
enters at rank p-1).

Passes are identified by slot: the positions of every route, route after route (one route: slot k is
route position k). Each route carries its own microbatches (Placement.route_index), and passes of one
kind run in microbatch order per chunk.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from ...core.ir import Kind
from ...sim.rank_state import ChunkProgress, RankClock, overlap_time
from ..problem import Problem
from .options import CannotFit, EngineResult, GreedyOptions, Step, fits


def fused_helps(problem: Problem) -> bool:
    """Whether fused backwards may fit where B and W apart do not: under a limit, where some chunk's B
    leaves more held than its F took (mem_W > mem_B: torch's runtime keeps the weight gradients I
    computes). On a 70B-like profile at p=2 and 40 GiB (every time and byte over 8, fsdp 8, micro-batch 4,
    m=8) every greedy variant with B and W apart went over the limit, and the heuristics scored each
    recompute choice by plain 1F1B."""
    return not problem.limit.unlimited and any(c.mem_W > c.mem_B for c in problem.chunk_costs)


def _cap(inflight: int | None) -> float:
    return math.inf if inflight is None else max(1, inflight)


class ListEngine:
    """One run of the list engine: one `ChunkProgress` per slot, one `RankClock` per rank, each rank's
    pending W passes (slots, in B order) and the heap of decision points."""

    def __init__(self, problem: Problem, options: GreedyOptions) -> None:
        placement, m = problem.placement, problem.num_microbatches
        p = placement.num_ranks
        self.m, self.opt = m, options
        self._lay_out_slots(problem)
        n = len(self.chunk_of)
        self.on_rank = [[k for k in range(n) if self.rank_of[k] == r] for r in range(p)]
        # Per rank, the first slot of each route there: a microbatch of that route enters the rank there.
        entries = {k for ks in self.on_rank for k in {self.route_of[q]: q for q in reversed(ks)}.values()}
        self.policy = [options.policy(r, min((self.pos[k] for k in ks), default=0), p)
                       for r, ks in enumerate(self.on_rank)]
        self.inflight_cap = {k: _cap(options.policy(self.rank_of[k], self.pos[k], p).inflight) for k in entries}
        # Where memory is admitted: on each rank, at its entry, for the microbatch's chunks there; or,
        # with `by_route` on a placement of several routes, at the route's start, for every rank on the
        # route at once. Rank by rank packs tighter but can deadlock two routes that flow in opposite
        # directions (each rank full of microbatches whose next pass waits on the other): the engine
        # then raises CannotFit and the variant is dropped. `gate[k]`: the slot whose forwards count
        # the microbatches admitted for slot k.
        by_route = options.by_route and len(placement.routes) > 1
        self.gate = [k - self.pos[k] if by_route else
                     min(q for q in self.on_rank[self.rank_of[k]] if self.route_of[q] == self.route_of[k])
                     for k in range(n)]
        # What admitting one microbatch at a gate slot needs on each rank: its route's chunks there.
        self.need: dict[int, dict[int, float]] = {}
        for k in range(n):
            per = self.need.setdefault(self.gate[k], {})
            per[self.rank_of[k]] = per.get(self.rank_of[k], 0.0) + self.chunks[k].cost.mem_B
        self.cap = list(problem.limit.per_rank)
        # The gates whose admission reserves memory on each rank (with several routes, on other ranks).
        self.gates_on = [[g for g in sorted(self.need) if r in self.need[g]] for r in range(p)]
        self.clocks = [RankClock() for _ in range(p)]
        self.pending_w: list[deque[int]] = [deque() for _ in range(p)]
        self.order: list[list[Step]] = [[] for _ in range(p)]
        self.peak = [0.0] * p
        self.heap: list[tuple[float, int]] = [(0.0, r) for r in range(p)]
        self.total = 3 * sum(c.num_microbatches for c in self.chunks)
        self.done = 0

    def _lay_out_slots(self, problem: Problem) -> None:
        """Slot arrays: chunk, rank, route, position, the route's first microbatch, neighbours, hops."""
        placement, m = problem.placement, problem.num_microbatches
        counts = [0] * len(placement.routes)
        for i in range(m):
            counts[placement.route_index(i, m)] += 1
        self.chunk_of: list[int] = []
        self.route_of: list[int] = []
        self.pos: list[int] = []
        self.first_mb: list[int] = []
        self.prev: list[int | None] = []
        self.next: list[int | None] = []
        for ri, route in enumerate(placement.routes):
            base = len(self.chunk_of)
            for j, c in enumerate(route):
                self.chunk_of.append(c)
                self.route_of.append(ri)
                self.pos.append(j)
                self.first_mb.append(sum(counts[:ri]))
                self.prev.append(base + j - 1 if j > 0 else None)
                self.next.append(base + j + 1 if j + 1 < len(route) else None)
        self.rank_of = [placement.chunk_to_rank[c] for c in self.chunk_of]
        self.chunks = [ChunkProgress(problem.chunk_costs[c], counts[self.route_of[k]])
                       for k, c in enumerate(self.chunk_of)]
        self.hop = [0.0 if nxt is None else problem.hop(self.chunk_of[k], self.chunk_of[nxt])
                    for k, nxt in enumerate(self.next)]

    def run(self) -> EngineResult:
        latest = 0.0
        while self.done < self.total:
            while self.heap and self.done < self.total:
                t, r = heapq.heappop(self.heap)
                latest = max(latest, t)
                if t >= self.clocks[r].free:
                    self.decide(r, t)
            if self.done < self.total and not self._unstall(latest):
                raise CannotFit
        return EngineResult.from_clocks(self.order, self.clocks, self.peak)

    def _unstall(self, latest: float) -> bool:
        """The heap ran dry with passes left, so no event will ever come; return whether a pass ran.

        On DualPipe's two routes two things stall the event loop short of memory being full. A
        producer's pass can be timed before its consumer's last decision (its rank was free earlier),
        so the consumer's wake-up falls before the consumer's free time and run() drops it, while the
        consumer already slept knowing of no arrival. And a gate that reserves on two ranks waits for
        W on both, while each rank, weighing only its own W, sleeps. Only here, where the engine
        used to give up, does it act, so that every schedule it made before stays the same: each rank
        decides again at the latest time seen (every known arrival has passed by then), and only if
        none moves, each runs a pending W it would otherwise sleep on (it frees memory and has to run
        anyway)."""
        before = self.done
        for forced in (False, True):
            for r in range(len(self.clocks)):
                self.decide(r, max(latest, self.clocks[r].free), forced)
            if self.done > before:
                return True
        return False

    def decide(self, r: int, now: float, forced: bool = False) -> None:
        """Rank r is free at `now`: run a ready B (a fused backward on a rank whose W mode is "fused") or F
        (both as a pair, with `pairs`), else a W when memory forces it, when it fills a gap, with w_fill or
        when `forced` (nothing else can move), else sleep until the next known arrival."""
        chunks, pos, policy = self.chunks, self.pos, self.policy[r]
        backward = Kind.FULL_B if policy.w_mode == "fused" else Kind.B
        if policy.w_mode == "eager" and self.pending_w[r]:
            self.run_pass(r, self.pending_w[r][0], Kind.W, now)
            return
        ready_b = [k for k in self.on_rank[r] if (a := self.b_arrival(k)) is not None and a <= now]
        ready_f = [k for k in self.on_rank[r] if (a := self.f_arrival(k)) is not None and a <= now]
        ok_f = [k for k in ready_f if self.admissible(r, k)]
        # Deepest chunk first (finish microbatches already admitted), then the lowest microbatch.
        ready_b.sort(key=lambda k: (chunks[k].backwards, pos[k], k))
        ok_f.sort(key=lambda k: (-pos[k], chunks[k].forwards, k))
        if self.opt.pairs and ready_b and ok_f:
            self.run_pair(r, ok_f[0], ready_b[0], now)
        elif policy.b_first and ready_b:
            self.run_pass(r, ready_b[0], backward, now)
        elif ok_f:
            self.run_pass(r, ok_f[0], Kind.F, now)
        elif ready_b:
            self.run_pass(r, ready_b[0], backward, now)
        elif not self.pending_w[r]:
            self.sleep(r, now)
        elif self._w_unblocks(r, now):
            self.run_pass(r, self.pending_w[r][0], Kind.W, now)      # memory forces a W before the next F
        elif forced or policy.w_mode == "fill" or self._w_fits_gap(r):
            self.run_pass(r, self.pending_w[r][0], Kind.W, now)      # fill the gap
        else:
            self.sleep(r, now)

    # -- arrivals ---------------------------------------------------------------------------------

    def f_arrival(self, k: int) -> float | None:
        """When the input of slot k's next F arrives; None if unknown yet or none is left."""
        chunk = self.chunks[k]
        i = chunk.forwards
        if i >= chunk.num_microbatches:
            return None
        prev = self.prev[k]
        if prev is None:
            return 0.0
        t = self.chunks[prev].f_end[i]
        return None if t < 0 else t + self.hop[prev]

    def b_arrival(self, k: int) -> float | None:
        """When the inputs of slot k's next B (its own F, the gradient from the next slot) have arrived."""
        chunk = self.chunks[k]
        i = chunk.backwards
        if i >= chunk.forwards:
            return None
        own = chunk.f_end[i]
        nxt = self.next[k]
        if nxt is None:
            return own
        t = self.chunks[nxt].b_end[i]
        return None if t < 0 else max(own, t + self.hop[k])

    def lower_bound_arrival(self, r: int) -> float:
        """Earliest a F or B of rank r can become ready: known arrivals, or a producer's rank free
        time plus the producer's own duration plus the hop."""
        best, chunks = math.inf, self.chunks
        for k in self.on_rank[r]:
            prev, nxt = self.prev[k], self.next[k]
            a = self.f_arrival(k)
            if a is not None:
                best = min(best, a)
            elif chunks[k].forwards < chunks[k].num_microbatches and prev is not None:
                best = min(best, self.clocks[self.rank_of[prev]].free + chunks[prev].cost.F + self.hop[prev])
            a = self.b_arrival(k)
            if a is not None:
                best = min(best, a)
            elif chunks[k].backwards < chunks[k].forwards and nxt is not None:
                best = min(best, self.clocks[self.rank_of[nxt]].free + chunks[nxt].cost.B + self.hop[k])
        return best

    def _w_fits_gap(self, r: int) -> bool:
        w = self.chunks[self.pending_w[r][0]].cost.W
        return self.clocks[r].free + w <= self.lower_bound_arrival(r)

    # -- memory -----------------------------------------------------------------------------------

    def level(self, r: int) -> float:
        return sum(self.chunks[k].held() for k in self.on_rank[r])

    def reserved(self, r: int) -> float:
        """Admitted microbatches still owe forwards on this rank's chunks past their gate: hold their
        memory."""
        chunks = self.chunks
        return sum((chunks[self.gate[k]].forwards - chunks[k].forwards) * chunks[k].cost.mem_B
                   for k in self.on_rank[r] if self.gate[k] != k)

    def _under_cap(self, k: int) -> bool:
        """Fewer microbatches than the warm-up cap are in flight at slot k (only entries have one)."""
        cap = self.inflight_cap.get(k, math.inf)
        return self.chunks[k].forwards - self.chunks[k].backwards < cap

    def _room(self, k: int, freed: dict[int, float] | None = None) -> bool:
        """Whether every rank that admitting one more microbatch at gate slot k reserves on has room
        (after `freed` leaves each rank it names)."""
        freed = freed or {}
        return all(fits(self.level(q) - freed.get(q, 0.0) + self.reserved(q) + need, self.cap[q])
                   for q, need in self.need[k].items())

    def admissible(self, r: int, k: int) -> bool:
        """Whether slot k's next F may run on rank r now (past its gate, its memory is reserved)."""
        return self._under_cap(k) and (self.gate[k] != k or self._room(k))

    def admissible_after_w(self, r: int, k: int) -> bool:
        """Whether slot k, a gate, would admit its next F once every pending W of rank r has run."""
        if self.gate[k] != k or not self._under_cap(k):
            return False
        return self._room(k, {r: sum(self.chunks[q].cost.mem_W for q in self.pending_w[r])})

    def _w_unblocks(self, r: int, now: float) -> bool:
        """Whether running rank r's pending W would let a ready F through a gate that reserves on r
        (one route: r's own entries; several: the starts of the routes through r)."""
        return any((a := self.f_arrival(g)) is not None and a <= now and self.admissible_after_w(r, g)
                   for g in self.gates_on[r])

    # -- placing passes ---------------------------------------------------------------------------

    def run_pass(self, r: int, k: int, kind: Kind, now: float) -> None:
        """Append a pass to rank r and time it as the simulator will: as soon as the rank is free
        and its input has arrived (a W's input, its B, ended before the rank became free). A W
        chosen at `now` to fill a gap therefore starts where the gap began."""
        if kind is Kind.W:
            k = self.pending_w[r].popleft()
            ready = 0.0
        else:
            arrival = self.f_arrival(k) if kind is Kind.F else self.b_arrival(k)
            assert arrival is not None, "a pass runs once its input has arrived"
            ready = arrival
        _, end = self.clocks[r].run(ready, self.chunks[k].duration(kind))
        i = self._record(r, k, kind, end)
        self.order[r].append(Step(self.chunk_of[k], kind, i))
        self._wake(r, end, now)

    def run_pair(self, r: int, f: int, b: int, now: float) -> None:
        """Run slot f's next F and slot b's next B as one overlapped pair (both inputs are there)."""
        cost_f, cost_b = self.chunks[f].cost, self.chunks[b].cost
        f_at, b_at = self.f_arrival(f), self.b_arrival(b)
        assert f_at is not None and b_at is not None, "a pair runs once both inputs are there"
        ready = max(f_at, b_at)
        _, end = self.clocks[r].run(ready, overlap_time(((cost_f, Kind.F), (cost_b, Kind.B))))
        i_f = self._record(r, f, Kind.F, end)      # the F first: its memory is held from the pair's start,
        i_b = self._record(r, b, Kind.B, end)      # while the B frees its part only at the pair's end
        self.order[r].append(Step(self.chunk_of[f], Kind.OVERLAP, i_f, self.chunk_of[b], i_b))
        self._wake(r, end, now)

    def _record(self, r: int, k: int, kind: Kind, end: float) -> int:
        """Count one pass of slot k ending at `end`, wake its consumer's rank; return its microbatch."""
        i = self.chunks[k].record(kind, end)
        if kind is Kind.F:
            self.peak[r] = max(self.peak[r], self.level(r))
            nxt = self.next[k]
            if nxt is not None:
                heapq.heappush(self.heap, (end + self.hop[k], self.rank_of[nxt]))
        elif kind in (Kind.B, Kind.FULL_B):
            if kind is Kind.B:
                self.pending_w[r].append(k)
            prev = self.prev[k]
            if prev is not None:
                heapq.heappush(self.heap, (end + self.hop[prev], self.rank_of[prev]))
        if kind is not Kind.F:
            # Memory freed on r may let a gate on another rank admit: wake that rank then.
            for g in self.gates_on[r]:
                if self.rank_of[g] != r:
                    heapq.heappush(self.heap, (end, self.rank_of[g]))
        self.done += 2 if kind is Kind.FULL_B else 1  # a fused backward is B and W
        return self.first_mb[k] + i

    def _wake(self, r: int, end: float, now: float) -> None:
        # Decide again when the rank is free, but never before `now`: what arrived by `now` has
        # been seen, and its wake-up event may already be spent.
        heapq.heappush(self.heap, (max(end, now), r))

    def sleep(self, r: int, now: float) -> None:
        """Nothing to run: wake at the next known arrival (unknown ones push their own event when
        their producer is placed)."""
        known = [a for k in self.on_rank[r] for a in (self.f_arrival(k), self.b_arrival(k))
                 if a is not None and a > now]
        if known:
            heapq.heappush(self.heap, (min(known), r))
