"""What `run` hands back: the workers' measurements next to the profile's prediction, in a RunResult.

Measured times are in seconds. The profile's predictions are in its `time_unit` and, when that unit is
a known one (us, ms, s, ns), also in seconds; otherwise `plan_seconds_per_unit` fits the profile's scale
to the measured total, as for `--uniform` costs in arbitrary units.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ...core.ir import Action, Kind, Schedule
from ...core.profile import Profile
from ...core.stage_cost import StageCost
from ...sim.simulate import PassCosts, chunk_costs, pass_cost, simulate
from .model import predicted_profile, seconds_per_unit

if TYPE_CHECKING:
    from .worker import Job

KINDS = tuple(k.value for k in (Kind.F, Kind.B, Kind.W, Kind.FULL_B))  # torch letters F, I, W, B


@dataclass(frozen=True)
class PassTimes:
    """One rank's passes of one chunk and kind (torch's letter: F, I, W, B) as measured: how many ran and
    their mean seconds; with a profile, the profile's mean time for them (its time_unit; over the chunk's
    microbatches, as a plan may recompute only some) and in seconds where the unit is known."""

    rank: int
    chunk: int
    kind: str
    count: int
    mean_s: float
    profile: float | None = None  # None: run without a profile to compare with
    profile_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON row: the profile's figures only where there was a profile."""
        out = asdict(self)
        if self.profile is None:
            del out["profile"], out["profile_s"]
        return out


@dataclass
class RunResult:
    """What `run` measured and checked. Times are seconds; `planned` and `profile_step` are in `time_unit`."""

    schedule: str
    backend: str
    model: str
    nproc: int
    steps: int
    ok: bool
    problems: list[str]
    loss: float
    reference_loss: float | None  # None when the gradients were not checked
    max_grad_diff: float
    parameters_checked: int
    measured: list[dict[str, dict[str, float]]]  # per rank: kind letter -> {count, mean_s}
    step_seconds: list[float]  # per timed step: the slowest rank's wall time
    predicted_step_seconds: float  # the simulator's makespan with the measured pass times
    planned: list[dict[str, float]] | None = None  # per rank: kind letter -> mean planned time
    time_unit: str | None = None
    plan_seconds_per_unit: float | None = None  # fits the profile's scale to the measured times
    warmup: int = 0
    device: str = "cpu"
    dtype: str = "fp64"
    checked: bool = True
    max_grad_rel_error: float = 0.0  # largest relative L2 error of a gradient against the reference
    passes: list[PassTimes] = field(default_factory=list)  # per rank, chunk and kind
    profile_step: float | None = None  # the simulator's makespan on the profile (time_unit)
    profile_step_seconds: float | None = None  # the same in seconds, when time_unit is a known unit
    partition: list[list[str]] | None = None  # the profiled model's layers per global chunk
    memory_peak_bytes: list[float] | None = None  # per rank: activation bytes torch's runtime held at most
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def measured_step_seconds(self) -> float:
        return statistics.median(self.step_seconds) if self.step_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["passes"] = [row.to_dict() for row in self.passes]
        out["measured_step_seconds"] = self.measured_step_seconds
        return out


def measured_profile(schedule: Schedule, per_chunk: dict[int, dict[str, list[float]]]) -> Profile:
    """A profile whose per-chunk F, B (torch's I) and W are the measured means (seconds), so the
    simulator's makespan is the plan for the times this machine actually took. A chunk that ran full
    backwards gets that time as its fused backward; hops are left at 0."""
    def mean(xs: list[float]) -> float:
        return statistics.fmean(xs) if xs else 0.0

    pl = schedule.placement
    chunks = []
    for c in range(pl.num_chunks):
        t = per_chunk.get(c, {})
        full = mean(t.get("B", []))
        i, w = (mean(t.get("I", [])), mean(t.get("W", []))) if t.get("W") else (full, 0.0)
        chunks.append(StageCost(mean(t.get("F", [])), i, w, full_backward=full if t.get("B") else None))
    stages = tuple(
        StageCost(*(sum(getattr(chunks[c], f) for c in pl.chunks_on(r)) for f in ("F", "B", "W")))
        for r in range(pl.num_ranks)
    )
    return Profile("measured", stages, (), schedule.num_microbatches,
                   {"kind": "measured", "device": "zbsearch run", "date": time.strftime("%Y-%m-%d")},
                   time_unit="s", chunks=tuple(chunks))


def _planned(schedule: Schedule, profile: Profile) -> list[dict[str, float]]:
    costs = chunk_costs(schedule, profile)
    out = []
    for r in range(schedule.num_ranks):
        per: dict[str, list[float]] = {}
        for a in schedule.passes(r):
            per.setdefault(a.kind.value, []).append(pass_cost(costs, a))
        out.append({k: statistics.fmean(v) for k, v in per.items()})
    return out


def _kind_cost(cost: StageCost, kind: str) -> float:
    return {"F": cost.F, "I": cost.B, "W": cost.W, "B": cost.BW}[kind]


def _passes(schedule: Schedule, per_chunk: dict[int, dict[str, list[float]]],
            costs: PassCosts | None, unit_s: float | None) -> list[PassTimes]:
    rows = []
    for r in range(schedule.num_ranks):
        for c in sorted(schedule.placement.chunks_on(r)):
            for kind in KINDS:
                times = per_chunk.get(c, {}).get(kind)
                if not times:
                    continue
                profile = None if costs is None else statistics.fmean(
                    _kind_cost(costs.of(Action(c, Kind.F, i)), kind) for i in range(schedule.num_microbatches))
                rows.append(PassTimes(r, c, kind, len(times), statistics.fmean(times), profile,
                                      None if profile is None or unit_s is None else profile * unit_s))
    return rows


def _per_rank(results: list[dict[str, Any]]) -> tuple[list[dict[str, dict[str, float]]], dict[int, dict[str, list[float]]]]:
    per_chunk: dict[int, dict[str, list[float]]] = {}
    measured: list[dict[str, dict[str, float]]] = []
    for res in results:
        per_kind: dict[str, list[float]] = {}
        for kind, stage, seconds in res["events"]:
            per_kind.setdefault(kind, []).append(seconds)
            per_chunk.setdefault(stage, {}).setdefault(kind, []).append(seconds)
        measured.append({k: {"count": len(v), "mean_s": statistics.fmean(v)}
                         for k in KINDS if (v := per_kind.get(k))})
    return measured, per_chunk


def collect(schedule: Schedule, job: "Job", profile: Profile | None, results: list[dict[str, Any]]) -> RunResult:
    """The RunResult of the workers' rank<r>.json contents."""
    measured, per_chunk = _per_rank(results)
    step_seconds = [max(s) for s in zip(*(r["step_seconds"][job.warmup:] for r in results))]
    plan = job.plan
    out = RunResult(
        schedule=schedule.name, backend=job.backend, model=plan.label if plan else job.model,
        nproc=schedule.num_ranks, steps=job.steps, warmup=job.warmup, device=job.device,
        dtype=plan.dtype if plan else "fp64", checked=all(r["checked"] for r in results),
        ok=not any(r["problems"] for r in results),
        problems=[f"rank {r['rank']}: {msg}" for r in results for msg in r["problems"]],
        loss=next(r["loss"] for r in results if r["loss"] is not None), reference_loss=results[0]["reference_loss"],
        max_grad_diff=max(r["max_grad_diff"] for r in results),
        max_grad_rel_error=max(r["max_grad_rel_error"] for r in results),
        parameters_checked=sum(r["parameters_checked"] for r in results),
        measured=measured, step_seconds=step_seconds,
        predicted_step_seconds=simulate(schedule, measured_profile(schedule, per_chunk)).makespan,
        partition=[list(c) for c in plan.chunks] if plan else None,
        details={"stages_per_rank": [r["stages"] for r in results]},
    )
    out.details["cpus"] = [r.get("cpus") for r in results]
    if results[0].get("pingpong"):
        out.details["pingpong"] = results[0]["pingpong"]
    if any(r.get("memory_peak_bytes") is not None for r in results):
        out.memory_peak_bytes = [float(r.get("memory_peak_bytes") or 0.0) for r in results]
    if plan is not None:
        out.details.update({"cut": plan.cut, "check": _check_words(plan)})
    if plan is not None and plan.recompute:
        mbs = plan.recompute_microbatches
        out.details["recompute"] = {
            "layers": dict(plan.recompute), "microbatches": None if mbs is None else [None if x is None else sorted(x)
                                                                                    for x in mbs],
            "forwards_run_again": [r.get("recomputes", 0) for r in results]}  # per rank, all steps together
    if profile is None:
        out.passes = _passes(schedule, per_chunk, None, None)
        return out
    predicted, how = predicted_profile(schedule, profile, plan)
    costs = chunk_costs(schedule, predicted)
    unit_s = seconds_per_unit(profile)
    out.passes = _passes(schedule, per_chunk, costs, unit_s)
    out.planned, out.time_unit, out.details["prediction"] = _planned(schedule, predicted), profile.time_unit, how
    out.profile_step = simulate(schedule, predicted).makespan
    out.profile_step_seconds = out.profile_step * unit_s if unit_s is not None else None
    planned_total = sum(pass_cost(costs, a) for r in range(schedule.num_ranks) for a in schedule.passes(r))
    measured_total = sum(v["count"] * v["mean_s"] for rank in measured for v in rank.values())
    out.plan_seconds_per_unit = measured_total / job.steps / planned_total if planned_total > 0 else None
    return out


def _check_words(plan: Any) -> str:
    if not plan.check:
        return "not checked"
    return (f"{plan.dtype} pipeline against a float64 single-process reference: relative L2 error of every "
            f"gradient and of the loss at most {plan.tolerance:g}")
