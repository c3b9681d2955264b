"""The "rounds" greedy engine: the Zero Bubble paper's automatic scheduler on rank = stage, with the
profile's own per-stage costs.

Qi et al., ICLR 2024, arXiv 2401.10241, Section 3 and the appendix. Microbatch i's B is placed on every
rank in round i; in each round a rank decides whether it also runs one more F; pending W passes are
inserted before an F or B while the memory limit would be exceeded and to fill idle gaps, and a rank may
leave a gap idle when it is no longer than the largest bubble some rank already has (the span is a
maximum over ranks, so a smaller bubble elsewhere costs nothing). Unlike the paper's runtime, which
replaced per-stage times by their medians and ignored memory differences between stages, every time,
hop and memory figure is the profile's own for that stage.

Phases, as `RoundsEngine.run` calls them: the warm-up (microbatch 0 goes down while every rank runs its
warm-up forwards, then its B comes back), one steady round per further microbatch, the drain (every W
still held).
"""

from __future__ import annotations

from ...core.ir import Kind
from ...sim.rank_state import ChunkProgress, RankClock
from ..problem import Problem
from .options import CannotFit, EngineResult, GreedyOptions, Step, fits


class RoundsEngine:
    """One run of the rounds engine. Passes of one kind run in microbatch order on every rank, so the
    state is one `ChunkProgress` (counts and end times) and one `RankClock` per rank; each pass is
    timed as soon as its rank is free and its input has arrived, as the simulator will time it."""

    def __init__(self, problem: Problem, options: GreedyOptions) -> None:
        p, m = problem.num_ranks, problem.num_microbatches
        self.p, self.m, self.opt = p, m, options
        self.chunks = [ChunkProgress(cost, m) for cost in problem.chunk_costs]
        self.clocks = [RankClock() for _ in range(p)]
        self.cap = list(problem.limit.per_rank)
        # hop[j]: activation j -> j+1 and its gradient j+1 -> j (the link time between them).
        self.hop = [problem.hop(j, j + 1) for j in range(p - 1)]
        self.order: list[list[Step]] = [[] for _ in range(p)]
        self.peak = [0.0] * p
        self.worst_idle = 0.0       # the largest idle time of any rank so far (idle times only grow)

    def run(self) -> EngineResult:
        self.warm_up()
        for i in range(1, self.m):
            self.steady_round(i)
        self.drain()
        return EngineResult.from_clocks(self.order, self.clocks, self.peak)

    # -- phases -----------------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Round 0: microbatch 0's F on every rank, each rank's warm-up forwards, then B0 back up."""
        for j in range(self.p):
            self.put(j, Kind.F)
        counts = self._warmup_forwards()
        for j in range(self.p):
            for _ in range(counts[j]):
                self.put(j, Kind.F)
        for j in range(self.p - 1, -1, -1):
            self.put(j, Kind.B)

    def steady_round(self, i: int) -> None:
        """Round i: the forwards this round runs (top down), then microbatch i's B (bottom up)."""
        forwards = self._round_forwards()
        for j in range(self.p):
            if not forwards[j]:
                continue
            self.make_room(j, 1)
            if j > 0:
                self.fill_gap(j, self.chunks[j - 1].f_end[self.chunks[j].forwards] + self.hop[j - 1])
            self.put(j, Kind.F)
        for j in range(self.p - 1, -1, -1):
            chunk = self.chunks[j]
            if chunk.backwards != i or chunk.forwards <= i:
                raise CannotFit
            if j + 1 < self.p:
                self.fill_gap(j, self.chunks[j + 1].b_end[i] + self.hop[j])
            if j == 0 and chunk.forwards == self.m:
                # Rank 0 has nothing left to forward: every gap until its last B is drain, so
                # clear the held W now rather than leave them all to the tail of its span.
                while chunk.weights < chunk.backwards:
                    self.put(j, Kind.W)
            self.put(j, Kind.B)

    def drain(self) -> None:
        for j in range(self.p):
            while self.chunks[j].weights < self.m:
                self.put(j, Kind.W)

    # -- how many forwards ----------------------------------------------------------------------

    def _warmup_forwards(self) -> list[int]:
        """Forwards each rank runs before B0 reaches it: from the bottom up, as many as end before
        (or, with bubble_before_first_b off, start before) B0 arrives, within the limit and the cap."""
        p, opt = self.p, self.opt
        counts = [0] * p
        last = self.chunks[p - 1]
        back = last.f_end[0] + last.cost.B      # estimated end of B0 on the rank below
        for j in range(p - 2, -1, -1):
            chunk = self.chunks[j]
            t, n = self.clocks[j].free, 0
            most = self.m - chunk.forwards
            if opt.warmup is not None:
                most = min(most, opt.warmup * (p - 1 - j))
            while n < most and fits(chunk.held(n + 1), self.cap[j]):
                if opt.bubble_before_first_b:
                    if t + chunk.cost.F > back + self.hop[j]:
                        break
                elif t >= back + self.hop[j]:
                    break
                t += chunk.cost.F
                n += 1
            counts[j] = n
            back = max(t, back + self.hop[j]) + chunk.cost.B
        # A rank runs fewer warm-up forwards than the one above it (it is one hop closer to the loss),
        # unless it already holds every microbatch; never more than its predecessor has produced.
        for j in range(1, p):
            done = self.chunks[j].forwards
            while counts[j] > 0 and counts[j] >= counts[j - 1] and done + counts[j] < self.m:
                counts[j] -= 1
            counts[j] = min(counts[j], self.chunks[j - 1].forwards + counts[j - 1] - done)
        return counts

    def _round_forwards(self) -> list[int]:
        """1 for each rank that runs one more F this round, else 0."""
        p = self.p
        counts = [0] * p
        for j in range(p):
            if self.chunks[j].forwards >= self.m:
                continue
            counts[j] = 1
            if (self.opt.b_first and j + 1 < p and self.chunks[j].forwards >= self.chunks[j + 1].forwards + 2
                    and self._yields_to_coming_b(j)):
                counts[j] = 0
        # A rank runs a forward only if the one below does too: otherwise it would run further ahead.
        for j in range(p - 2, -1, -1):
            counts[j] = min(counts[j], counts[j + 1])
        return counts

    def _yields_to_coming_b(self, j: int) -> bool:
        """b_first: rank j is ahead of the one below; skip its F when that F (and the W the memory
        makes it run first) would delay this round's B by more than the bubble the rank can afford."""
        chunk, below = self.chunks[j], self.chunks[j + 1]
        free = self.clocks[j].free
        coming = self.clocks[j + 1].free + below.cost.F + below.cost.B + self.hop[j]
        if free >= coming:
            return True
        w_cost, k = 0.0, 0
        while not fits(chunk.held(1, k), self.cap[j]) and chunk.weights + k < chunk.backwards:
            w_cost += chunk.cost.W
            k += 1
        if free + chunk.cost.F + w_cost <= coming:
            return False
        return coming - free <= self._affordable_bubble(j)

    # -- placing passes ---------------------------------------------------------------------------

    def _affordable_bubble(self, j: int) -> float:
        """How much more idle time rank j may take before its span grows past the worst rank's."""
        return self.worst_idle - self.clocks[j].idle

    def put(self, j: int, kind: Kind) -> None:
        """Append the next pass of `kind` to rank j, timed as the simulator will time it."""
        chunk = self.chunks[j]
        if kind is Kind.F:
            i = chunk.forwards
            ready = self.chunks[j - 1].f_end[i] + self.hop[j - 1] if j > 0 else 0.0
            if not fits(chunk.held(1), self.cap[j]):
                raise CannotFit
        elif kind is Kind.B:
            i = chunk.backwards
            ready = self.chunks[j + 1].b_end[i] + self.hop[j] if j < self.p - 1 else chunk.f_end[i]
        else:
            ready = 0.0
        clock = self.clocks[j]
        _, end = clock.run(ready, chunk.duration(kind))
        self.worst_idle = max(self.worst_idle, clock.idle)
        i = chunk.record(kind, end)
        if kind is Kind.F:
            self.peak[j] = max(self.peak[j], chunk.held())
        self.order[j].append(Step(j, kind, i))

    def fill_gap(self, j: int, arrival: float) -> None:
        """W passes before a pass whose input arrives at `arrival`: every W that ends by then, then
        one more if the remaining gap is larger than the bubble this rank may still afford (or
        always, with w_fill)."""
        chunk, clock = self.chunks[j], self.clocks[j]
        while chunk.weights < chunk.backwards and clock.free + chunk.cost.W <= arrival:
            self.put(j, Kind.W)
        if chunk.weights < chunk.backwards and clock.free < arrival:
            if arrival - clock.free > self._affordable_bubble(j) or self.opt.w_fill:
                self.put(j, Kind.W)

    def make_room(self, j: int, more_forwards: int) -> None:
        """W passes until `more_forwards` further F fit under rank j's limit."""
        chunk = self.chunks[j]
        while not fits(chunk.held(more_forwards), self.cap[j]):
            if chunk.weights >= chunk.backwards:
                raise CannotFit
            self.put(j, Kind.W)
