"""The planner: every handcrafted schedule side by side at one (p, m) (bubble, memory, communication,
the m a bubble target needs) and the one to recommend. Conventions as in zbsearch.plan.closed_forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..core.errors import PlanError
from ..core.memory import MemoryLimit
from ..core.profile import Profile
from ..schedules.spec import close
from .closed_forms import (FRACTION_CONVENTION, MEMORY_CONVENTION, RATIO_CONVENTION, SCHEDULES, Estimate,
    check_objective, estimate, spec)
from .microbatches import TargetM, check_target, microbatches_for_target


def microbatches_from_batch(global_batch: int, dp: int, micro_batch: int) -> int:
    """m = global batch / (data-parallel replicas x micro-batch size), all counted in samples.

    >>> microbatches_from_batch(512, 16, 1)
    32

    Raises
    ------
    PlanError
        A count below 1, or a global batch that dp x micro-batch does not divide.
    """
    for what, value, field in (("global batch", global_batch, "global_batch"), ("data-parallel degree", dp, "dp"),
                               ("micro-batch size", micro_batch, "micro_batch")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{what} {value!r} is not a count: give a whole number >= 1", subject=field)
    per_step = dp * micro_batch
    if global_batch % per_step:
        lower = global_batch // per_step * per_step
        upper = lower + per_step
        near = f"{lower} or {upper}" if lower else f"{upper}"
        raise PlanError(
            f"global batch {global_batch} is not divisible by dp x micro-batch = {dp} x {micro_batch} = "
            f"{per_step}: use a multiple of {per_step} (e.g. {near}) or change dp or the micro-batch size",
            subject="global_batch")
    return global_batch // per_step


@dataclass(frozen=True)
class PlanRow:
    """One schedule at the planned m: its figures, whether it fits the limit, the m a target needs."""

    estimate: Estimate
    fits: bool
    target: TargetM

    @property
    def schedule(self) -> str:
        return self.estimate.schedule

    def to_dict(self) -> dict[str, Any]:
        out = self.estimate.to_dict()
        out.update({"fits_mem_limit": self.fits, "microbatches_for_target": self.target.m,
                    "target_source": self.target.source, "target_note": self.target.note,
                    "target_imbalance_floor": self.target.imbalance_floor})
        return out


@dataclass(frozen=True)
class Skipped:
    """A schedule the planner left out, why, and the m it would need for the target (when defined)."""

    schedule: str
    reason: str
    target: TargetM | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "reason": self.reason,
                "microbatches_for_target": None if self.target is None else self.target.m,
                "target_source": None if self.target is None else self.target.source}


@dataclass(frozen=True)
class Plan:
    p: int
    m: int
    m_source: str
    v: int
    objective: str
    target: float
    profile: str
    time_unit: str
    mem_limit: str | None
    mem_limit_stage_units: float | None
    rows: tuple[PlanRow, ...]
    skipped: tuple[Skipped, ...]
    recommendation: str | None
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def imbalance(self) -> float:
        """1 - mean rank work / the busiest rank's, the least over the rows: no bubble here goes below it."""
        return min((row.estimate.imbalance for row in self.rows), default=0.0)

    @property
    def imbalance_bound_rows(self) -> tuple[PlanRow, ...]:
        """The rows whose target the imbalance between stages alone puts out of reach."""
        return tuple(row for row in self.rows if row.target.imbalance_floor is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "p": self.p, "m": self.m, "m_source": self.m_source, "chunks": self.v, "objective": self.objective,
            "bubble_fraction_convention": FRACTION_CONVENTION, "bubble_ratio_convention": RATIO_CONVENTION,
            "memory_convention": MEMORY_CONVENTION, "target_bubble": self.target, "profile": self.profile,
            "time_unit": self.time_unit, "mem_limit": self.mem_limit,
            "mem_limit_stage_units": self.mem_limit_stage_units,
            "schedules": [row.to_dict() for row in self.rows],
            "skipped": [s.to_dict() for s in self.skipped],
            "recommendation": self.recommendation, "reason": self.reason, "imbalance": self.imbalance,
        }


def _fits(est: Estimate, limit_units: Sequence[float] | None) -> bool:
    if limit_units is None:
        return True
    if est.peak_memory_per_rank is not None:
        return all(peak <= lim or close(peak, lim) for peak, lim in zip(est.peak_memory_per_rank, limit_units))
    lim = min(limit_units)
    return est.peak_memory <= lim or close(est.peak_memory, lim)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def recommend(rows: Sequence[PlanRow], mem_limit: str | None = None) -> tuple[PlanRow | None, str]:
    """The row to recommend and why, in one line.

    Never a row over the memory limit; among those that fit, the smallest bubble fraction; ties (equal
    up to rounding) go to less peak memory, then less P2P volume, then fewer parameter copies, then the
    registry order. None, with the reason, when nothing fits.
    """
    fitting = [r for r in rows if r.fits]
    over = [r.schedule for r in rows if not r.fits]
    if not fitting:
        if not rows:
            return None, "no schedule applies at these p and m"
        least = min(rows, key=lambda r: r.estimate.peak_memory)
        p = least.estimate.p
        return None, (f"no schedule fits --mem-limit {mem_limit}: the least memory is {least.estimate.peak_memory:g} M_B "
                      f"({least.schedule}), so raise the limit to at least {least.estimate.peak_memory / p:.3g}p "
                      "or spread the model over more ranks")
    best_bubble = min(r.estimate.bubble_fraction for r in fitting)
    tied = [r for r in fitting if close(r.estimate.bubble_fraction, best_bubble)]

    def key(r: PlanRow) -> tuple[float, float, int]:
        return (round(r.estimate.peak_memory, 9), round(r.estimate.p2p_relative, 9), r.estimate.param_copies)

    order = {row.schedule: i for i, row in enumerate(rows)}
    chosen = min(tied, key=lambda r: (key(r), order[r.schedule]))
    est = chosen.estimate
    scope = (f"the {len(fitting)} schedules within --mem-limit {mem_limit}" if mem_limit
             else f"all {len(fitting)} applicable schedules (no --mem-limit)")
    split = (f" = {_pct(est.imbalance)} imbalance + {_pct(max(0.0, est.bubble_fraction - est.imbalance))} schedule"
             if est.imbalance > 0 else "")
    reason = (f"smallest bubble ({_pct(est.bubble_fraction)} of the iteration{split}, "
              f"{est.objective}) among {scope}; peak {est.peak_memory:g} M_B, P2P {est.p2p_relative:.3g}x 1F1B")
    others = [r for r in tied if r is not chosen]
    if others:
        names = ", ".join(r.schedule for r in others)
        if any(round(r.estimate.peak_memory, 9) != round(est.peak_memory, 9) for r in others):
            why = "less activation memory"
        elif any(round(r.estimate.p2p_relative, 9) != round(est.p2p_relative, 9) for r in others):
            why = "less P2P communication"
        elif any(r.estimate.param_copies != est.param_copies for r in others):
            why = "fewer parameter copies"
        else:
            why = "listed first"
        reason += f"; tied on bubble with {names}, chosen for {why}"
    if over:
        reason += f"; over the limit: {', '.join(over)}"
    return chosen, reason


def plan(profile: Profile, m: int, *, limit: MemoryLimit | None = None, target: float = 0.05, v: int = 2,
         objective: str = "makespan", m_source: str = "-m", schedules: Sequence[str] = SCHEDULES) -> Plan:
    """Every handcrafted schedule at (p, m) on the profile: bubble, memory, communication, the m the
    target needs, and the recommendation.

    Closed forms where exact for this profile, the simulator elsewhere (each row says which). `v` is
    the chunks per rank of the schedules that take a chunk count (interleaved 1F1B; with v = 1 it would
    only repeat 1F1B, so it is then left out).

    Raises
    ------
    PlanError
        p < 2, v < 1, or target outside (0, 1).
    """
    p = profile.num_stages
    if p < 2:
        raise PlanError(f"pipelining needs at least 2 ranks, got p={p}: use 2 or more (one rank has no bubble)")
    check_target(target)
    check_objective(objective)
    if v < 1:
        raise PlanError(f"chunk count {v} is too small: interleaved-1f1b needs 2 or more chunks per rank",
                        subject="chunks")
    limit_units = None if limit is None or limit.unlimited else limit.in_stage_units(profile)
    rows: list[PlanRow] = []
    skipped: list[Skipped] = []
    for name in schedules:
        record = spec(name)
        if record.takes_chunks and v == 1 and record.one_chunk_twin:
            skipped.append(Skipped(name, f"--chunks 1 makes it {record.one_chunk_twin}"))
            continue
        need = record.ranks_rule(p)
        if need:
            skipped.append(Skipped(name, f"needs {need}"))
            continue
        target_m = microbatches_for_target(name, p, target, v, profile=profile, objective=objective)
        need = record.problem(p, m, v)
        if need:
            skipped.append(Skipped(name, f"needs {need}", target_m))
            continue
        est = estimate(name, profile, m, v, objective)
        rows.append(PlanRow(est, _fits(est, limit_units), target_m))
    # type: ignore: limit_units is None whenever limit is
    chosen, reason = recommend(rows, None if limit_units is None else limit.text)  # type: ignore[union-attr]
    return Plan(
        p=p, m=m, m_source=m_source, v=v, objective=objective, target=target, profile=profile.name,
        time_unit=profile.time_unit, mem_limit=None if limit is None else limit.text,
        mem_limit_stage_units=None if limit_units is None else min(limit_units),
        rows=tuple(rows), skipped=tuple(skipped), recommendation=None if chosen is None else chosen.schedule,
        reason=reason,
    )


__all__ = ["Plan", "PlanRow", "Skipped", "microbatches_from_batch", "plan", "recommend"]
