"""What a greedy variant is (`GreedyOptions`) and what a greedy engine hands back (`EngineResult`).

Both engines (greedy_rounds, greedy_list) keep their memory levels with zbsearch.sim.rank_state's
`ChunkProgress.held` and time passes with its `RankClock`, the simulator's own rule; `fits` is the one
comparison of a level against a rank's limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from ...core.ir import Action, B, F, Kind, overlap
from ...core.objective import Objective
from ...sim.rank_state import RankClock

# Relative slack when comparing a memory level to a limit. Levels are rebuilt from integer pass counts
# times the profile's figures, so the only round-off is one multiply-add per chunk; the validator
# allows 1e-9, we allow far less so a greedy schedule always passes it.
_MEM_RTOL = 1e-12


def fits(level: float, cap: float) -> bool:
    """Whether an activation level stays within a rank's limit (to the last round-off, no more)."""
    return level <= cap * (1 + _MEM_RTOL) + 1e-15


class CannotFit(Exception):
    """A variant painted itself into a corner (no pending W left to free memory). Internal: the
    caller turns it into an InfeasibleError naming the variant and the limit."""


WMode = Literal["fill", "fit", "eager", "fused"]  # RankPolicy.w_mode


@dataclass(frozen=True)
class RankPolicy:
    """The list engine's choices on one rank (greedy/tune.py searches them rank by rank).

    inflight: the most microbatches in flight on the rank (per route entering it); None: memory only.
    b_first: prefer a ready B over a ready F.
    w_mode: "fill" runs a pending W into any idle gap, "fit" only into gaps it fits, "eager" runs
        each W as soon as the rank is free after its B (before any F or B), which frees memory at once;
        "fused" runs B and W as one fused backward, which never holds more than its F took: under torch's
        runtime a B alone leaves more held (mem_W > mem_B), and where memory binds only fused schedules fit.
    """

    inflight: int | None = None
    b_first: bool = False
    w_mode: WMode = "fill"


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
    pairs: list engine: run a ready F and a ready B together as one overlapped F&B pair whenever both
        are there. Offered only when the profile gives the pair's time (`overlap_f_b`); otherwise a
        pair costs exactly its two passes and gains nothing.
    by_route: list engine on a placement with several routes (DualPipe's): admit a microbatch's memory
        at its route's start, on every rank of the route at once, which never deadlocks; off, rank by
        rank as on one route, which packs tighter but can deadlock two opposite routes (the variant is
        then dropped).
    fused: list engine: every backward as one fused pass, B and W together (RankPolicy's "fused" W mode).
    """

    engine: Literal["rounds", "list"] = "rounds"
    bubble_before_first_b: bool = False
    b_first: bool = False
    w_fill: bool = True
    warmup: int | None = None
    pairs: bool = False
    by_route: bool = False
    ranks: tuple[RankPolicy, ...] | None = None
    fused: bool = False

    def policy(self, rank: int, route_position: int, num_ranks: int) -> RankPolicy:
        """The list engine's choices on `rank`, which a route enters at `route_position`."""
        if self.ranks is not None:
            return self.ranks[rank]
        inflight = None if self.warmup is None else max(1, self.warmup * (num_ranks - route_position))
        return RankPolicy(inflight, self.b_first, "fused" if self.fused else "fill" if self.w_fill else "fit")

    @property
    def label(self) -> str:
        parts: list[str] = [self.engine]
        if self.ranks is not None:
            return f"{self.engine},per-rank" + (",f&b-pairs" if self.pairs else "") + (",admit-by-route" if self.by_route else "")
        if self.engine == "rounds":
            parts.append("bubble-ok" if self.bubble_before_first_b else "no-bubble")
        parts.append("b-first" if self.b_first else "f-first")
        parts.append("fused-bw" if self.fused else "w-fill" if self.w_fill else "w-fit")
        if self.warmup is not None:
            parts.append(f"warmup={self.warmup}")
        if self.pairs:
            parts.append("f&b-pairs")
        if self.by_route:
            parts.append("admit-by-route")
        return ",".join(parts)


class Step(NamedTuple):
    """One entry of an engine's order: a pass (chunk, kind, microbatch), or an overlapped F&B pair (kind
    OVERLAP: the F's chunk and microbatch, then the B's in `b_chunk`, `b_microbatch`)."""

    chunk: int
    kind: Kind
    microbatch: int
    b_chunk: int = -1
    b_microbatch: int = -1

    def action(self) -> Action:
        if self.kind is Kind.OVERLAP:
            return overlap(F(self.chunk, self.microbatch), B(self.b_chunk, self.b_microbatch))
        return Action(self.chunk, self.kind, self.microbatch)


@dataclass
class EngineResult:
    """An engine's per-rank orders and its own as-soon-as-possible timing of them (the same times
    zbsearch.sim.simulate computes), used to rank variants before paying for validation."""

    order: list[list[Step]]  # per rank, in the order it runs them
    first_start: list[float]
    last_end: list[float]
    peak: list[float]       # highest activation level per rank, in the profile's memory unit

    @classmethod
    def from_clocks(cls, order: list[list[Step]], clocks: list[RankClock],
                    peak: list[float]) -> "EngineResult":
        starts = [0.0 if c.first_start is None else c.first_start for c in clocks]
        return cls(order, starts, [c.free for c in clocks], peak)

    def cost(self, objective: Objective | str) -> float:
        if Objective.parse(objective) is Objective.MAKESPAN:
            return max(self.last_end)
        return max(e - s for s, e in zip(self.first_start, self.last_end))
