"""The "chunked" greedy engine: 1F1B-style alternation on any single-route placement (V-shape,
interleaved, linear), adapting to each chunk's own times, hops and memory.

The list engine (greedy/list_engine.py) runs whatever pass is ready; on the chunked placements that lets a
rank start a forward just before a backward arrives, and the delay travels around the whole route.
This engine keeps the structure of the Zero Bubble authors' V-shape scheduler (Qi et al., ICLR 2024,
arXiv 2401.10241, section 6: the warm-up fills the V with forwards while memory and the first
backward's arrival allow, then every rank alternates one backward with one forward, and W passes fill
the gaps) on an event-driven core, so any single-route placement works:

- warm-up: a rank runs forwards (deepest chunk first) until its first backward is ready, within the
  memory limit (`greedy_memory.admits`: room stays for the oldest microbatch in flight to finish its
  forwards) and within the `warmup` cap on microbatches in flight;
- steady state: it alternates one B and one F. It waits for the pass it wants rather than run another
  forward ahead (`b_first`: a ready B may still jump ahead of an F that has not arrived);
- W passes: memory-forced ones before an F, every W that fits a gap before the awaited input, one
  that does not fit when the gap is larger than the bubble the rank can afford (`w_fill`), and with
  `w_defer` = k, a W right after its B once more than k are held back (ZB-V's steady state).

Timing and memory are zbsearch.sim.rank_state's rule, shared with the simulator and the other engines.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from ...core.errors import PreconditionError
from ...core.ir import Kind, Placement
from ...sim.rank_state import ChunkProgress, RankClock
from .memory import RouteArrivals, admits, inflight_caps, level
from ..problem import Problem
from .options import CannotFit, EngineResult, Step
from .vshape import VOptions, is_vshape, run_v


@dataclass(frozen=True)
class ChunkedOptions:
    """One variant of the chunked engine (see the module docstring).

    b_first: in the steady state, run a ready B when the F the rank wants has not arrived.
    w_fill: run a W into a gap it does not fit when the gap exceeds the bubble the rank can afford
        (the largest idle time of any rank so far, less its own).
    w_defer: None, every W waits for a gap, the memory or the drain; k, at most k W are held back per
        rank and the next W runs right after its B.
    warmup: None, a rank admits microbatches while memory allows; x, at most x times the
        microbatches it needs in flight to stay busy at the pipeline's pace
        (`greedy_memory.inflight_caps`).
    """

    engine: Literal["chunked"] = "chunked"
    b_first: bool = True
    w_fill: bool = False
    w_defer: int | None = None
    warmup: float | None = None

    @property
    def label(self) -> str:
        parts = [self.engine, "b-first" if self.b_first else "alternate", "w-fill" if self.w_fill else "w-fit"]
        if self.w_defer is not None:
            parts.append(f"w-defer={self.w_defer}")
        if self.warmup is not None:
            parts.append(f"warmup={self.warmup:g}")
        return ",".join(parts)


class ChunkedEngine(RouteArrivals):
    """One run: a `ChunkProgress` per route position, a `RankClock` per rank, each rank's held W
    (route positions, in B order), whether it has started its steady state and what it wants next."""

    def __init__(self, problem: Problem, options: ChunkedOptions) -> None:
        placement, m = problem.placement, problem.num_microbatches
        if len(placement.routes) != 1:
            raise PreconditionError(
                f"the chunked greedy needs a placement with a single route; {placement.name!r} has "
                f"{len(placement.routes)}: use a linear, interleaved or V-shape placement")
        p = placement.num_ranks
        self.m, self.opt = m, options
        self.route = route = placement.routes[0]
        n = len(route)
        self.rank_of = [placement.chunk_to_rank[c] for c in route]
        self.chunks = [ChunkProgress(problem.chunk_costs[c], m) for c in route]
        self.hop = [problem.hop(route[k], route[k + 1]) for k in range(n - 1)]
        self.on_rank = [[k for k in range(n) if self.rank_of[k] == r] for r in range(p)]
        self.cap = list(problem.limit.per_rank)
        self.inflight_cap = [math.inf] * p
        if options.warmup is not None:
            self.inflight_cap = inflight_caps(self.chunks, self.hop, self.on_rank, m, options.warmup)
        self.clocks = [RankClock() for _ in range(p)]
        self.pending_w: list[deque[int]] = [deque() for _ in range(p)]
        self.want = [Kind.F] * p
        self.steady = [False] * p
        self.order: list[list[Step]] = [[] for _ in range(p)]
        self.peak = [0.0] * p
        self.worst_idle = 0.0
        self.heap: list[tuple[float, int]] = [(0.0, r) for r in range(p)]
        self.total = 3 * n * m
        self.done = 0
        self.relaxed = False

    def run(self) -> EngineResult:
        while self.done < self.total:
            if not self.heap:
                if self.relaxed:
                    raise CannotFit
                # Every rank waits for a pass only another waiting rank could enable: let each run
                # whatever is ready from now on (the list engine's rule) rather than give up.
                self.relaxed = True
                self.heap = [(c.free, r) for r, c in enumerate(self.clocks)]
                heapq.heapify(self.heap)
            t, r = heapq.heappop(self.heap)
            if t >= self.clocks[r].free:
                self.decide(r, t)
        return EngineResult.from_clocks(self.order, self.clocks, self.peak)

    # -- the decision ---------------------------------------------------------------------------

    def decide(self, r: int, now: float) -> None:
        ready_b = self._ready(r, Kind.B, now)
        ready_f = [k for k in self._ready(r, Kind.F, now) if self.admissible(r, k)]
        want = self._wanted(r, ready_b)
        if self.opt.w_defer is not None and len(self.pending_w[r]) > self.opt.w_defer:
            self.run_pass(r, self.pending_w[r][0], Kind.W, now)
        elif want is Kind.B and ready_b:
            self.run_pass(r, ready_b[0], Kind.B, now)
        elif want is Kind.F and ready_f:
            self.run_pass(r, ready_f[0], Kind.F, now)
        elif ready_b and (self.opt.b_first or self.relaxed or not self._f_can_come(r)):
            self.run_pass(r, ready_b[0], Kind.B, now)
        elif ready_f and self.relaxed:
            self.run_pass(r, ready_f[0], Kind.F, now)
        elif self.pending_w[r] and self._w_now(r, want, now):
            self.run_pass(r, self.pending_w[r][0], Kind.W, now)
        else:
            self.sleep(r, now)

    def _wanted(self, r: int, ready_b: list[int]) -> Kind:
        """The kind rank r runs next: forwards in the warm-up until a B is ready (or the cap), then
        alternately B and F; an F whenever no B can come without one, a B once no F is left."""
        if not self._b_can_come(r):
            return Kind.F
        if not self.steady[r]:
            return Kind.B if ready_b or not self._f_left(r) else Kind.F
        if not self._f_left(r):
            return Kind.B
        return self.want[r]

    def _w_now(self, r: int, want: Kind, now: float) -> bool:
        """Whether a held W runs now: memory forces it before the next F, it fits the gap before the
        wanted pass arrives, or (w_fill) the gap is larger than the bubble the rank can afford."""
        if want is Kind.F and any(self.admissible_after_w(r, k) for k in self._ready(r, Kind.F, now)):
            return True
        w = self.chunks[self.pending_w[r][0]].cost.W
        free = self.clocks[r].free
        arrival = self.arrival_estimate(r, want)
        if free + w <= arrival:
            return True
        if not self._f_left(r) and not self._b_can_come(r):
            return True         # nothing else will ever run here: the drain
        affordable = self.worst_idle - self.clocks[r].idle
        return self.opt.w_fill and arrival - free > affordable

    # -- what can run ---------------------------------------------------------------------------

    def _ready(self, r: int, kind: Kind, now: float) -> list[int]:
        """Route positions on rank r whose next pass of `kind` has its inputs by `now`, deepest first."""
        get = self.f_arrival if kind is Kind.F else self.b_arrival
        return sorted((k for k in self.on_rank[r] if (a := get(k)) is not None and a <= now), reverse=True)

    def _f_left(self, r: int) -> bool:
        return any(self.chunks[k].forwards < self.m for k in self.on_rank[r])

    def _b_can_come(self, r: int) -> bool:
        """Whether some B of rank r can become ready without it running another forward: a microbatch
        that has run its last forward chunk here and still owes a backward here."""
        last = self.on_rank[r][-1]
        done = self.chunks[last].forwards
        return any(self.chunks[k].backwards < done for k in self.on_rank[r])

    def _f_can_come(self, r: int) -> bool:
        return self._f_left(r) and any(self.chunks[k].forwards < self.m and self.admissible(r, k)
                                       for k in self.on_rank[r])

    def arrival_estimate(self, r: int, kind: Kind) -> float:
        """Earliest the next pass of `kind` on rank r can have its input: a known arrival, else the
        producer's rank free time plus the producer's duration and the hop (a lower bound)."""
        best = math.inf
        for k in self.on_rank[r]:
            chunk = self.chunks[k]
            if kind is Kind.F:
                a = self.f_arrival(k)
                if a is None and chunk.forwards < self.m and k > 0 and self.admissible(r, k):
                    a = self.clocks[self.rank_of[k - 1]].free + self.chunks[k - 1].cost.F + self.hop[k - 1]
            else:
                a = self.b_arrival(k)
                if a is None and chunk.backwards < chunk.forwards and k < len(self.chunks) - 1:
                    a = self.clocks[self.rank_of[k + 1]].free + self.chunks[k + 1].cost.B + self.hop[k]
            if a is not None:
                best = min(best, a)
        return best

    # -- memory -----------------------------------------------------------------------------------

    def level(self, r: int) -> float:
        return level(self.chunks, self.on_rank[r])

    def admissible(self, r: int, k: int, freed: float = 0.0) -> bool:
        entry = self.chunks[self.on_rank[r][0]]
        if k == self.on_rank[r][0] and entry.forwards - entry.backwards >= self.inflight_cap[r]:
            return False
        return admits(self.chunks, self.on_rank[r], k, self.cap[r], freed)

    def admissible_after_w(self, r: int, k: int) -> bool:
        if self.chunks[k].forwards >= self.m:
            return False
        return self.admissible(r, k, sum(self.chunks[q].cost.mem_W for q in self.pending_w[r]))

    # -- placing passes ---------------------------------------------------------------------------

    def run_pass(self, r: int, k: int, kind: Kind, now: float) -> None:
        """Append a pass to rank r, timed as the simulator times it (a W starts where the rank's
        gap began: its B ended before the rank became free)."""
        if kind is Kind.W:
            k = self.pending_w[r].popleft()
            ready = 0.0
        else:
            arrival = self.f_arrival(k) if kind is Kind.F else self.b_arrival(k)
            assert arrival is not None, "a pass runs once its input has arrived"
            ready = arrival
            if self.steady[r]:
                self.want[r] = Kind.F if kind is Kind.B else Kind.B
            elif kind is Kind.B:
                self.steady[r], self.want[r] = True, Kind.F
        chunk = self.chunks[k]
        _, end = self.clocks[r].run(ready, chunk.duration(kind))
        self.worst_idle = max(self.worst_idle, self.clocks[r].idle)
        i = chunk.record(kind, end)
        if kind is Kind.F:
            self.peak[r] = max(self.peak[r], self.level(r))
            if k + 1 < len(self.chunks):
                heapq.heappush(self.heap, (end + self.hop[k], self.rank_of[k + 1]))
        elif kind is Kind.B:
            self.pending_w[r].append(k)
            if k > 0:
                heapq.heappush(self.heap, (end + self.hop[k - 1], self.rank_of[k - 1]))
        self.order[r].append(Step(self.route[k], kind, i))
        heapq.heappush(self.heap, (max(end, now), r))
        self.done += 1

    def sleep(self, r: int, now: float) -> None:
        known = [a for k in self.on_rank[r] for a in (self.f_arrival(k), self.b_arrival(k))
                 if a is not None and a > now]
        if known:
            heapq.heappush(self.heap, (min(known), r))


# -- the family on the chunked placements -----------------------------------------------------------

# Above this many passes the family keeps to the variants that win on large schedules (the V at 1p
# on the paper's p=16 and 32 models); each variant costs about 0.5 s at p=32, m=96 on the V.
FEW_VARIANTS_PASSES = 10_000


def chunked_variants(placement: Placement, extra: bool = True, m: int | None = None) -> list[Any]:
    """The variants `heuristics.candidates` tries on a chunked single-route placement (interleaved,
    V-shape): the v-rounds engine's on the V, then this engine's. Chosen on the paper's profiles and
    heterogeneous ones at 0.5p to 2p, where each is the best of the family on some of them."""
    out: list[Any] = []
    if len(placement.routes) != 1 or placement.num_chunks == placement.num_ranks:
        return out
    large = m is not None and 3 * m * placement.num_chunks > FEW_VARIANTS_PASSES
    if is_vshape(placement):
        out += [VOptions(), VOptions(fill_f=False), VOptions(safe_admit=True)]
        if extra and not large:
            out += [VOptions(b_first=False), VOptions(fill_b=False)] + [VOptions(warmup=k) for k in (1.0, 1.5, 2.0)]
    if large:
        return out
    out += [ChunkedOptions(b_first=False, w_defer=0, warmup=1.5), ChunkedOptions(b_first=True, w_fill=True)]
    if extra:
        out += [ChunkedOptions(b_first=False, w_defer=0, warmup=1.25),
                ChunkedOptions(b_first=False, w_fill=True, w_defer=0, warmup=2.0),
                ChunkedOptions(b_first=False, w_fill=True, warmup=1.0),
                ChunkedOptions(b_first=False, w_fill=True, w_defer=1, warmup=1.0),
                ChunkedOptions(b_first=True, w_fill=True, w_defer=1), ChunkedOptions(b_first=False, w_fill=True, warmup=2.0)]
    return out


CHUNKED_ENGINES = ("chunked", "v-rounds")


def run_chunked(problem: Problem, options: Any) -> EngineResult:
    """Run the chunked engine or, for a `VOptions` variant, the v-rounds engine."""
    if options.engine == "v-rounds":
        return run_v(problem, options)
    return ChunkedEngine(problem, options).run()
