"""A training step's time: the pipeline's makespan and what data parallelism and the optimizer add to it.

Overlap rules (docs/whole-run.md), per pipeline rank r of a plan, from the simulated timeline:

- start: the weights' gather that r's first forward needs (fsdp: at the step's start; zero1, zero2: after
  the previous step's optimizer) overlaps r's wait for its first input, `first_start(r)`; what exceeds it,
  max(0, start_r - first_start(r)), is exposed. Rank 0 starts at once, so it pays its whole gather.
- end: r's gradient sync starts after its last pass, and after the syncs it has running since its first
  gradient (zero2's per-microbatch reduce-scatters, one link, one at a time), and overlaps the rank's
  idle tail to the makespan: exposed max(0, max(last_end(r), first_gradient(r) + mid_r) + final_r - makespan).
- the optimizer step runs on every rank at once after the syncs: the slowest rank's.

step = makespan + max_r exposed start + max_r exposed end + max_r optimizer. Times in microseconds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from ...core.errors import PlanError
from ...core.ir import Kind, Schedule
from ...core.layers import Layer
from ...core.planned_profile import for_plan
from ...sim.simulate import Timeline, simulate
from .cost import ShapeCosts
from .data_parallel import RankTraffic


@dataclass(frozen=True)
class RankStep:
    """One pipeline rank's figures for the step (microseconds): when its first pass starts, its first
    gradient is ready and its last pass ends; its data-parallel terms and what of them is exposed."""

    rank: int
    first_start_us: float
    first_gradient_us: float
    last_end_us: float
    traffic: RankTraffic
    exposed_start_us: float
    exposed_end_us: float

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["traffic"] = self.traffic.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RankStep":
        return cls(**{**data, "traffic": RankTraffic(**data["traffic"])})


@dataclass(frozen=True)
class StepTime:
    """A step's time and its terms (microseconds; `step_seconds` in seconds)."""

    makespan_us: float
    exposed_start_us: float
    exposed_end_us: float
    optimizer_us: float
    ranks: tuple[RankStep, ...]

    @property
    def step_us(self) -> float:
        return self.makespan_us + self.exposed_start_us + self.exposed_end_us + self.optimizer_us

    @property
    def step_seconds(self) -> float:
        return self.step_us / 1e6

    def to_dict(self) -> dict[str, Any]:
        return {"step_us": self.step_us, "makespan_us": self.makespan_us, "exposed_start_us": self.exposed_start_us,
                "exposed_end_us": self.exposed_end_us, "optimizer_us": self.optimizer_us,
                "ranks": [r.to_dict() for r in self.ranks]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StepTime":
        return cls(data["makespan_us"], data["exposed_start_us"], data["exposed_end_us"], data["optimizer_us"],
                   tuple(RankStep.from_dict(r) for r in data["ranks"]))


def rank_step(rank: int, first_start: float, first_gradient: float, last_end: float, makespan: float,
              traffic: RankTraffic) -> RankStep:
    """A rank's exposed start and end under the overlap rules (see the module)."""
    end = max(last_end, first_gradient + traffic.mid) + traffic.final
    return RankStep(rank, first_start, first_gradient, last_end, traffic, max(0.0, traffic.start - first_start),
                    max(0.0, end - makespan))


def combined(makespan: float, ranks: Sequence[RankStep]) -> StepTime:
    """The step from its ranks: the makespan plus the largest exposed start, exposed end and optimizer."""
    return StepTime(makespan, max(r.exposed_start_us for r in ranks), max(r.exposed_end_us for r in ranks),
                    max(r.traffic.optimizer for r in ranks), tuple(ranks))


def rank_layers(schedule: Schedule) -> list[list[str]]:
    """The layer names each rank holds under the plan's split (a rank with two model copies lists both)."""
    split = schedule.plan.split
    if split is None:
        raise PlanError(f"schedule {schedule.name!r} records no split of the layers: plan it on a profile that "
                        "lists its layers")
    out: list[list[str]] = [[] for _ in range(schedule.num_ranks)]
    for chunk, names in enumerate(split.chunks):
        out[schedule.placement.chunk_to_rank[chunk]].extend(names)
    return out


def first_gradient(timeline: Timeline, rank: int) -> float:
    """When the rank's first weight gradient is complete (the end of its first W or fused backward)."""
    return min((s.end for s in timeline.slots[rank] for a in s.action.passes() if a.kind in (Kind.W, Kind.FULL_B)),
               default=timeline.last_end(rank))


def step_time(costs: ShapeCosts, schedule: Schedule) -> StepTime:
    """The step of `schedule` (a plan `find_plan` made on `costs.profile` with `costs.request`): its timeline
    on the profile as planned (core.planned_profile.for_plan) and the overlap rules (see the module)."""
    return timeline_step(costs, schedule, simulate(schedule, for_plan(costs.profile, schedule)))


def timeline_step(costs: ShapeCosts, schedule: Schedule, timeline: Timeline) -> StepTime:
    """step_time on the schedule's timeline, simulated already."""
    makespan = timeline.makespan
    ranks = [rank_step(r, timeline.first_start(r), first_gradient(timeline, r), timeline.last_end(r), makespan,
                       costs.traffic(names)) for r, names in enumerate(rank_layers(schedule))]
    return combined(makespan, ranks)


def step_bound(costs: ShapeCosts, pipeline_bound: float) -> float:
    """A lower bound on the step of every plan of the shape (every split, placement, schedule and recompute
    choice), under this cost model; `pipeline_bound` bounds the makespan of every such plan (the joint
    search's bound over every split and recompute choice). The step is the makespan plus the exposed end
    (together, the latest end of any rank's work or sync), the exposed start and the optimizer, so the sum of
    lower bounds on the three is one:

    - makespan + exposed end >= max(pipeline_bound, m x (F + B + W of every layer) / p) + the least final sync
      of any one layer: the p ranks run every pass of the m microbatches one at a time, each pass at least as
      profiled (recompute only adds time; a fused backward counts at its own time where shorter), so some
      rank is busy at least the average; the rank whose last pass ends at the makespan has no idle tail and
      pays its whole final sync, which moves at least the bytes of one of its layers.
    - makespan + exposed end >= every rank's first gradient + its syncs that run from then (zero2's
      per-microbatch reduce-scatters, one link, one at a time) + its final sync (sync_bound).
    - makespan + exposed start + exposed end >= every rank's start gather + work + final sync, together
      (average_rank_bound), which the three terms above take one at a time.
    - exposed start >= the start gather of the first layer alone: some pass starts at time 0, and only a
      forward of a route's first chunk waits for nothing, so a rank holding the first layer starts at 0
      and pays its whole gather, which moves at least that layer's bytes (a collective's time grows with
      its bytes).
    - optimizer >= the larger of its total over the model / p (the ranks together update every parameter,
      and the slowest rank takes at least the average) and its time on the heaviest layer (some rank
      holds it).
    """
    layers = costs.profile.layers or ()
    if not layers or math.isinf(pipeline_bound):
        return math.inf
    p, m = costs.shape.p, costs.shape.m
    work = math.fsum(_least_work(layer) for layer in layers)
    each = [costs.traffic([layer.name]) for layer in layers]
    optimizer = max(math.fsum(x.optimizer for x in each) / p, max(x.optimizer for x in each))
    busy = max(pipeline_bound, m * work / p) + min(x.final for x in each)
    return max(max(busy, sync_bound(costs)) + each[0].start, average_rank_bound(costs)) + optimizer


def _least_work(layer: Layer) -> float:
    """A microbatch's passes of one layer at their least: F, and B + W or a fused backward where shorter."""
    return layer.F + min(layer.B + layer.W, layer.BW)


def _average_share(costs: ShapeCosts) -> RankTraffic:
    """The data-parallel terms of the average share of the parameters, bandwidth terms only: a collective's
    time grows with its bytes and its bandwidth term is linear in them, so over the ranks (every layer on
    some rank, a placement with two model copies holding them twice) some rank's terms are at least these
    (no latency: a rank may hold no routed experts)."""
    dp, p = costs.data_parallel, costs.shape.p
    bandwidth_only = replace(dp, link=replace(dp.link, latency_us=0.0))
    return bandwidth_only.traffic(math.fsum(x.dense for x in costs.params) / p,
                                  math.fsum(x.expert for x in costs.params) / p)


def average_rank_bound(costs: ShapeCosts) -> float:
    """A lower bound on makespan + exposed start + exposed end over every split: for each rank r, its exposed
    start is at least its gather less its first start, the makespan at least that first start plus its work
    (its passes one at a time) and the exposed end at least its final sync past its last pass, so the three
    together hold r's gather, work and final sync in full. Their average over the ranks (each pass at its
    least time; the traffic's bandwidth terms, _average_share) bounds the largest."""
    layers = costs.profile.layers or ()
    work = math.fsum(_least_work(layer) for layer in layers)
    share = _average_share(costs)
    return share.start + costs.shape.m * work / costs.shape.p + share.final


def sync_bound(costs: ShapeCosts) -> float:
    """A lower bound on the latest end of any rank's syncs, over every split: a rank's syncs start no earlier
    than its first gradient, which needs a forward, backward and weight pass of at least one layer, and take
    mid + final of the parameters it holds. Some rank holds the heaviest layer, and some rank holds at least
    the average share of the parameters (every layer is on some rank; a placement with two model copies
    holds them twice): _average_share."""
    layers = costs.profile.layers or ()
    first_gradient = min(_least_work(layer) for layer in layers)
    each = [costs.traffic([layer.name]) for layer in layers]
    heaviest = max(x.mid + x.final for x in each)
    share = _average_share(costs)
    return first_gradient + max(heaviest, share.mid + share.final)
