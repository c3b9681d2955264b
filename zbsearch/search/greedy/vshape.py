"""The "v-rounds" greedy engine: the Zero Bubble authors' adaptive V-shape scheduler, with every chunk's
own times, hops and memory.

Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024, arXiv 2401.10241), section 6: ZB-V is the
V-shape schedule they built by hand for uniform stages, and their code adapts it to the profiled times
and a memory limit with a round-by-round greedy. This engine follows that structure (the code is ours):

1. warm-up: microbatch 0 goes down the V; before its chunk-1 forward reaches rank i, ranks 0..i run
   one more chunk-0 forward each while it ends before that arrival and memory leaves room for the
   chunk-1 forwards still to come (`warmup` caps the count); then the ranks balance their forwards
   so each has run at least as many as the rank above it;
2. rounds: in each round every rank runs one backward (the chunk whose gradient is there: chunk 1's
   going down the ranks, chunk 0's coming back up) and then one forward (chunk 1 when its input is
   there, else chunk 0); B before F (`b_first`) or F before B;
3. W passes: before an F when memory requires it, into every gap they fit, and into a gap they do not
   fit when the gap exceeds the bubble the rank can afford (`fill_b` before a chunk-0 B and always
   before a chunk-1 B, `fill_f` before an F); with `w_defer` = k, right after their B once more
   than k are held; the rest at the end;
4. the run is repeated with each rank allowed the bubble the previous run left it, while the largest
   span improves (the paper's 'approved bubble').

Unlike their runtime, times, hops and memory are each chunk's and rank's own, and a pass whose input
is not there yet is skipped for that round instead of assumed. Timing and memory follow
zbsearch.sim.rank_state, the simulator's rule.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from ...core.errors import PreconditionError
from ...core.ir import Kind, Placement
from ...sim.rank_state import ChunkProgress, RankClock
from ..problem import Problem
from .memory import RouteArrivals, admits, inflight_caps
from .options import CannotFit, EngineResult, Step, fits

# Re-runs with the previous run's bubbles approved, at most (the paper's recursion stops by itself
# when nothing improves; this only bounds the time).
APPROVAL_ROUNDS = 6


@dataclass(frozen=True)
class VOptions:
    """One variant of the v-rounds engine (see the module docstring).

    fill_b / fill_f: run a held W into a gap it does not fit, before a chunk-0 B / before an F, when
        the gap is larger than the bubble the rank can afford (the paper's two switches).
    b_first: each round runs its backwards before its forwards (else forwards first).
    w_defer: None, W wait for gaps, memory and the end; k, a W runs right after its B once more than k
        are held back.
    warmup: None, the paper's warm-up (as many chunk-0 forwards as end before microbatch 0's chunk-1
        forward arrives, within memory); x, also at most x times the microbatches a rank needs in
        flight to stay busy (`greedy_memory.inflight_caps`), which keeps room for chunk 1 under tight
        limits.
    safe_admit: a new microbatch enters a rank only while room stays for the chunk-1 forward of the
        oldest one in flight (`greedy_memory.admits`); off, whenever it fits, as the paper's scheduler
        does (it can jam under tight limits: that variant is then dropped).
    """

    engine: Literal["v-rounds"] = "v-rounds"
    fill_b: bool = True
    fill_f: bool = True
    b_first: bool = True
    w_defer: int | None = None
    warmup: float | None = None
    safe_admit: bool = False

    @property
    def label(self) -> str:
        parts = [self.engine, "b-first" if self.b_first else "f-first",
                 "fill-b" if self.fill_b else "fit-b", "fill-f" if self.fill_f else "fit-f"]
        if self.safe_admit:
            parts.append("safe-admit")
        if self.w_defer is not None:
            parts.append(f"w-defer={self.w_defer}")
        if self.warmup is not None:
            parts.append(f"warmup={self.warmup:g}")
        return ",".join(parts)


def is_vshape(placement: Placement) -> bool:
    """Whether a placement is the V-shape: rank r holds chunks r and 2p-1-r, one route through all."""
    p = placement.num_ranks
    return (placement.chunk_to_rank == tuple(c if c < p else 2 * p - 1 - c for c in range(2 * p))
            and placement.routes == (tuple(range(2 * p)),))


def run_v(problem: Problem, options: VOptions) -> EngineResult:
    """The best of the first run and its re-runs with the bubble each rank was left approved."""
    placement = problem.placement
    if not is_vshape(placement):
        raise PreconditionError(f"the v-rounds greedy needs the V-shape placement, not {placement.name!r}: "
                                "use engine 'chunked' on other chunked placements")
    best: EngineResult | None = None
    approved: list[float] | None = None
    for _ in range(APPROVAL_ROUNDS):
        engine = VRounds(problem, options, approved)
        res = engine.run()
        if best is not None and res.cost("span") >= best.cost("span"):
            break
        best, approved = res, [c.idle for c in engine.clocks]
    assert best is not None
    return best


class VRounds(RouteArrivals):
    """One run. Route positions: rank i holds position i (chunk 0) and 2p-1-i (chunk 1)."""

    def __init__(self, problem: Problem, options: VOptions, approved: list[float] | None = None) -> None:
        placement, m = problem.placement, problem.num_microbatches
        p = placement.num_ranks
        self.p, self.m, self.opt = p, m, options
        route = placement.routes[0]
        self.route = route
        self.chunks = [ChunkProgress(problem.chunk_costs[c], m) for c in route]
        self.hop = [problem.hop(route[k], route[k + 1]) for k in range(2 * p - 1)]
        self.cap = list(problem.limit.per_rank)
        self.clocks = [RankClock() for _ in range(p)]
        self.pending_w: list[deque[int]] = [deque() for _ in range(p)]
        self.order: list[list[Step]] = [[] for _ in range(p)]
        self.peak = [0.0] * p
        self.work = [sum(self.chunks[k].cost.F + self.chunks[k].cost.B + self.chunks[k].cost.W
                         for k in (r, 2 * p - 1 - r)) * m for r in range(p)]
        # A rank may idle up to the largest span so far (work + idle) less its own work and idle;
        # `approved` adds what the previous run left each rank.
        self.approved = approved or [0.0] * p
        self.inflight_cap = [math.inf] * p
        if options.warmup is not None:
            on_rank = [[r, 2 * p - 1 - r] for r in range(p)]
            self.inflight_cap = inflight_caps(self.chunks, self.hop, on_rank, m, options.warmup)

    def pos(self, r: int, c: int) -> int:
        return r if c == 0 else 2 * self.p - 1 - r

    def run(self) -> EngineResult:
        self.warm_up()
        self.balance()
        stalled = 0
        while any(c.weights < self.m for c in self.chunks):
            before = sum(c.forwards + c.backwards for c in self.chunks)
            self.round()
            after = sum(c.forwards + c.backwards for c in self.chunks)
            if after == 2 * self.p * self.m * 2:
                break
            stalled = stalled + 1 if after == before else 0
            if stalled > 1:
                raise CannotFit
        for r in range(self.p):
            while self.pending_w[r]:
                self.put_w(r)
        if any(c.weights < self.m for c in self.chunks):
            raise CannotFit
        return EngineResult.from_clocks(self.order, self.clocks, self.peak)

    # -- phases -----------------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Microbatch 0 down the V; before its chunk-1 forward on rank i, one more chunk-0 forward on
        ranks 0..i per step while it ends before that forward's input arrives and fits."""
        p = self.p
        for r in range(p):
            self.put(r, Kind.F)
        for r in range(p - 1, -1, -1):
            k1 = self.pos(r, 1)
            arrival = self.f_arrival(k1)
            assert arrival is not None
            while self._room_for_warmup(r) \
                    and self.clocks[r].free + self.chunks[r].cost.F <= arrival and self.chunks[r].forwards < self.m:
                if not all(self._f_fits(j, j) for j in range(r + 1)):
                    break
                for j in range(r + 1):
                    self.put(j, Kind.F)
            if not self.put(k1, Kind.F):
                raise CannotFit

    def _room_for_warmup(self, r: int) -> bool:
        """One more chunk-0 forward on rank r leaves room for the 2r+1 chunk passes' activations the
        balancing and the first rounds will add (the paper's rule, with each chunk's own memory)."""
        c0, c1 = self.chunks[r].cost.mem_B, self.chunks[self.pos(r, 1)].cost.mem_B
        return fits(self.level(r) + c0 + (r + 1) * c1 + r * c0, self.cap[r])

    def balance(self) -> None:
        """Each rank runs forwards, alternating chunks, until it has run at least as many as the
        rank above it and more chunk-1 forwards than that rank."""
        which = 0
        for i in range(1, self.p):
            guard = 0
            while self._behind(i):
                placed = False
                for j in range(self.p - 1, i - 1, -1):
                    k = self.pos(j, which)
                    if self.chunks[k].forwards < self.m and self._f_fits(j, k):
                        placed |= self.put(k, Kind.F)
                which = 1 - which
                guard = guard + 1 if not placed else 0
                if guard > 2:
                    break

    def _behind(self, i: int) -> bool:
        a0, a1 = self.chunks[i].forwards, self.chunks[self.pos(i, 1)].forwards
        b0, b1 = self.chunks[i - 1].forwards, self.chunks[self.pos(i - 1, 1)].forwards
        return a0 + a1 < b0 + b1 or a1 <= b1 < self.m

    def round(self) -> None:
        if self.opt.b_first:
            self.backwards()
            self.forwards()
        else:
            self.forwards()
            self.backwards()

    def backwards(self) -> None:
        """One B per rank: chunk 0's (coming back up) on ranks whose gradient for it is there, in
        rank order from the bottom; then chunk 1's (going down) on the others, from the top."""
        p = self.p
        up, down = [], []
        for r in range(p):
            k0, k1 = self.pos(r, 0), self.pos(r, 1)
            c0, c1 = self.chunks[k0], self.chunks[k1]
            if c0.backwards >= c1.backwards:
                down.append(r)
            elif r == p - 1 or self.chunks[k0 + 1].b_end[c0.backwards] >= 0 or c1.backwards >= self.m:
                up.append(r)
            else:
                down.append(r)
        for r in reversed(up):
            self._backward(r, self.pos(r, 0), self.opt.fill_b)
        for r in down:
            self._backward(r, self.pos(r, 1), True)

    def _backward(self, r: int, k: int, fill: bool) -> None:
        arrival = self.b_arrival(k)
        if arrival is None:
            return
        self.fill(r, arrival, fill)
        self.put(k, Kind.B)

    def forwards(self) -> None:
        """One F per rank, top down: chunk 1 when its input is there (or chunk 0 has caught up), else
        chunk 0; memory-forced W first, then gap filling."""
        for r in range(self.p):
            k = self._next_forward(r)
            if k is None:
                continue
            while not self._f_fits(r, k) and self.pending_w[r]:
                self.put_w(r)
            arrival = self.f_arrival(k)
            if arrival is None or not self._f_fits(r, k):
                continue
            self.fill(r, arrival, self.opt.fill_f)
            self.put(k, Kind.F)

    def _next_forward(self, r: int) -> int | None:
        k0, k1 = self.pos(r, 0), self.pos(r, 1)
        c0, c1 = self.chunks[k0], self.chunks[k1]
        if c1.forwards >= self.m:
            return None
        if c1.forwards >= c0.forwards:
            return k0
        if self.f_arrival(k1) is not None:
            return k1
        if c0.forwards < self.m and self.f_arrival(k0) is not None:
            return k0
        return None

    # -- W passes -----------------------------------------------------------------------------------

    def fill(self, r: int, arrival: float, over: bool) -> None:
        """Held W before a pass whose input arrives at `arrival`: every one that ends by then, then
        one more if `over` and the gap left is more than the rank can afford."""
        clock, q = self.clocks[r], self.pending_w[r]
        while q and clock.free + self.chunks[q[0]].cost.W <= arrival:
            self.put_w(r)
        if q and over and arrival - clock.free > self.affordable(r):
            self.put_w(r)

    def affordable(self, r: int) -> float:
        spans = [w + c.idle + a for w, c, a in zip(self.work, self.clocks, self.approved)]
        return max(spans) - (self.work[r] + self.clocks[r].idle)

    def put_w(self, r: int) -> None:
        self.put(self.pending_w[r][0], Kind.W)

    # -- state ----------------------------------------------------------------------------------------

    def rank_of(self, k: int) -> int:
        return k if k < self.p else 2 * self.p - 1 - k

    def level(self, r: int) -> float:
        return self.chunks[self.pos(r, 0)].held() + self.chunks[self.pos(r, 1)].held()

    def _f_fits(self, r: int, k: int) -> bool:
        entry = self.chunks[r]
        if k == r and entry.forwards - entry.backwards >= self.inflight_cap[r]:
            return False
        if not self.opt.safe_admit:
            return fits(self.level(r) + self.chunks[k].cost.mem_B, self.cap[r])
        return admits(self.chunks, (r, 2 * self.p - 1 - r), k, self.cap[r])

    def put(self, k: int, kind: Kind) -> bool:
        """Append the next pass of `kind` at route position k to its rank, timed as the simulator
        will time it; False (nothing placed) when its input is not there yet or an F does not fit."""
        r = self.rank_of(k)
        chunk = self.chunks[k]
        if kind is Kind.W:
            self.pending_w[r].popleft()
            ready: float | None = 0.0
        elif kind is Kind.F:
            ready = self.f_arrival(k)
            if ready is not None and not self._f_fits(r, k):
                return False
        else:
            ready = self.b_arrival(k)
        if ready is None:
            return False
        _, end = self.clocks[r].run(ready, chunk.duration(kind))
        i = chunk.record(kind, end)
        self.order[r].append(Step(self.route[k], kind, i))
        if kind is Kind.F:
            self.peak[r] = max(self.peak[r], self.level(r))
        elif kind is Kind.B:
            self.pending_w[r].append(k)
            if self.opt.w_defer is not None:
                while len(self.pending_w[r]) > self.opt.w_defer:
                    self.put_w(r)
        return True
