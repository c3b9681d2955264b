"""What `zbsearch solve` reports: the schedule's summary plus how good the search proved it to be.

`SolveReport.to_dict()` is the object `zbsearch solve --json` prints: the summary's keys, then the
search's (schedule_share last: the objective's bubble less the stage imbalance), then the solver's
diagnostics (`SolveDetails.to_dict`: cpsat_status, grid_step, grid_rounds, placements, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.ir import Schedule
from ...core.objective import Objective, Status
from ...sim.simulate import Timeline
from ...sim.summary import Summary, summarize
from ..exact.lns_report import LnsStats
from ..options import Progress
from ..problem import Problem
from .starts import Origin

__all__ = ["GridRound", "PartitionDetails", "PlacementOutcome", "Progress", "RankFacts", "SolveDetails",
           "SolveReport", "SolveResult", "SplitFacts"]


@dataclass(frozen=True)
class GridRound:
    """One CP-SAT call on a time grid: its step, how it ended, its wall time, why its answer was
    dropped, where it was, and whether it gave up its time to the large-neighbourhood search (its bound had
    not risen: grid.py's _give_up)."""

    grid_step: float
    cpsat_status: Status
    cpsat_seconds: float
    rejected: str | None = None
    gave_up: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"grid_step": self.grid_step, "cpsat_status": self.cpsat_status,
                               "cpsat_seconds": self.cpsat_seconds}
        if self.rejected is not None:
            out["rejected"] = self.rejected
        if self.gave_up:
            out["gave_up"] = True
        return out


@dataclass(frozen=True)
class PlacementOutcome:
    """One placement's result in a solve over several."""

    objective: float
    lower_bound: float
    status: Status

    def to_dict(self) -> dict[str, Any]:
        return {"objective": self.objective, "lower_bound": self.lower_bound, "status": self.status}


@dataclass(frozen=True)
class RankFacts:
    """One rank of a plan's split: the layers of each of its chunks (chunk index, layer names), static
    bytes, peak activation bytes, their sum, the whole-rank cap (None where the limit is a multiple of p,
    which leaves static bytes out), whether its activations fit, and what recompute does there (the keys
    of core.recompute.levels.recompute_facts; empty where it recomputes nothing)."""

    rank: int
    chunks: tuple[tuple[int, tuple[str, ...]], ...]
    static_bytes: float
    peak_activation_bytes: float
    total_bytes: float
    cap_bytes: float | None
    fits: bool
    recompute: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "chunks": [{"chunk": c, "layers": list(names)} for c, names in self.chunks],
                "static_bytes": self.static_bytes, "peak_activation_bytes": self.peak_activation_bytes,
                "total_bytes": self.total_bytes, "cap_bytes": self.cap_bytes, "fits": self.fits, **self.recompute}


@dataclass(frozen=True)
class SplitFacts:
    """A plan's split of a layer-level profile, chosen by `rule`: layers per chunk in route order, each
    chunk's layer names by chunk index, and the ranks' facts."""

    rule: str
    layers_per_chunk: tuple[int, ...]
    chunks: tuple[tuple[str, ...], ...]
    ranks: tuple[RankFacts, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "layers_per_chunk": list(self.layers_per_chunk),
                "chunks": [list(names) for names in self.chunks], "ranks": [r.to_dict() for r in self.ranks]}


@dataclass(frozen=True)
class PartitionDetails:
    """What the partition search adds: where the chosen split came from, its own bound and the bound over
    every split (overall and per placement: bound, splits bounded, whether the walk finished, the best
    plan found there), how many splits were scored, the rule, and the split's per-rank facts."""

    rule: str
    own_split_bound: float
    any_split_bound: float
    any_split_bound_by_placement: dict[str, dict[str, Any]]
    splits_scored: int
    facts: SplitFacts
    origin: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.origin is None else {"split_origin": self.origin}
        return {**out, "own_split_bound": self.own_split_bound, "any_split_bound": self.any_split_bound,
                "any_split_bound_by_placement": self.any_split_bound_by_placement,
                "splits_scored": self.splits_scored, "partition_rule": self.rule, "partition": self.facts.to_dict()}


@dataclass(frozen=True)
class PairBound:
    """The best bound the phase proved (`value`), the ranks kept for it, whether CP-SAT proved that
    relaxation's optimum, how many pairs it tried and the seconds it took."""

    value: float
    kept: tuple[int, ...]
    proven: bool
    tried: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"pair_bound": self.value, "pair_bound_ranks": list(self.kept), "pair_bound_proven": self.proven,
                "pair_bound_pairs_tried": self.tried, "pair_bound_seconds": round(self.seconds, 2)}


@dataclass(frozen=True)
class SolveDetails:
    """The solver's diagnostics. `cpsat_status`: the last grid round's status, or why CP-SAT did not run;
    `cpsat_bound`: why CP-SAT's bound is not used, where it is not; `tuned_start` and `periodic_start`:
    the start each replaced (and, for the tuning, at which evaluation it was found); `lns_not_run`: why
    the large-neighbourhood search did not run on a start it could not read; `fused_backwards`: how many
    B and W pairs were fused at the end; `placements`: each placement's outcome in a solve over several;
    `partition`: the partition search's facts; `uncapped_bound`: no plan of the answer's split and placement
    beats it without the memory limit (search/entry/find_plan.py; None where the limit is none); `pair_bound`: what
    the pair phase proved (solve/pair_phase.py), where it ran."""

    cpsat_status: str = "not run"
    cpsat_bound: str | None = None
    tuned_start: Origin | None = None
    periodic_start: Origin | None = None
    grid_rounds: tuple[GridRound, ...] = ()
    lns: LnsStats | None = None
    lns_not_run: str | None = None
    fused_backwards: int | None = None
    placements: dict[str, PlacementOutcome] | None = None
    partition: PartitionDetails | None = None
    uncapped_bound: float | None = None
    pair_bound: PairBound | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON keys, in the order the solver reached them; absent ones left out."""
        out: dict[str, Any] = {"cpsat_status": self.cpsat_status}
        if self.cpsat_bound is not None:
            out["cpsat_bound"] = self.cpsat_bound
        for key, origin in (("tuned_start", self.tuned_start), ("periodic_start", self.periodic_start)):
            if origin is not None:
                out[key] = origin.to_dict()
        if self.grid_rounds:
            out.update(self.grid_rounds[-1].to_dict())
            out["cpsat_status"] = self.cpsat_status
            out["grid_rounds"] = [r.to_dict() for r in self.grid_rounds]
        if self.lns is not None:
            out.update(self.lns.to_dict())
        if self.lns_not_run is not None:
            out["lns"] = self.lns_not_run
        if self.fused_backwards is not None:
            out["fused_backwards"] = self.fused_backwards
        if self.placements is not None:
            out["placements"] = {name: o.to_dict() for name, o in self.placements.items()}
        if self.partition is not None:
            out.update(self.partition.to_dict())
        if self.uncapped_bound is not None:
            out["uncapped_bound"] = self.uncapped_bound
        if self.pair_bound is not None:
            out.update(self.pair_bound.to_dict())
        return out


@dataclass(frozen=True)
class SolveReport:
    """Times in the profile's time unit, like the summary's."""

    summary: Summary
    objective: Objective
    objective_value: float
    lower_bound: float
    bubble_rate_lower_bound: float  # the bubble rate no schedule can beat under the objective
    gap: float  # (objective_value - lower_bound) / objective_value
    status: Status  # optimal (the incumbent meets a proven bound) or feasible
    solve_seconds: float
    start_heuristic: str
    heuristic_objective: float
    details: SolveDetails = field(default_factory=SolveDetails)

    @property
    def bubble_rate(self) -> float:
        """The schedule's bubble rate under the objective it was solved for."""
        return self.summary.bubble_rate(self.objective)

    @property
    def schedule_share(self) -> float:
        """The bubble rate under the objective less the stage imbalance: what the schedule adds."""
        return self.summary.schedule_share(self.objective)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.summary.to_dict(),
            "objective": self.objective,
            "objective_value": self.objective_value,
            "lower_bound": self.lower_bound,
            "bubble_rate_lower_bound": self.bubble_rate_lower_bound,
            "gap": self.gap,
            "status": self.status,
            "solve_seconds": self.solve_seconds,
            "start_heuristic": self.start_heuristic,
            "heuristic_objective": self.heuristic_objective,
            "schedule_share": self.schedule_share,
            **self.details.to_dict(),
        }


@dataclass(frozen=True)
class SolveResult:
    """What a solve found: the schedule, its validated timeline and objective, the proven lower bound,
    whether the two meet (status), the time taken, the start it improved on, and the diagnostics."""

    problem: Problem
    schedule: Schedule
    timeline: Timeline
    objective: float
    lower_bound: float
    status: Status  # optimal (incumbent equals a proven bound) or feasible
    solve_seconds: float
    start_heuristic: str
    heuristic_objective: float
    details: SolveDetails = field(default_factory=SolveDetails)

    @property
    def gap(self) -> float:
        return 0.0 if self.objective <= 0 else max(0.0, (self.objective - self.lower_bound) / self.objective)

    def report(self) -> SolveReport:
        summary = summarize(self.timeline, self.problem.limit)
        work = sum(summary.work_per_rank)
        p = self.problem.num_ranks
        return SolveReport(
            summary=summary,
            objective=self.problem.objective,
            objective_value=self.objective,
            lower_bound=self.lower_bound,
            # The bubble rate no schedule can beat, under the chosen objective.
            bubble_rate_lower_bound=max(0.0, 1 - work / (p * self.lower_bound)) if self.lower_bound > 0 else 0.0,
            gap=self.gap,
            status=self.status,
            solve_seconds=self.solve_seconds,
            start_heuristic=self.start_heuristic,
            heuristic_objective=self.heuristic_objective,
            details=self.details,
        )
