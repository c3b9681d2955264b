"""The timing and memory rule of one rank, written once: the simulator and the greedy engines both
advance these objects pass by pass.

Timing: a pass starts when its rank is free and its inputs have arrived, and ends its duration later
(`RankClock.run`). Memory, the Zero Bubble paper's rule: a microbatch holds mem_B on a chunk from the
start of its F to the end of its B, then mem_W until the end of its W; a full backward frees mem_B at
its end. Under the torch-runtime memory model (core/calibration.py) mem_W may exceed mem_B (B then
raises the level at its end), and on the loss chunk `mem_kept` stays after W until the iteration ends. The simulator follows the rule as events in time (`memory_delta`, summed along the rank).
The greedy engines, which must decide whether one more forward fits under a limit, apply it to counts
(`ChunkProgress.held`): the level is rebuilt from integer counts rather than summed, so a schedule that
sits exactly on its limit compares exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..core.ir import Kind
from ..core.stage_cost import StageCost


@dataclass(slots=True)
class RankClock:
    """When a rank is free again, when it started its first pass, and how long it sat idle since."""

    free: float = 0.0
    first_start: float | None = None
    idle: float = 0.0

    def run(self, ready: float, duration: float) -> tuple[float, float]:
        """Run one pass whose inputs have all arrived at `ready`; return its (start, end)."""
        start = max(self.free, ready)
        if self.first_start is None:
            self.first_start = start
        else:
            self.idle += start - self.free
        self.free = start + duration
        return start, self.free


def overlap_time(passes: Iterable[tuple[StageCost, Kind]]) -> float:
    """Time of an overlapped F&B pair: each pass's own time times its chunk's overlap ratio (the
    profile's pair time over F + full backward), so the sum when the profile gives no pair time."""
    total = 0.0
    for cost, kind in passes:
        total += cost.time_of(kind) * cost.overlap_ratio
    return total


def memory_delta(cost: StageCost, kind: Kind) -> tuple[float, float]:
    """(allocated at start, freed at end) for one pass of this kind."""
    kept = cost.mem_kept or 0.0  # after W, held until the iteration ends (calibration.running_cost)
    return {
        Kind.F: (cost.mem_B, 0.0),
        Kind.B: (0.0, cost.mem_B - cost.mem_W),
        Kind.W: (0.0, cost.mem_W - kept),
        Kind.FULL_B: (0.0, cost.mem_B),  # a fused backward frees its whole graph
    }[kind]


@dataclass(slots=True)
class ChunkProgress:
    """One chunk's passes so far (each kind runs in microbatch order on a chunk), when each of its F
    and B passes ended (-1 until it runs), and the activation memory they hold."""

    cost: StageCost
    num_microbatches: int
    forwards: int = 0
    backwards: int = 0
    weights: int = 0
    fused: int = 0  # of the backwards and weights, those run as one fused backward (it keeps no mem_kept)
    f_end: list[float] = field(init=False)
    b_end: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.f_end = [-1.0] * self.num_microbatches
        self.b_end = [-1.0] * self.num_microbatches

    def held(self, more_forwards: int = 0, fewer_weights: int = 0) -> float:
        """Memory held now, or after `more_forwards` further F and `fewer_weights` further W passes."""
        waiting_b = self.forwards + more_forwards - self.backwards
        waiting_w = self.backwards - self.weights - fewer_weights
        done = (self.weights - self.fused + fewer_weights) * (self.cost.mem_kept or 0.0)
        return waiting_b * self.cost.mem_B + waiting_w * self.cost.mem_W + done

    def duration(self, kind: Kind) -> float:
        return self.cost.time_of(kind)

    def record(self, kind: Kind, end: float) -> int:
        """Count one more pass of `kind` that ended at `end`; return its microbatch."""
        if kind is Kind.F:
            i = self.forwards
            self.forwards += 1
            self.f_end[i] = end
        elif kind in (Kind.B, Kind.FULL_B):
            i = self.backwards
            self.backwards += 1
            self.b_end[i] = end
            if kind is Kind.FULL_B:  # B and W at once
                self.weights += 1
                self.fused += 1
        else:
            i = self.weights
            self.weights += 1
        return i
