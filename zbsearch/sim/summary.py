"""What a schedule costs on a profile, as a typed record (the CLI's --json and every table read this).

Times are in the profile's time unit. Memory per rank is in units of that rank's whole-stage mem_B (a
chunk of a 2-chunk schedule holding one microbatch counts 0.5); `peak_memory_bytes_per_rank` is set
only when the profile's memory is in bytes. `static_bytes_per_rank` counts every parameter copy a rank
holds (both on DualPipe's placement), when the profile gives static bytes.

Where the bubble comes from. With T the objective's time (the makespan, or the span), p ranks and
work_r the sum of rank r's pass times in one iteration:

    bubble         = 1 - sum(work) / (p T)          (bubble_rate_makespan, bubble_rate_span)
    imbalance      = 1 - mean(work) / max(work)     (the stage split: no schedule removes it)
    schedule share = bubble - imbalance             (schedule_share_makespan, schedule_share_span)

Every rank works within the iteration, so T >= max(work) and the schedule share is never negative;
it is computed as mean(work) (T - max(work)) / (max(work) T), the same figure without the rounding of
a difference. The imbalance does not depend on T, so both objectives share it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Sequence

from ..core.memory import MemoryLimit
from .simulate import Timeline
from ..core.objective import Objective

# Written by to_dict only when set, after every other key (the JSON has them only when asked for).
_OPTIONAL_KEYS = ("memory_curve_per_rank", "reason", "static_sharding")


@dataclass(frozen=True)
class Summary:
    """One schedule simulated on one profile. `to_dict()` is the JSON object, key for key."""

    schedule: str
    placement: str
    ranks: int
    stages: int
    microbatches: int
    profile: str
    time_unit: str
    makespan: float
    span: float
    bubble_rate_makespan: float
    bubble_rate_span: float
    work_per_rank: list[float]
    idle_per_rank: list[float]
    span_per_rank: list[float]
    peak_memory_per_rank: list[float]
    peak_memory_bytes_per_rank: list[float] | None
    # Model replicas each rank holds (2 on DualPipe's placement), and the static bytes (parameters,
    # gradients, optimizer state) that makes per rank, every copy counted; None unless the profile
    # gives every stage's static_bytes.
    param_copies: int
    static_bytes_per_rank: list[float] | None
    mem_limit: str | None  # the limit as the user wrote it; None when none was checked
    valid: bool
    imbalance: float  # 1 - mean(work) / max(work): the bubble no schedule can remove (see the module)
    schedule_share_makespan: float  # bubble_rate_makespan - imbalance: what the schedule adds
    schedule_share_span: float  # bubble_rate_span - imbalance
    # Each rank's activation memory over time as [time, level] points, one per change (stage units).
    memory_curve_per_rank: list[list[list[float]]] | None = None
    reason: str | None = None  # why the schedule is not valid, when it is not
    memory_model: str = "paper"  # the activation accounting the peaks are in (core/calibration.py)
    static_sharding: str | None = None  # how the static bytes are sharded (core/sharding.py), None: not at all

    @property
    def peak_memory(self) -> float:
        """The busiest rank's peak, in multiples of its stage mem_B."""
        return max(self.peak_memory_per_rank)

    def bubble_rate(self, objective: Objective | str) -> float:
        """The bubble rate under `objective` (makespan or span)."""
        return self.bubble_rate_makespan if Objective.parse(objective) is Objective.MAKESPAN else self.bubble_rate_span

    def schedule_share(self, objective: Objective | str) -> float:
        """The part of the bubble under `objective` that the schedule adds to the imbalance."""
        return self.schedule_share_makespan if Objective.parse(objective) is Objective.MAKESPAN \
            else self.schedule_share_span

    def cost(self, objective: Objective | str) -> float:
        """The makespan or the span, as `objective` says."""
        return Objective.parse(objective).of(self)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict: every field in order, the optional ones only when set."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _OPTIONAL_KEYS}
        for key in _OPTIONAL_KEYS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def imbalance(work: Sequence[float]) -> float:
    """1 - mean(work) / max(work): the bubble rate left when the busiest rank never waits.

    >>> round(imbalance([2.0, 3.0, 4.0]), 6)
    0.25
    """
    heaviest = max(work, default=0.0)
    return 1.0 - sum(work) / (len(work) * heaviest) if heaviest > 0 else 0.0


def schedule_share(work: Sequence[float], cost: float) -> float:
    """bubble - imbalance when every rank is charged `cost`: mean(work) (cost - max) / (max cost).
    A cost below the heaviest rank's work (only by rounding) counts as equal to it."""
    heaviest = max(work, default=0.0)
    if heaviest <= 0 or cost <= 0:
        return 0.0
    return sum(work) / len(work) * max(0.0, cost - heaviest) / (heaviest * cost)


def summarize(
    timeline: Timeline, limit: MemoryLimit | None = None, valid: bool = True, memory_curve: bool = False,
) -> Summary:
    """The summary of a simulated schedule. With `memory_curve`, it adds each rank's activation memory
    over time as [time, level] points (stage units), one per change."""
    schedule, profile = timeline.schedule, timeline.profile
    p = timeline.num_ranks
    work = [timeline.work(r) for r in range(p)]
    peak = [timeline.peak_memory(r) for r in range(p)]
    static = profile.static_bytes_per_rank(schedule.placement)
    curve = None
    if memory_curve:
        curve = [[[t, level / profile.stage_mem_B(r)] for t, level, _ in timeline.memory[r]] for r in range(p)]
    return Summary(
        schedule=schedule.name,
        placement=schedule.placement.name,
        ranks=p,
        stages=schedule.placement.num_chunks,
        microbatches=schedule.num_microbatches,
        profile=profile.name,
        time_unit=profile.time_unit,
        makespan=timeline.makespan,
        span=timeline.span,
        bubble_rate_makespan=timeline.bubble_rate_makespan,
        bubble_rate_span=timeline.bubble_rate_span,
        work_per_rank=work,
        idle_per_rank=[timeline.makespan - w for w in work],
        span_per_rank=[timeline.span_of(r) for r in range(p)],
        peak_memory_per_rank=[peak[r] / profile.stage_mem_B(r) for r in range(p)],
        peak_memory_bytes_per_rank=peak if profile.memory_unit == "bytes" else None,
        param_copies=schedule.placement.param_copies,
        static_bytes_per_rank=None if static is None else list(static),
        mem_limit=None if limit is None else limit.text,
        valid=valid,
        imbalance=imbalance(work),
        schedule_share_makespan=schedule_share(work, timeline.makespan),
        schedule_share_span=schedule_share(work, timeline.span),
        memory_curve_per_rank=curve,
        memory_model=profile.memory_model,
        static_sharding=((profile.details.get("static") or {}).get("sharding") or {}).get("what"),
    )
