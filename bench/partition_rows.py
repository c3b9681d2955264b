"""One row of the partition study: a model, p, m and a byte cap; four ways to plan it.

- even + handcrafted: the blocks spread evenly over the chunks (embedding first, head last), then the
  fastest handcrafted schedule that fits the cap, each on its own placement;
- balanced + handcrafted: the split minimizing the heaviest chunk's time (the profiler's rule);
- balanced + zbsearch: that split, scheduled by `zbsearch solve` (linear and V-shape);
- joint: `zbsearch solve --partition auto` (split, placement and schedule searched together).

Caps are whole-rank byte caps: static bytes (parameters, gradients, Adam state) plus activations.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from zbsearch import schedules
from zbsearch.core.errors import InfeasibleError, PreconditionError, ScheduleError
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.partition import partition_profile, route_length
from zbsearch.core.profile import Profile
from zbsearch.search.options import SearchOptions
from zbsearch.search.partition.search import SplitRequest, search_splits
from zbsearch.search.partition.candidates import balanced_counts, even_counts
from zbsearch.search.partition.report import rank_totals
from zbsearch.sim.summary import imbalance as work_imbalance
from zbsearch.sim.validate import MEMORY_RTOL, validate

GiB = 2**30
PLACEMENTS = ("linear", "v")
HANDCRAFTED = ("gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "zb-v", "v-half", "v-min")


@dataclass
class Plan:
    """What one column says about a row."""

    label: str
    schedule: str = "-"
    placement: str = "-"
    counts: tuple[int, ...] = ()
    time: float = math.inf
    peak_per_rank: tuple[float, ...] = ()  # static + peak activations, bytes
    fits: bool = False
    seconds: float = 0.0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def peak(self) -> float:
        return max(self.peak_per_rank, default=math.inf)


def _counts(rule: str, prof: Profile, placement: Any) -> tuple[int, ...]:
    k = route_length(placement)
    layers = prof.layers or ()
    return even_counts(layers, k) if rule == "even" else balanced_counts(layers, k)


def imbalance(tl: Any) -> float:
    """1 - mean rank work / the busiest rank's: the bubble the split alone forces."""
    return work_imbalance([tl.work(r) for r in range(tl.num_ranks)])


def handcrafted(prof: Profile, p: int, cap: str, rule: str) -> Plan:
    """The fastest handcrafted schedule that fits `cap` on the `rule` split of its own placement."""
    t0 = time.monotonic()
    best = Plan(f"{rule} + handcrafted")
    closest: tuple[float, str] | None = None
    m = prof.microbatches
    for name in HANDCRAFTED:
        try:
            sched = schedules.generate(name, p, m)
        except PreconditionError:
            continue
        counts = _counts(rule, prof, sched.placement)
        split = partition_profile(prof, sched.placement, counts)
        limit = parse_mem_limit(cap, split)
        try:
            tl = validate(sched, split, None)
        except ScheduleError:
            continue
        assert tl is not None
        peaks = tuple(rank_totals(tl))
        over = max(tl.peak_memory(r) - limit.per_rank[r] * (1 + MEMORY_RTOL) for r in range(p))
        if over > 0:
            if closest is None or max(peaks) < closest[0]:
                closest = (max(peaks), name)
            continue
        if tl.makespan < best.time:
            best = Plan(best.label, name, sched.placement.name, counts, tl.makespan, peaks, True,
                        extra={"imbalance": imbalance(tl)})
    if not best.fits and closest is not None:
        best.note = f"none fits; the leanest, {closest[1]}, needs {closest[0] / GiB:.1f} GiB"
    best.seconds = time.monotonic() - t0
    return best


def searched(prof: Profile, p: int, cap: str, rule: str, time_limit: float) -> Plan:
    """`zbsearch solve` on the `rule` split (or the joint search for rule auto), linear and V."""
    t0 = time.monotonic()
    label = "joint search" if rule == "auto" else f"{rule} + zbsearch"
    try:
        res = search_splits(SplitRequest(prof, p, PLACEMENTS, cap, "makespan", rule), SearchOptions(time_limit=time_limit))
    except InfeasibleError as exc:
        return Plan(label, note=f"infeasible: {exc}", seconds=time.monotonic() - t0)
    part = res.details.partition
    assert part is not None
    plan = Plan(label, res.schedule.name, res.problem.placement.name,
                part.facts.layers_per_chunk, res.objective, tuple(rank_totals(res.timeline)),
                all(r.fits for r in part.facts.ranks), time.monotonic() - t0)
    plan.extra = {"any_split_bound": part.any_split_bound, "status": res.status,
                  "imbalance": imbalance(res.timeline), "origin": part.origin or rule,
                  "by_placement": part.any_split_bound_by_placement,
                  "own_split_bound": part.own_split_bound, "splits_scored": part.splits_scored}
    return plan


def tight_cap(prof: Profile, p: int) -> float:
    """A cap the time-balanced split with 1F1B does not fit on rank 0: 90% of what it needs there,
    rounded down to a whole GiB."""
    sched = schedules.generate("1f1b", p, prof.microbatches)
    split = partition_profile(prof, sched.placement, _counts("balanced", prof, sched.placement))
    tl = validate(sched, split, None)
    assert tl is not None
    return math.floor(0.9 * rank_totals(tl)[0] / GiB)
