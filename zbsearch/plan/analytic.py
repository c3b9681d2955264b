"""Closed forms for the handcrafted schedules, the microbatch count a bubble target needs, and the
planner that puts every schedule side by side.

Notation: p ranks, m microbatches, v chunks per rank (interleaved 1F1B); F, B, W the forward,
backward-for-inputs and backward-for-weights time of one whole stage for one microbatch; BW the fused
backward (the profile's `full_backward`, else B + W); c the hop time between adjacent ranks. Times are
in the profile's unit, memory in whole-stage activations M_B (one microbatch on one 1F1B stage; a
chunk of a two-chunk schedule holding one microbatch counts 1/2), as `report.summarize` counts it.

Conventions, used by every function here and printed by `zbsearch plan`:

- bubble: idle time per rank under a cost convention. makespan: from time 0 to the last pass of the
  iteration (an optimizer step that synchronizes the ranks). span: from each rank's own first pass
  to its own last, the busiest rank's (no synchronizing step; the Zero Bubble paper's ZB-H2 / ZB-V
  figures). The two agree for every schedule here except ZB-H2 and ZB-V.
- ideal: one rank's work, m (F + BW) for the fused-backward schedules (GPipe, 1F1B, interleaved),
  m (F + B + W) for the others.
- bubble fraction = bubble / (ideal + bubble): the idle share of the iteration, the Zero Bubble
  paper's bubble rate and the simulator's `bubble_rate_makespan` / `bubble_rate_span`. For GPipe and
  1F1B it is (p-1)/(m+p-1). Targets (`--target-bubble`) are compared with this figure.
- bubble ratio = bubble / ideal: Megatron's relative bubble, (p-1)/m for 1F1B and (p-1)/(v m) for
  interleaved 1F1B. Reported next to the fraction, never used for targets.
- P2P volume: activations and gradients sent between ranks per iteration, relative to 1F1B at the
  same m (every message carries one microbatch's hidden state, whatever the chunking).
- parameter copies: model replicas a rank holds (2 for DualPipe's two directions, else 1).

Every closed form states its assumptions. `closed_form` says whether they hold (`exact`); where they
do not, or where the formula is only an approximation (V-Half, V-Min), `estimate` times the schedule
with the simulator instead, and the result says which it used (`source`). All closed forms assume
identical stages; only GPipe's and ZB-H2's model communication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..core.errors import PlanError, PreconditionError
from ..core.memory import MemoryLimit
from ..core.profile import MAX_MICROBATCHES, Profile
from ..schedules import REGISTRY, generate
from ..sim.simulate import simulate

SCHEDULES: tuple[str, ...] = tuple(REGISTRY)
OBJECTIVES = ("makespan", "span")
FUSED_BACKWARD = ("gpipe", "1f1b", "interleaved-1f1b")
CLOSED_FORM = "closed form"
SIMULATOR = "simulator"

FRACTION_CONVENTION = "bubble / (ideal + bubble), the idle share of the iteration: (p-1)/(m+p-1) for 1F1B"
RATIO_CONVENTION = "bubble / ideal, Megatron's relative bubble: (p-1)/m for 1F1B, (p-1)/(v m) interleaved"
MEMORY_CONVENTION = "peak activations on the busiest rank, in whole-stage M_B (1F1B peaks at p)"

# The target search simulates an m only up to this many passes, and checks a prediction with at most
# VERIFY_STEPS simulations; past either, it reports the m its fit predicts as extrapolated.
SIMULATION_BUDGET = 12_000
VERIFY_STEPS = 6


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def below(fraction: float, target: float) -> bool:
    """True when `fraction` is below `target`; a fraction equal to it (up to rounding) is not."""
    return fraction < target and not _close(fraction, target)


# -- inputs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PassTimes:
    """One stage's per-microbatch times, the same on every stage (what the closed forms assume)."""

    F: float = 1.0
    B: float = 1.0
    W: float = 1.0
    comm: float = 0.0
    full_backward: float | None = None

    @property
    def BW(self) -> float:
        """The fused backward: the profile's figure, else B + W."""
        return self.full_backward if self.full_backward is not None else self.B + self.W

    def work(self, schedule: str) -> float:
        """One rank's work per microbatch under this schedule."""
        return self.F + (self.BW if schedule in FUSED_BACKWARD else self.B + self.W)

    @classmethod
    def of(cls, profile: Profile) -> "PassTimes | None":
        """The profile's times when its stages are identical (times, memory and static bytes), its links
        all equal and it gives no per-chunk costs; None otherwise (only the simulator applies then)."""
        first = profile.stages[0]
        if profile.chunks is not None or any(s != first for s in profile.stages):
            return None
        if any(not _close(c, profile.comm[0]) for c in profile.comm):
            return None
        comm = profile.comm[0] if profile.comm else 0.0
        return cls(first.F, first.B, first.W, comm, first.full_backward)


def check_target(target: float) -> float:
    """A bubble target must be a fraction strictly between 0 and 1."""
    if not isinstance(target, (int, float)) or not 0 < target < 1 or math.isnan(target):
        raise PlanError(f"bubble target {target} is not a fraction in (0, 1): write e.g. 0.05 for 5%")
    return float(target)


def check_objective(objective: str) -> str:
    if objective not in OBJECTIVES:
        raise PlanError(f"objective {objective!r} is not a cost convention: use makespan or span")
    return objective


def microbatches_from_batch(global_batch: int, dp: int, micro_batch: int) -> int:
    """m = global batch / (data-parallel replicas x micro-batch size), all counted in samples.

    Raises
    ------
    PlanError
        A count below 1, or a global batch that dp x micro-batch does not divide.
    """
    counts = (("global batch", global_batch), ("data-parallel degree", dp), ("micro-batch size", micro_batch))
    for what, value in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{what} {value!r} is not a count: give a whole number >= 1")
    per_step = dp * micro_batch
    if global_batch % per_step:
        lower = global_batch // per_step * per_step
        upper = lower + per_step
        near = f"{lower} or {upper}" if lower else f"{upper}"
        raise PlanError(
            f"global batch {global_batch} is not divisible by dp x micro-batch = {dp} x {micro_batch} = "
            f"{per_step}: use a multiple of {per_step} (e.g. {near}) or change dp or the micro-batch size"
        )
    return global_batch // per_step


# -- what each schedule accepts -------------------------------------------------------------------

def chunks_per_rank(schedule: str, v: int = 1) -> int:
    """Model chunks each rank holds: v for interleaved 1F1B, 2 for the V-shapes and DualPipe, else 1."""
    if schedule == "interleaved-1f1b":
        return v
    return 2 if schedule in ("zb-v", "dualpipe", "dualpipev", "v-half", "v-min") else 1


def ranks_problem(schedule: str, p: int) -> str | None:
    """Why the schedule is not defined for p ranks, or None."""
    if schedule == "dualpipe" and p % 2:
        return "p even (half the ranks lead each direction)"
    return None


def m_rule(schedule: str, p: int, v: int = 1) -> tuple[int, int, str]:
    """(smallest m, m must be a multiple of this, the rule in words) for the generator to accept m."""
    if schedule == "interleaved-1f1b" and v > 1:
        return p, p, "m a multiple of p"
    if schedule == "dualpipe":
        return 2 * p, 2, "m even and m >= 2p"
    if schedule == "dualpipev":
        return 2 * p, 1, "m >= 2p"
    return 1, 1, "m >= 1"


def m_problem(schedule: str, p: int, m: int, v: int = 1) -> str | None:
    """Why the schedule is not defined for m microbatches, or None."""
    lowest, step, rule = m_rule(schedule, p, v)
    return None if m >= lowest and m % step == 0 else rule


def next_valid_m(schedule: str, p: int, m: int, v: int = 1) -> int:
    """The smallest m' >= m the schedule accepts."""
    lowest, step, _ = m_rule(schedule, p, v)
    return max(lowest, -(-m // step) * step)


def previous_valid_m(schedule: str, p: int, m: int, v: int = 1) -> int | None:
    """The largest m' < m the schedule accepts, or None."""
    lowest, step, _ = m_rule(schedule, p, v)
    prev = (m - 1) // step * step
    return prev if prev >= lowest else None


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
        }


@dataclass(frozen=True)
class _Form:
    bubble: float
    formula: str
    conditions: str
    failed: list[str]       # conditions that do not hold, in words
    exact_from_m: int       # the m-condition: exact for every accepted m >= this
    approximate: bool = False  # the formula is an approximation even when `failed` is empty


def _no_comm(t: PassTimes, failed: list[str]) -> None:
    if not _close(t.comm, 0.0):
        failed.append("comm c > 0 (the formula leaves communication out)")


def _bubble_form(schedule: str, p: int, m: int, v: int, t: PassTimes, objective: str) -> _Form:
    """The closed-form bubble of one schedule and the conditions under which it is exact."""
    F, B, W, BW = t.F, t.B, t.W, t.BW
    failed: list[str] = []
    if schedule == "gpipe":
        return _Form((p - 1) * (F + BW + 2 * t.comm), "(p-1)(F+BW+2c)", "identical stages; any m", failed, 1)
    if schedule == "1f1b" or (schedule == "interleaved-1f1b" and v == 1):
        _no_comm(t, failed)
        return _Form((p - 1) * (F + BW), "(p-1)(F+BW)", "identical stages, comm 0; any m", failed, 1)
    if schedule == "interleaved-1f1b":
        _no_comm(t, failed)
        return _Form((p - 1) * (F + BW) / v, "(p-1)(F+BW)/v",
                     "identical stages split evenly over v chunks, comm 0; m a multiple of p", failed, p)
    if schedule == "zb-h1":
        _no_comm(t, failed)
        if W > F and not _close(W, F):
            failed.append("W > F")
        if W > B and not _close(W, B):
            failed.append("W > B")
        if m < p:
            failed.append("m < p")
        return _Form((p - 1) * (F + B - W), "(p-1)(F+B-W)", "identical stages, comm 0, m >= p, W <= min(F, B)",
                     failed, p)
    if schedule == "zb-h2":
        c = t.comm
        if W > F and not _close(W, F):
            failed.append("W > F")
        if 2 * W > F + B and not _close(2 * W, F + B):
            failed.append("2W > F + B")
        if 2 * c > F + B and not _close(2 * c, F + B):
            failed.append("2c > F + B")
        if m < 2 * p - 1:
            failed.append("m < 2p-1")
        cond = "identical stages, m >= 2p-1, W <= F, 2W <= F+B, 2c <= F+B"
        if objective == "span":
            return _Form((p - 1) * (F + B + 2 * c - 2 * W), "(p-1)(F+B+2c-2W)", cond, failed, 2 * p - 1)
        return _Form((p - 1) * max(F + c, F + B + 2 * c - 2 * W), "(p-1)max(F+c, F+B+2c-2W)", cond, failed,
                     2 * p - 1)
    if schedule == "zb-v":
        _no_comm(t, failed)
        if not (_close(F, B) and _close(B, W)):
            failed.append("F, B, W not all equal")
        if m < 2 * p - 1:
            failed.append("m < 2p-1")
        cond = "identical stages, comm 0, m >= 2p-1, F = B = W"
        if objective == "span":
            return _Form(0.0, "0", cond, failed, 2 * p - 1)
        return _Form((p - 1) * F / 2, "(p-1)F/2", cond, failed, 2 * p - 1)
    if schedule in ("dualpipe", "dualpipev"):
        _no_comm(t, failed)
        if not _close(F, B):
            failed.append("F != B")
        if W > F and not _close(W, F):
            failed.append("W > F")
        if t.full_backward is not None and not _close(t.full_backward, B + W):
            failed.append("full_backward != B + W")
        cond = ("identical stages, comm 0, F = B, W <= F; F&B pairs cost F + full backward (no overlap "
                "credit); DeepSeek's (P/2-1)(F&B + B_full - 3W) with P the stages one direction crosses")
        if schedule == "dualpipe":
            return _Form((p / 2 - 1) * (F + 2 * B - W), "(p/2-1)(F+2B-W)", cond + "; p even, m even, m >= 2p",
                         failed, 2 * p)
        return _Form((p - 1) * (F + 2 * B - W) / 2, "(p-1)(F+2B-W)/2", cond + "; m >= 2p", failed, 2 * p)
    if schedule == "v-half":
        return _Form((p - 1) * (F + B + W) / 2, "~(p-1)(F+B+W)/2",
                     "approximation: about half of 1F1B's bubble (arXiv 2405.15362); not exact for any times",
                     failed, 2 * p, approximate=True)
    if schedule == "v-min":
        return _Form(2 * (p - 1) * (F + B + W) / 3, "~2(p-1)(F+B+W)/3",
                     "approximation: about two thirds of 1F1B's bubble (arXiv 2405.15362); not exact for any times",
                     failed, 2 * p, approximate=True)
    raise PreconditionError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")


def bubble_time(schedule: str, p: int, m: int, times: PassTimes = PassTimes(), v: int = 1,
                objective: str = "makespan") -> float:
    """Closed-form idle time per rank (see the module docstring and `closed_form` for conditions)."""
    return _bubble_form(schedule, p, m, v, times, check_objective(objective)).bubble


def bubble_fraction(schedule: str, p: int, m: int, times: PassTimes = PassTimes(), v: int = 1,
                    objective: str = "makespan") -> float:
    """Closed-form bubble / (ideal + bubble); (p-1)/(m+p-1) for GPipe and 1F1B."""
    return closed_form(schedule, p, m, times, v, objective).bubble_fraction


def bubble_ratio(schedule: str, p: int, m: int, times: PassTimes = PassTimes(), v: int = 1,
                 objective: str = "makespan") -> float:
    """Closed-form bubble / ideal (Megatron's); (p-1)/(v m) for interleaved 1F1B."""
    return closed_form(schedule, p, m, times, v, objective).bubble_ratio


def peak_activation_memory(schedule: str, p: int, m: int, v: int = 1) -> tuple[float, bool]:
    """(peak activations on the busiest rank in whole-stage M_B, whether that figure is exact).

    Exact for any times and any M_W <= M_B (the order on each rank fixes it): GPipe m; 1F1B, ZB-H1,
    ZB-V min(p, m); interleaved min(p + (p-1)/v, m) (m a multiple of p, rank 0); ZB-H2 min(2p-1, m);
    DualPipe p + 1; DualPipeV p + 1/2 (m >= 2p). Measured, not closed: V-Half min(floor(p/2) + 1, m)
    and V-Min min(floor(2(p+3)/3)/2, m), with M_W = M_B/2 and m >= 2p; a larger M_W raises them.
    """
    if schedule == "gpipe":
        return float(m), True
    if schedule in ("1f1b", "zb-h1", "zb-v") or (schedule == "interleaved-1f1b" and v == 1):
        return float(min(p, m)), True
    if schedule == "interleaved-1f1b":
        return min(p + (p - 1) / v, float(m)), True
    if schedule == "zb-h2":
        return float(min(2 * p - 1, m)), True
    if schedule == "dualpipe":
        return p + 1.0, True
    if schedule == "dualpipev":
        return p + 0.5, True
    if schedule == "v-half":
        return min(p // 2 + 1.0, float(m)), False
    if schedule == "v-min":
        return min((2 * (p + 3) // 3) / 2, float(m)), False
    raise PreconditionError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")


def p2p_relative(schedule: str, p: int, v: int = 1) -> float:
    """Cross-rank messages per iteration relative to 1F1B's 2m(p-1) at the same m.

    Linear placements and DualPipe (each microbatch crosses one copy of p stages): 1. Interleaved:
    a microbatch crosses v p - 1 chunk boundaries, all between ranks: (vp-1)/(p-1). V-shapes (ZB-V,
    DualPipeV, V-Half, V-Min): 2p - 1 boundaries of which the turn at rank p-1 stays on the rank: 2.
    """
    if p < 2:
        return 1.0
    if schedule == "interleaved-1f1b":
        return (v * p - 1) / (p - 1)
    if schedule in ("zb-v", "dualpipev", "v-half", "v-min"):
        return 2.0
    return 1.0


def parameter_copies(schedule: str) -> int:
    """Model replicas each rank holds: DualPipe keeps two (one per direction), every other schedule one."""
    return 2 if schedule == "dualpipe" else 1


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
    _check_defined(schedule, p, m, v)
    form = _bubble_form(schedule, p, m, v, times, objective)
    peak, peak_exact = peak_activation_memory(schedule, p, m, v)
    notes = list(form.failed)
    if form.approximate:
        notes.append("approximate formula")
    if not peak_exact:
        notes.append("peak memory measured at M_W = M_B/2, not a closed form")
    return Estimate(
        schedule=schedule, p=p, m=m, chunks_per_rank=chunks_per_rank(schedule, v), objective=objective,
        bubble=form.bubble, ideal=m * times.work(schedule), peak_memory=peak,
        p2p_relative=p2p_relative(schedule, p, v), param_copies=parameter_copies(schedule),
        source=CLOSED_FORM, formula=form.formula, conditions=form.conditions,
        exact=not notes, note="; ".join(notes),
    )


def _check_defined(schedule: str, p: int, m: int, v: int) -> None:
    if schedule not in REGISTRY:
        raise PreconditionError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    need = ranks_problem(schedule, p) or m_problem(schedule, p, m, v)
    if need:
        raise PreconditionError(f"{schedule} needs {need}; got p={p}, m={m}")


# -- the simulator --------------------------------------------------------------------------------

def profile_for(times: PassTimes, p: int, m: int, mem_B: float = 1.0, mem_W: float = 0.5) -> Profile:
    """p identical stages with these times (the fused backward too, when given)."""
    stage: dict[str, float] = {"F": times.F, "B": times.B, "W": times.W, "mem_B": mem_B, "mem_W": mem_W}
    if times.full_backward is not None:
        stage["full_backward"] = times.full_backward
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
    _check_defined(schedule, p, m, v)
    prof = profile.with_microbatches(m)
    timeline = simulate(generate(schedule, p, m, v if schedule == "interleaved-1f1b" else None), prof)
    cost = timeline.makespan if objective == "makespan" else timeline.span
    work = sum(timeline.work(r) for r in range(p)) / p
    peaks = tuple(timeline.peak_memory(r) / prof.stage_mem_B(r) for r in range(p))
    return Estimate(
        schedule=schedule, p=p, m=m, chunks_per_rank=chunks_per_rank(schedule, v), objective=objective,
        bubble=cost - work, ideal=work, peak_memory=max(peaks), p2p_relative=p2p_relative(schedule, p, v),
        param_copies=parameter_copies(schedule), source=SIMULATOR, peak_memory_per_rank=peaks,
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


# -- microbatches for a target --------------------------------------------------------------------

@dataclass(frozen=True)
class TargetM:
    """The smallest m that brings the bubble fraction below a target, and how it was found."""

    m: int | None           # None: unreachable (see note)
    source: str             # CLOSED_FORM, SIMULATOR, or "simulator (extrapolated)"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"m": self.m, "source": self.source, "note": self.note}


class _Curve:
    """One schedule's bubble as m varies: the closed form where exact, else the simulator (cached)."""

    def __init__(self, schedule: str, p: int, v: int, objective: str, times: PassTimes | None,
                 profile: Profile | None, budget: int = SIMULATION_BUDGET) -> None:
        self.schedule, self.p, self.v, self.objective, self.budget = schedule, p, v, objective, budget
        self.times = times if times is not None else (PassTimes.of(profile) if profile is not None else PassTimes())
        self._profile = profile
        self._cache: dict[int, Estimate] = {}

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            self._profile = profile_for(self.times, self.p, 1)
        return self._profile

    def closed_from(self) -> int | None:
        """The m from which the closed form is exact for every accepted m, or None if it never is."""
        if self.times is None:
            return None
        m_probe = next_valid_m(self.schedule, self.p, 4 * self.p, self.v)  # past every m-condition
        form = _bubble_form(self.schedule, self.p, m_probe, self.v, self.times, self.objective)
        if form.failed or form.approximate:
            return None
        return next_valid_m(self.schedule, self.p, form.exact_from_m, self.v)

    def fraction(self, m: int) -> float:
        return self.at(m).bubble_fraction

    def at(self, m: int) -> Estimate:
        if m not in self._cache:
            exact_from = self.closed_from()
            if exact_from is not None and m >= exact_from:
                self._cache[m] = closed_form(self.schedule, self.p, m, self.times, self.v, self.objective)
            else:
                self._cache[m] = simulated(self.schedule, self.profile, m, self.v, self.objective)
        return self._cache[m]

    def affordable(self, m: int) -> bool:
        exact_from = self.closed_from()
        if exact_from is not None and m >= exact_from:
            return True
        return 3 * self.p * m * chunks_per_rank(self.schedule, self.v) <= self.budget

    def valid(self, m: int) -> int:
        return next_valid_m(self.schedule, self.p, m, self.v)

    def previous(self, m: int) -> int | None:
        return previous_valid_m(self.schedule, self.p, m, self.v)


def _scan_down(curve: _Curve, start: int, target: float) -> int:
    """From an m that meets the target, step down through accepted m while they meet it too."""
    best = start
    m = curve.previous(start)
    while m is not None and curve.affordable(m) and below(curve.fraction(m), target):
        best, m = m, curve.previous(m)
    return best


def _solve_affine(alpha: float, beta: float, work: float, target: float) -> float | None:
    """The m above which (alpha + beta m) / (m work + alpha + beta m) < target; None if never."""
    denominator = target * work - beta * (1 - target)
    if denominator <= 0:
        return None
    return max(0.0, alpha * (1 - target) / denominator)


def _first_below(curve: _Curve, fraction: Callable[[int], float], start: int, bound: float, target: float,
                 max_m: int) -> int | None:
    """The smallest accepted m >= start whose (cheap, falling) `fraction` is below target, starting
    from the real-valued `bound` the formula solves to; the two loops absorb rounding at the boundary."""
    m = curve.valid(max(start, math.floor(bound) + 1))
    while m <= max_m and not below(fraction(m), target):
        m = curve.valid(m + 1)
    if m > max_m:
        return None
    prev = curve.previous(m)
    while prev is not None and prev >= start and below(fraction(prev), target):
        m, prev = prev, curve.previous(prev)
    return m


def _settle(curve: _Curve, m: int, lo: int, target: float, fit: str) -> TargetM:
    """Check a predicted m by simulation (lo is an m known to miss the target): step up while m misses
    it, then down while the m below meets it too, since the bubble wobbles around its affine fit by a
    fraction of a pass. Past VERIFY_STEPS simulations or SIMULATION_BUDGET passes it stops and
    reports the m reached as extrapolated."""
    simulations = 0

    def extrapolated(at: int) -> TargetM:
        return TargetM(at, f"{SIMULATOR} (extrapolated)", f"{fit}; not checked by simulation at m={at}")

    while True:                                   # up until m meets the target
        if not curve.affordable(m) or simulations >= VERIFY_STEPS:
            return extrapolated(m)
        simulations += 1
        if below(curve.fraction(m), target):
            break
        m = curve.valid(m + 1)
    while True:                                   # down while the m below meets it too
        prev = curve.previous(m)
        if prev is None or prev <= lo:
            return TargetM(m, SIMULATOR)
        if simulations >= VERIFY_STEPS:
            return extrapolated(m)
        simulations += 1
        if not below(curve.fraction(prev), target):
            return TargetM(m, SIMULATOR)
        m = prev


def _closed_search(curve: _Curve, start: int, target: float, max_m: int) -> TargetM:
    """Closed form from `start` on: the bubble b does not depend on m, so m > b(1-t)/(t T)."""
    first = curve.at(start)
    if below(first.bubble_fraction, target):
        # The closed form meets it at its first exact m; smaller m need the simulator.
        best = _scan_down(curve, start, target)
        return TargetM(best, CLOSED_FORM if best == start else SIMULATOR)
    bound = _solve_affine(first.bubble, 0.0, first.ideal / start, target)
    m = None if bound is None else _first_below(curve, curve.fraction, start, bound, target, max_m)
    if m is None:
        return TargetM(None, CLOSED_FORM, f"needs more than {max_m} microbatches")
    return TargetM(m, CLOSED_FORM)


def _simulated_search(curve: _Curve, target: float, max_m: int) -> TargetM:
    """Simulator only. Past the fill (m >= 2p) the bubble is affine in m, bubble = a + b m (b > 0 when
    the steady state is bound by comm round trips or by a block that assumes equal passes), so
    simulations at m = 2p, 4p and 8p fix it and check it; the m it predicts is then exact. When the
    three disagree, the prediction is checked by simulation and narrowed by bisection. Assumes the
    fraction falls as m grows (true whenever a > 0)."""
    m_a = curve.valid(2 * curve.p)
    m_b = curve.valid(2 * m_a)
    m_c = curve.valid(2 * m_b)
    e_a = curve.at(m_a)
    if below(e_a.bubble_fraction, target):
        return TargetM(_scan_down(curve, m_a, target), SIMULATOR)
    e_b, e_c = curve.at(m_b), curve.at(m_c)
    work = e_c.ideal / m_c
    slope_ab = (e_b.bubble - e_a.bubble) / (m_b - m_a)
    beta = max(0.0, (e_c.bubble - e_b.bubble) / (m_c - m_b))
    alpha = e_c.bubble - beta * m_c
    fit = f"bubble = {alpha:.6g} + {beta:.6g} m from simulations at m={m_a}, {m_b}, {m_c}"
    bound = _solve_affine(alpha, beta, work, target)
    if bound is None:
        return TargetM(None, SIMULATOR, f"the bubble grows with m ({fit}); the fraction tends to "
                                        f"{beta / (work + beta):.4f}, never below {target:g}")
    if math.isclose(slope_ab, beta, rel_tol=1e-6, abs_tol=1e-9):
        def model(m: int) -> float:
            bubble = alpha + beta * m
            return bubble / (m * work + bubble)
        m = _first_below(curve, model, m_a + 1, bound, target, max_m)
        if m is None:
            return TargetM(None, SIMULATOR, f"needs more than {max_m} microbatches ({fit})")
        return _settle(curve, m, m_a, target, fit)
    # Not affine yet: check the prediction by simulation and bisect.
    lo, hi = m_a, None            # lo fails; hi meets
    m = curve.valid(max(m_a + 1, math.floor(bound) + 1))
    while hi is None:
        if m > max_m:
            return TargetM(None, SIMULATOR, f"needs more than {max_m} microbatches")
        if not curve.affordable(m):
            return TargetM(m, f"{SIMULATOR} (extrapolated)", f"{fit}; simulated up to m={lo}")
        if below(curve.fraction(m), target):
            hi = m
        else:
            lo, m = m, curve.valid(2 * m)
    while True:                    # bisect over accepted m in (lo, hi]
        prev = curve.previous(hi)
        if prev is None or prev <= lo:
            return TargetM(hi, SIMULATOR)
        mid = min(prev, curve.valid((lo + hi) // 2 + 1))
        if below(curve.fraction(mid), target):
            hi = mid
        else:
            lo = mid


def microbatches_for_target(schedule: str, p: int, target: float, v: int = 1, *,
                            times: PassTimes | None = None, profile: Profile | None = None,
                            objective: str = "makespan", max_m: int = MAX_MICROBATCHES,
                            budget: int = SIMULATION_BUDGET) -> TargetM:
    """The smallest accepted m whose bubble fraction is below `target`, and how it was found.

    Uses the closed form wherever it is exact (solving bubble / (m T + bubble) < target for m) and the
    simulator elsewhere (below the closed form's smallest m, or for profiles and times it does not
    cover). Respects the schedule's rule on m (a multiple of p for interleaved, even and >= 2p for
    DualPipe, >= 2p for DualPipeV). `times` defaults to the profile's, else F = B = W = 1, comm 0.
    Simulations stop at `budget` passes (about 3 p m chunks); an m past it is reported as
    extrapolated from an affine fit of the bubble (exact on average, off by a few m at most).

    Returns
    -------
    TargetM
        m None when no m up to `max_m` gets there (e.g. a comm-bound 1F1B whose fraction levels off).

    Raises
    ------
    PlanError
        target outside (0, 1).
    PreconditionError
        The schedule is not defined for p ranks.
    """
    check_target(target)
    check_objective(objective)
    if schedule not in REGISTRY:
        raise PreconditionError(f"unknown schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    need = ranks_problem(schedule, p)
    if need:
        raise PreconditionError(f"{schedule} needs {need}; got p={p}")
    if profile is not None and profile.num_stages != p:
        raise PreconditionError(f"profile {profile.name!r} has {profile.num_stages} stages, not p={p}")
    curve = _Curve(schedule, p, v, objective, times, profile, budget)
    start = curve.closed_from()
    if start is not None:
        return _closed_search(curve, start, target, max_m)
    return _simulated_search(curve, target, max_m)


def min_microbatches(schedule: str, p: int, target: float, v: int = 1, **kwargs: Any) -> int | None:
    """The smallest m whose bubble fraction (bubble / (ideal + bubble)) is below `target`.

    Keyword arguments as `microbatches_for_target` (times, profile, objective, max_m); None when no m
    reaches it. For 1F1B, (p-1)/(m+p-1) < target: p = 8, target 0.1 gives 64 (63 gives exactly 0.1).

    Examples
    --------
    >>> min_microbatches("1f1b", 8, 0.1)
    64
    """
    return microbatches_for_target(schedule, p, target, v, **kwargs).m


# -- the planner ----------------------------------------------------------------------------------

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
                    "target_source": self.target.source, "target_note": self.target.note})
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "p": self.p, "m": self.m, "m_source": self.m_source, "chunks": self.v, "objective": self.objective,
            "bubble_fraction_convention": FRACTION_CONVENTION, "bubble_ratio_convention": RATIO_CONVENTION,
            "memory_convention": MEMORY_CONVENTION, "target_bubble": self.target, "profile": self.profile,
            "time_unit": self.time_unit, "mem_limit": self.mem_limit,
            "mem_limit_stage_units": self.mem_limit_stage_units,
            "schedules": [row.to_dict() for row in self.rows],
            "skipped": [s.to_dict() for s in self.skipped],
            "recommendation": self.recommendation, "reason": self.reason,
        }


def _fits(est: Estimate, limit_units: Sequence[float] | None) -> bool:
    if limit_units is None:
        return True
    if est.peak_memory_per_rank is not None:
        return all(peak <= lim or _close(peak, lim) for peak, lim in zip(est.peak_memory_per_rank, limit_units))
    lim = min(limit_units)
    return est.peak_memory <= lim or _close(est.peak_memory, lim)


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
    tied = [r for r in fitting if _close(r.estimate.bubble_fraction, best_bubble)]

    def key(r: PlanRow) -> tuple[float, float, int]:
        return (round(r.estimate.peak_memory, 9), round(r.estimate.p2p_relative, 9), r.estimate.param_copies)

    order = {row.schedule: i for i, row in enumerate(rows)}
    chosen = min(tied, key=lambda r: (key(r), order[r.schedule]))
    est = chosen.estimate
    scope = (f"the {len(fitting)} schedules within --mem-limit {mem_limit}" if mem_limit
             else f"all {len(fitting)} applicable schedules (no --mem-limit)")
    reason = (f"smallest bubble ({_pct(est.bubble_fraction)} of the iteration, "
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
    interleaved 1F1B's chunks per rank (v = 1 would only repeat 1F1B, so it is then left out).

    Raises
    ------
    PlanError
        p < 2, or target outside (0, 1).
    """
    p = profile.num_stages
    if p < 2:
        raise PlanError(f"pipelining needs at least 2 ranks, got p={p}: use 2 or more (one rank has no bubble)")
    check_target(target)
    check_objective(objective)
    if v < 1:
        raise PlanError(f"chunk count {v} is too small: interleaved-1f1b needs 2 or more chunks per rank")
    limit_units = None if limit is None or limit.unlimited else limit.in_stage_units(profile)
    rows: list[PlanRow] = []
    skipped: list[Skipped] = []
    for name in schedules:
        if name == "interleaved-1f1b" and v == 1:
            skipped.append(Skipped(name, "--chunks 1 makes it 1f1b"))
            continue
        need = ranks_problem(name, p)
        if need:
            skipped.append(Skipped(name, f"needs {need}"))
            continue
        target_m = microbatches_for_target(name, p, target, v, profile=profile, objective=objective)
        need = m_problem(name, p, m, v)
        if need:
            skipped.append(Skipped(name, f"needs {need}", target_m))
            continue
        est = estimate(name, profile, m, v, objective)
        rows.append(PlanRow(est, _fits(est, limit_units), target_m))
    chosen, reason = recommend(rows, None if limit_units is None else limit.text)  # type: ignore[union-attr]
    return Plan(
        p=p, m=m, m_source=m_source, v=v, objective=objective, target=target, profile=profile.name,
        time_unit=profile.time_unit, mem_limit=None if limit is None else limit.text,
        mem_limit_stage_units=None if limit_units is None else min(limit_units),
        rows=tuple(rows), skipped=tuple(skipped), recommendation=None if chosen is None else chosen.schedule,
        reason=reason,
    )


__all__ = [
    "CLOSED_FORM", "Estimate", "OBJECTIVES", "PassTimes", "Plan", "PlanError", "PlanRow", "SCHEDULES", "SIMULATOR",
    "Skipped", "TargetM", "below", "bubble_fraction", "bubble_ratio", "bubble_time", "check_target", "closed_form",
    "estimate", "microbatches_for_target", "microbatches_from_batch", "m_problem", "m_rule", "min_microbatches",
    "next_valid_m", "p2p_relative", "parameter_copies", "peak_activation_memory", "plan", "previous_valid_m",
    "profile_for", "recommend", "simulated",
]
