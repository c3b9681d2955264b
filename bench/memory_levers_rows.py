"""One row of the memory-levers study: a model, p, a whole-rank byte cap and a sharding; six ways to plan it.

1. joint, no recompute: `zbsearch solve --partition auto` (split, placement and schedule together);
2. full + handcrafted: every block recomputed (the Megatron/torchtitan habit), the time-balanced split, the
   fastest handcrafted schedule that fits;
3. selective + handcrafted: the same with Korthikanti et al.'s selective recompute where layers list it;
4. full, joint: every block recomputed, the joint search;
5. per rank: `--recompute auto-layers` (which layers each rank recomputes, on every microbatch), walking
   from 1 and 4;
6. per microbatch: `--recompute auto` (and which microbatches need it), walking from 1 and 4.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

from partition_rows import GiB, Plan, handcrafted, imbalance
from zbsearch.core.errors import InfeasibleError, ProfileError
from zbsearch.core.partition import partition_profile
from zbsearch.core.placement import parse_placement
from zbsearch.core.profile import Profile
from zbsearch.core.recompute.levels import parse_recompute, with_recompute
from zbsearch.core.sharding import Sharding
from zbsearch.core.static_bytes import shard_profile
from zbsearch.profiling.build import profile_estimate
from zbsearch.profiling.request import PipelineSetup, StageSplit
from zbsearch.search.options import SearchOptions
from zbsearch.search.recompute.search import everything, joint, ranks_at_cap, search_with_recompute
from zbsearch.search.partition.report import rank_totals
from zbsearch.search.partition.search import SplitRequest
from zbsearch.search.solve.report import SolveResult

PLACEMENTS = ("linear", "v")
COLUMNS = ("joint, no recompute", "full + handcrafted", "selective + handcrafted", "full, joint", "per rank",
           "per microbatch")


@dataclass(frozen=True)
class Row:
    model: str
    p: int
    cap_gib: float
    dp_shard: int | None = None
    memory_model: str = "torch-runtime"

    @property
    def label(self) -> str:
        shard = f", fsdp {self.dp_shard}" if self.dp_shard else ""
        model = "" if self.memory_model == "torch-runtime" else f", {self.memory_model} accounting"
        return f"{self.model} p={self.p} {self.cap_gib:g} GiB{shard}{model}"


def study_profile(row: Row) -> Profile:
    """The estimated H100 profile of a preset at p stages, m = 4p microbatches of one sequence, in the
    row's accounting and sharding."""
    prof = profile_estimate(row.model, "h100", StageSplit(stages=row.p), PipelineSetup(microbatches=4 * row.p),
                            memory_model=row.memory_model)
    return prof if row.dp_shard is None else shard_profile(prof, Sharding(row.dp_shard, "fsdp"))


def _per_rank(result: SolveResult) -> tuple[list[int], list[int]]:
    """Layers recomputed and (chunk, microbatch) passes that recompute, per rank."""
    assert result.details.partition is not None
    ranks = result.details.partition.facts.ranks
    return ([len(r.recompute.get("recomputed", [])) for r in ranks],
            [sum(r.recompute.get("recomputed_microbatches", [])) for r in ranks])


def from_result(label: str, result: SolveResult, seconds: float) -> Plan:
    part = result.details.partition
    assert part is not None
    layers, passes = _per_rank(result)
    return Plan(label, result.schedule.name, result.problem.placement.name, part.facts.layers_per_chunk,
                result.objective, tuple(rank_totals(result.timeline)),
                all(r.fits for r in part.facts.ranks), seconds,
                extra={"imbalance": imbalance(result.timeline), "bound": result.lower_bound,
                       "layers_recomputed": layers, "microbatches_recomputed": passes,
                       "at_cap": list(ranks_at_cap(result.problem, result.timeline))})


def _joint(label: str, request: SplitRequest, seconds: float) -> tuple[Plan, SolveResult | InfeasibleError]:
    t0 = time.monotonic()
    found = joint(request, SearchOptions(time_limit=seconds))
    if isinstance(found, InfeasibleError):
        return Plan(label, note=f"infeasible: {found}", seconds=time.monotonic() - t0), found
    return from_result(label, found, time.monotonic() - t0), found


def _handcrafted(label: str, prof: Profile, row: Row, level: str) -> Plan:
    try:
        levels = parse_recompute(level, prof.layers or ())
    except ProfileError:  # no layer lists the level
        return Plan(label, note=f"no layer lists {level} (the estimate's attention is fused: sdpa keeps no s x s "
                                "matrix to drop)")
    plan = replace(handcrafted(with_recompute(prof, levels, restage=False), row.p, f"{row.cap_gib:g}GiB", "balanced"),
                   label=label)
    chunks = _rank_chunks(prof, plan)
    plan.extra.update({
        "layers_recomputed": [sum(name in levels for chunk in mine for name in chunk) for mine in chunks],
        "microbatches_recomputed": [prof.microbatches * sum(any(name in levels for name in chunk) for chunk in mine)
                                    for mine in chunks]})
    return plan


def _rank_chunks(prof: Profile, plan: Plan) -> list[list[list[str]]]:
    """Per rank, the layer names of each of its chunks under a handcrafted plan's split."""
    if not plan.counts:
        return []
    pl = parse_placement(plan.placement, len(prof.stages))
    names = partition_profile(prof, pl, plan.counts).partition
    assert names is not None
    return [[list(names[c]) for c in pl.chunks_on(r)] for r in range(pl.num_ranks)]


def _auto(label: str, request: SplitRequest, seconds: float, per_microbatch: bool,
          starts: tuple[Any, Any]) -> Plan:
    t0 = time.monotonic()
    try:
        found = search_with_recompute(request, SearchOptions(time_limit=seconds), per_microbatch=per_microbatch, starts=starts)
    except InfeasibleError as exc:
        return Plan(label, note=f"infeasible: {exc}", seconds=time.monotonic() - t0)
    return from_result(label, found, time.monotonic() - t0)


def run_row(row: Row, joint_seconds: float, walk_seconds: float, roomy_seconds: float) -> list[Plan]:
    """The six columns of one row; each plan's extra["row_bound"] is the row's bound over every split and
    every recompute choice (the larger of the two searches' own, both valid). The first column's
    extra["roomy"] is the joint search's plan without recompute under the device's whole memory (`auto`):
    where the cap's plan is slower, memory throttles it."""
    prof = study_profile(row)
    request = SplitRequest(prof, row.p, PLACEMENTS, f"{row.cap_gib:g}GiB", "makespan")
    plain, plain_found = _joint(COLUMNS[0], request, joint_seconds)
    full, full_found = _joint(COLUMNS[3], everything(request), joint_seconds)
    starts = (plain_found, full_found)
    plans = [plain, _handcrafted(COLUMNS[1], prof, row, "full"), _handcrafted(COLUMNS[2], prof, row, "selective"),
             full, _auto(COLUMNS[4], request, walk_seconds, False, starts),
             _auto(COLUMNS[5], request, walk_seconds, True, starts)]
    # Memory-throttled: without recompute, the cap costs time against the device's whole memory.
    roomy, _ = _joint("joint, no recompute, device memory", replace(request, mem_limit="auto"), roomy_seconds)
    plain.extra["roomy"] = roomy.time if roomy.fits else math.nan
    bound = max((pl.extra["bound"] for pl in plans[4:] if "bound" in pl.extra), default=math.nan)
    for plan in plans:
        plan.extra["row_bound"] = bound
    return plans


def _ms(x: float) -> float | str:
    return "" if math.isnan(x) or math.isinf(x) else round(x / 1e3, 2)


def record(row: Row, m: int, plan: Plan) -> dict[str, Any]:
    bound = plan.extra.get("row_bound")
    gap = (plan.time - bound) / plan.time if bound and plan.fits and not math.isnan(bound) else None
    return {"model": row.model, "p": row.p, "m": m, "cap_gib": row.cap_gib, "dp_shard": row.dp_shard or "",
            "memory_model": row.memory_model, "column": plan.label, "schedule": plan.schedule,
            "placement": plan.placement, "layers_per_chunk": ",".join(map(str, plan.counts)),
            "iteration_ms": round(plan.time / 1e3, 2) if plan.fits else "",
            "gap_to_bound": round(gap, 4) if gap is not None else "",
            "peak_gib": round(plan.peak / GiB, 1) if plan.peak_per_rank and plan.fits else "",
            "peak_gib_per_rank": " ".join(f"{x / GiB:.1f}" for x in plan.peak_per_rank) if plan.fits else "",
            "layers_recomputed_per_rank": " ".join(map(str, plan.extra.get("layers_recomputed", []))),
            "microbatches_recomputed_per_rank": " ".join(map(str, plan.extra.get("microbatches_recomputed", []))),
            "ranks_at_cap": " ".join(map(str, plan.extra.get("at_cap", []))),
            "device_memory_ms": _ms(plan.extra.get("roomy", math.nan)),
            "fits": "yes" if plan.fits else "no", "seconds": round(plan.seconds, 1), "note": plan.note}
