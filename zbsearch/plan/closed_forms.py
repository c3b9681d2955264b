"""Closed forms for the handcrafted schedules, read from each schedule's record, and the simulator
where a closed form does not hold.

Notation: p ranks, m microbatches, v chunks per rank (interleaved 1F1B); F, B, W the forward,
backward-for-inputs and backward-for-weights time of one whole stage for one microbatch; BW the fused
backward (the profile's `full_backward`, else B + W); c the hop time between adjacent ranks. Times are
in the profile's unit, memory in whole-stage activations M_B (one microbatch on one 1F1B stage; a
chunk of a two-chunk schedule holding one microbatch counts 1/2), as `report.summarize` counts it.

Conventions, used by the whole planner and printed by `zbsearch plan`:

- bubble: idle time per rank under a cost convention. makespan: from time 0 to the last pass of the
  iteration (an optimizer step that synchronizes the ranks). span: from each rank's own first pass
  to its own last, the busiest rank's (no synchronizing step; the Zero Bubble paper's ZB-H2 / ZB-V
  figures). The two agree for every schedule here except ZB-H2 and ZB-V.
- ideal: one rank's work, m (F + BW) for the fused-backward schedules (GPipe, 1F1B, interleaved),
  m (F + B + W) for the others.
- bubble fraction = bubble / (ideal + bubble): the idle share of the iteration, the Zero Bubble
  paper's bubble rate and the simulator's `bubble_rate_makespan` / `bubble_rate_span`. For GPipe and
  1F1B it is (p-1)/(m+p-1). Bubble targets are compared with this figure.
- imbalance = 1 - mean work / the busiest rank's work (work per rank as the simulator sums it): the
  bubble fraction no schedule and no m goes below; 0 where a closed form holds (identical stages).
- bubble ratio = bubble / ideal: Megatron's relative bubble, (p-1)/m for 1F1B and (p-1)/(v m) for
  interleaved 1F1B. Reported next to the fraction, never used for targets.
- P2P volume: activations and gradients sent between ranks per iteration, relative to 1F1B at the
  same m (every message carries one microbatch's hidden state, whatever the chunking).
- parameter copies: model replicas a rank holds (2 for DualPipe's and Chimera's two directions, else 1).

Every closed form states its assumptions. `closed_form` says whether they hold (`exact`); where they
do not, or where the formula is only an approximation (V-Half, V-Min), `estimate` times the schedule
with the simulator instead, and the result says which it used (`source`). All closed forms assume
identical stages; only GPipe's and ZB-H2's model communication.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..core.errors import PlanError, PreconditionError
from ..core.profile import Profile
from ..schedules import REGISTRY, generate
from ..schedules.spec import BubbleForm, MicrobatchRule, PassTimes, ScheduleSpec
from ..sim.simulate import simulate
from ..sim.summary import imbalance
from ..core.objective import OBJECTIVES, Objective

SCHEDULES: tuple[str, ...] = tuple(REGISTRY)
CLOSED_FORM = "closed form"
SIMULATOR = "simulator"

FRACTION_CONVENTION = "bubble / (ideal + bubble), the idle share of the iteration: (p-1)/(m+p-1) for 1F1B"
RATIO_CONVENTION = "bubble / ideal, Megatron's relative bubble: (p-1)/m for 1F1B, (p-1)/(v m) interleaved"
MEMORY_CONVENTION = "peak activations on the busiest rank, in whole-stage M_B (1F1B peaks at p)"


def check_objective(objective: str) -> str:
    """The cost convention must be makespan or span."""
    if objective not in OBJECTIVES:
        raise PlanError(f"objective {objective!r} is not a cost convention: use makespan or span", subject="objective")
    return objective


def spec(schedule: str) -> ScheduleSpec:
    """The registry's record of a schedule, by exact name."""
    try:
        return REGISTRY[schedule]
    except KeyError:
        raise PreconditionError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}") from None


# -- what each schedule accepts -------------------------------------------------------------------

def chunks_per_rank(schedule: str, v: int = 1) -> int:
    """Model chunks each rank holds: v for interleaved 1F1B, 2 for the V-shapes and DualPipe, else 1."""
    return spec(schedule).chunks_per_rank(v)


def ranks_problem(schedule: str, p: int) -> str | None:
    """Why the schedule is not defined for p ranks, or None."""
    return spec(schedule).ranks_rule(p)


def m_rule(schedule: str, p: int, v: int = 1) -> tuple[int, int, str]:
    """(smallest m, m must be a multiple of this, the rule in words) for the generator to accept m."""
    rule: MicrobatchRule = spec(schedule).microbatch_rule(p, v)
    return rule.lowest, rule.step, rule.need


def m_problem(schedule: str, p: int, m: int, v: int = 1) -> str | None:
    """Why the schedule is not defined for m microbatches, or None."""
    rule = spec(schedule).microbatch_rule(p, v)
    return None if rule.accepts(m) else rule.need


def next_valid_m(schedule: str, p: int, m: int, v: int = 1) -> int:
    """The smallest m' >= m the schedule accepts.

    >>> next_valid_m("dualpipe", 4, 9)
    10
    """
    lowest, step, _ = m_rule(schedule, p, v)
    return max(lowest, -(-m // step) * step)


def previous_valid_m(schedule: str, p: int, m: int, v: int = 1) -> int | None:
    """The largest m' < m the schedule accepts, or None."""
    lowest, step, _ = m_rule(schedule, p, v)
    prev = (m - 1) // step * step
    return prev if prev >= lowest else None


def _check_defined(schedule: str, p: int, m: int, v: int) -> ScheduleSpec:
    record = spec(schedule)
    need = record.problem(p, m, v)
    if need:
        raise PreconditionError(f"{schedule} needs {need}; got p={p}, m={m}")
    return record


# -- closed forms ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """One schedule's bubble and memory at one (p, m), from a closed form or from the simulator."""

    schedule: str
    p: int
    m: int
    chunks_per_rank: int
    objective: str
    bubble: float           # idle time per rank under `objective` (mean over ranks for the simulator)
    ideal: float            # one rank's work (mean over ranks for the simulator)
    peak_memory: float      # busiest rank, whole-stage M_B
    p2p_relative: float
    param_copies: int
    source: str             # CLOSED_FORM or SIMULATOR
    formula: str = ""       # the closed form of the bubble (approximate ones start with "~")
    conditions: str = ""    # what the closed form assumes
    exact: bool = True      # the conditions hold (always True for the simulator)
    note: str = ""          # which conditions fail, or why the simulator was used
    peak_memory_per_rank: tuple[float, ...] | None = None  # simulator only
    imbalance: float = 0.0  # 1 - mean work / the busiest rank's: the floor of bubble_fraction

    @property
    def bubble_fraction(self) -> float:
        """bubble / (ideal + bubble): the idle share of the iteration."""
        total = self.ideal + self.bubble
        return self.bubble / total if total > 0 else 0.0

    @property
    def bubble_ratio(self) -> float:
        """bubble / ideal: Megatron's relative bubble."""
        return self.bubble / self.ideal if self.ideal > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule, "p": self.p, "m": self.m, "chunks_per_rank": self.chunks_per_rank,
            "objective": self.objective, "bubble": self.bubble, "ideal": self.ideal,
            "bubble_fraction": self.bubble_fraction, "bubble_ratio": self.bubble_ratio,
            "peak_memory": self.peak_memory, "peak_memory_per_rank": self.peak_memory_per_rank,
            "p2p_relative": self.p2p_relative, "param_copies": self.param_copies, "source": self.source,
            "formula": self.formula, "conditions": self.conditions, "exact": self.exact, "note": self.note,
            "imbalance": self.imbalance,
        }


def bubble_form(schedule: str, p: int, m: int, v: int, times: PassTimes, objective: str) -> BubbleForm:
    """The record's closed-form bubble and the conditions under which it is exact."""
    return spec(schedule).bubble(p, m, v, times, objective)


def bubble_time(schedule: str, p: int, m: int, times: PassTimes = PassTimes(), v: int = 1,
                objective: str = "makespan") -> float:
    """Closed-form idle time per rank (see the module docstring and `closed_form` for conditions).

    >>> bubble_time("1f1b", 4, 16, PassTimes(1.0, 2.0, 1.0))
    12.0
    """
    return bubble_form(schedule, p, m, v, times, check_objective(objective)).bubble


def bubble_fraction(schedule: str, p: int, m: int, times: PassTimes = PassTimes(), v: int = 1,
                    objective: str = "makespan") -> float:
    """Closed-form bubble / (ideal + bubble); (p-1)/(m+p-1) for GPipe and 1F1B.

    >>> round(bubble_fraction("1f1b", 4, 16), 6) == round(3 / 19, 6)
    True
    """
    return closed_form(schedule, p, m, times, v, objective).bubble_fraction


def bubble_ratio(schedule: str, p: int, m: int, times: PassTimes = PassTimes(), v: int = 1,
                 objective: str = "makespan") -> float:
    """Closed-form bubble / ideal (Megatron's); (p-1)/(v m) for interleaved 1F1B."""
    return closed_form(schedule, p, m, times, v, objective).bubble_ratio


def peak_activation_memory(schedule: str, p: int, m: int, v: int = 1) -> tuple[float, bool]:
    """(peak activations on the busiest rank in whole-stage M_B, whether that figure is exact).

    Exact for any times and any M_W <= M_B (the order on each rank fixes it): GPipe m; 1F1B, ZB-H1,
    ZB-V min(p, m); interleaved min(p + (p-1)/v, m) (m a multiple of p, rank 0); ZB-H2 min(2p-1, m);
    DualPipe p + 1; DualPipeV p + 1/2 (m >= 2p); Chimera p (m a multiple of p). Measured, not closed:
    V-Half min(floor(p/2) + 1, m) and V-Min min(floor(2(p+3)/3)/2, m), with M_W = M_B/2 and m >= 2p; a
    larger M_W raises them.

    >>> peak_activation_memory("zb-h2", 4, 16)
    (7.0, True)
    """
    record = spec(schedule)
    return record.peak_memory(p, m, v), record.peak_memory_exact


def p2p_relative(schedule: str, p: int, v: int = 1) -> float:
    """Cross-rank messages per iteration relative to 1F1B's 2m(p-1) at the same m.

    Linear placements, DualPipe and Chimera (each microbatch crosses one copy of p stages): 1. Interleaved:
    a microbatch crosses v p - 1 chunk boundaries, all between ranks: (vp-1)/(p-1). V-shapes (ZB-V,
    DualPipeV, V-Half, V-Min): 2p - 1 boundaries of which the turn at rank p-1 stays on the rank: 2.
    """
    return spec(schedule).p2p_relative(p, v)


def parameter_copies(schedule: str) -> int:
    """Model replicas each rank holds: DualPipe and Chimera keep two (one per direction), the others one."""
    return spec(schedule).param_copies


def closed_form(schedule: str, p: int, m: int, times: PassTimes = PassTimes(), v: int = 1,
                objective: str = "makespan") -> Estimate:
    """The closed-form bubble, fraction and peak memory of one schedule, with its assumptions.

    Parameters
    ----------
    schedule
        A registry name (`zbsearch list`).
    p, m, v
        Ranks, microbatches, chunks per rank (interleaved only).
    times
        One stage's F, B, W, comm (and optional fused backward), the same on every stage.
    objective
        makespan or span: the cost convention of the bubble.

    Returns
    -------
    Estimate
        `exact` is False when a condition fails (listed in `note`) or the formula is an approximation;
        the figures are then the formula's value, not the schedule's.

    Raises
    ------
    PreconditionError
        Unknown schedule, or p, m the schedule does not accept.
    """
    check_objective(objective)
    record = _check_defined(schedule, p, m, v)
    form = record.bubble(p, m, v, times, objective)
    notes = list(form.failed)
    if form.approximate:
        notes.append("approximate formula")
    if not record.peak_memory_exact:
        notes.append("peak memory measured at M_W = M_B/2, not a closed form")
    return Estimate(
        schedule=schedule, p=p, m=m, chunks_per_rank=record.chunks_per_rank(v), objective=objective,
        bubble=form.bubble, ideal=m * record.work(times), peak_memory=record.peak_memory(p, m, v),
        p2p_relative=record.p2p_relative(p, v), param_copies=record.param_copies,
        source=CLOSED_FORM, formula=form.formula, conditions=form.conditions,
        exact=not notes, note="; ".join(notes),
    )


# -- the simulator --------------------------------------------------------------------------------

def profile_for(times: PassTimes, p: int, m: int, mem_B: float = 1.0, mem_W: float = 0.5) -> Profile:
    """p identical stages with these times (the fused backward too, when given)."""
    stage: dict[str, float] = {"F": times.F, "B": times.B, "W": times.W, "mem_B": mem_B, "mem_W": mem_W}
    if times.full_backward is not None:
        stage["full_backward"] = times.full_backward
    if times.overlap_f_b is not None:
        stage["overlap_f_b"] = times.overlap_f_b
    return Profile.from_dict({
        "name": f"uniform F={times.F:g} B={times.B:g} W={times.W:g} comm={times.comm:g} p={p}",
        "num_stages": p, "microbatches": m, "time_unit": "unit", "stages": [stage] * p, "comm": times.comm,
        "source": {"kind": "estimated", "method": "uniform stages for the planner"},
    }, origin="planner")


def simulated(schedule: str, profile: Profile, m: int, v: int = 1, objective: str = "makespan") -> Estimate:
    """Time the generated schedule on the profile with the simulator (exact for that profile).

    bubble = cost - mean work per rank, so bubble_fraction equals the simulator's bubble rate.
    """
    check_objective(objective)
    p = profile.num_stages
    record = _check_defined(schedule, p, m, v)
    prof = profile.with_microbatches(m)
    timeline = simulate(generate(schedule, p, m, v if record.takes_chunks else None), prof)
    cost = Objective.parse(objective).of(timeline)
    works = [timeline.work(r) for r in range(p)]
    work = sum(works) / p
    peaks = tuple(timeline.peak_memory(r) / prof.stage_mem_B(r) for r in range(p))
    return Estimate(
        schedule=schedule, p=p, m=m, chunks_per_rank=record.chunks_per_rank(v), objective=objective,
        bubble=cost - work, ideal=work, peak_memory=max(peaks), p2p_relative=record.p2p_relative(p, v),
        param_copies=record.param_copies, source=SIMULATOR, peak_memory_per_rank=peaks, imbalance=imbalance(works),
    )


def estimate(schedule: str, profile: Profile, m: int, v: int = 1, objective: str = "makespan") -> Estimate:
    """The closed form where it is exact for this profile, else the simulator; `source` says which and
    `note` why the simulator was needed."""
    times = PassTimes.of(profile)
    if times is not None:
        form = closed_form(schedule, profile.num_stages, m, times, v, objective)
        if form.exact:
            return form
        why = form.note
    else:
        form = None
        why = "stages, links or chunk costs differ between ranks"
    sim = simulated(schedule, profile, m, v, objective)
    return replace(sim, formula=form.formula if form else "", conditions=form.conditions if form else "",
                   note=f"closed form not exact: {why}")


__all__ = [
    "CLOSED_FORM", "Estimate", "FRACTION_CONVENTION", "MEMORY_CONVENTION", "OBJECTIVES", "PassTimes",
    "RATIO_CONVENTION", "SCHEDULES", "SIMULATOR", "bubble_form", "bubble_fraction", "bubble_ratio", "bubble_time",
    "check_objective", "chunks_per_rank", "closed_form", "estimate", "m_problem", "m_rule", "next_valid_m",
    "p2p_relative", "parameter_copies", "peak_activation_memory", "previous_valid_m", "profile_for",
    "ranks_problem", "simulated", "spec",
]
