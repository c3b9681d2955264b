"""The solver's start: the best valid heuristic on the problem's placement, and better starts from
searches that cost more than one greedy run, so solve() gives each a share of its time limit and keeps
what they find only when it is shorter and passes the validator.

- heuristic_start: the best of the greedy family and the handcrafted schedules on the placement, or
  microbatches one at a time when none fits;
- tuned_start: the list greedy with its choices tuned rank by rank (greedy/tune.py);
- periodic_start: on chunked placements (V-shape, interleaved) under a memory limit, the periodic
  schedule (greedy/modulo.py);
- better_starts: the last two in solve's order, from the heuristic start: what solve() starts CP-SAT from,
  and what the partition search gives its named splits (so that no split it names starts worse there than
  under `--partition NAME`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...core.errors import ZbsearchError
from ...core.ir import Action, Kind, Schedule, build
from ...core.objective import Status, status_for
from ...sim.simulate import Timeline
from ...sim.validate import check
from ..greedy.candidates import candidates, engine_schedule
from ..greedy.modulo import best_periodic
from ..greedy.options import GreedyOptions
from ..greedy.tune import tune
from ..problem import Problem


class Start(NamedTuple):
    """A valid schedule the solver holds: its name, the schedule, its validated timeline, its objective."""

    name: str
    schedule: Schedule
    timeline: Timeline
    objective: float


@dataclass(frozen=True)
class Origin:
    """Where a better start came from: the name of the start it replaced and, for the tuning, the
    evaluation that found it."""

    replaced: str
    found_at_evaluation: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`solve --json`'s tuned_start and periodic_start)."""
        out: dict[str, Any] = {"from": self.replaced}
        if self.found_at_evaluation is not None:
            out["found_at_evaluation"] = self.found_at_evaluation
        return out


@dataclass(frozen=True)
class Improved:
    """What a search for a better start returns: the start to go on with, and where it came from (None
    where it is the start it was given)."""

    start: Start
    origin: Origin | None = None


def one_at_a_time(problem: Problem, weights_at_once: bool = False, fused: bool = False) -> Schedule:
    """Microbatches strictly one after another: slow, but it fits the smallest feasible limit, so the
    solver always has a valid start. With `weights_at_once`, each W runs right after its B; `fused`, as
    one fused backward (what the smallest limit needs when B leaves more held than F, as under torch's
    runtime memory)."""
    ranks: list[list[Action]] = [[] for _ in range(problem.num_ranks)]
    pl, m = problem.placement, problem.num_microbatches
    for i in range(m):
        route = pl.route(i, m)
        for c in route:
            ranks[pl.chunk_to_rank[c]].append(Action(c, Kind.F, i))
        for c in reversed(route):
            ranks[pl.chunk_to_rank[c]].append(Action(c, Kind.FULL_B if fused else Kind.B, i))
            if weights_at_once and not fused:
                ranks[pl.chunk_to_rank[c]].append(Action(c, Kind.W, i))
        for c in route if not (weights_at_once or fused) else ():
            ranks[pl.chunk_to_rank[c]].append(Action(c, Kind.W, i))
    return build("one-at-a-time", pl, m, ranks)


def heuristic_start(problem: Problem, deadline: float | None = None) -> Start:
    """The best valid heuristic schedule on this problem's placement, or microbatches one at a time
    when no heuristic fits. Candidates are ranked by exact timing first and only the winner is
    validated (unless it fails): a full validation at p=32, m=128 takes a second and a half. Past
    `deadline` (time.monotonic()), no more greedy variants than one that fits (candidates)."""
    for found in candidates(problem, top=1, same_placement=True, deadline=deadline):
        if found.schedule.placement == problem.placement:
            return Start(*found, problem.objective.of(found.timeline))
    fallback = one_at_a_time(problem)
    report = check(fallback, problem.profile, problem.limit)
    for options in ({"weights_at_once": True}, {"fused": True}):
        if not report.ok:
            fallback = one_at_a_time(problem, **options)
            report = check(fallback, problem.profile, problem.limit)
    if not report.ok or report.timeline is None:
        raise ZbsearchError(f"no heuristic produced a valid schedule ({report.problems[0]}); this is a bug, please report it")
    return Start("one-at-a-time", fallback, report.timeline, problem.objective.of(report.timeline))


def tuned_start(problem: Problem, start: Start, deadline: float, seed: int) -> Improved:
    """The per-rank tuned list greedy where it is shorter than `start` and valid, with where it came
    from; else `start` alone."""
    base = GreedyOptions("list", by_route=len(problem.placement.routes) > 1)
    tuned = tune(problem, base=base, deadline=deadline, seed=seed)
    if tuned is None or tuned.cost >= start.objective * (1 - 1e-12):
        return Improved(start)
    found = valid_start(problem, engine_schedule(tuned.result, problem, tuned.options))
    if found is None:
        return Improved(start)
    return Improved(found, Origin(start.name, tuned.found_at))


def periodic_applies(problem: Problem) -> bool:
    """Whether the periodic start is tried: one route, some rank holding several chunks, a finite
    limit (where it has beaten the other starts; see greedy/modulo.py)."""
    pl = problem.placement
    return len(pl.routes) == 1 and pl.num_chunks > pl.num_ranks \
        and not problem.limit.unlimited


def periodic_start(problem: Problem, start: Start, deadline: float) -> Improved:
    """The best periodic schedule where it is shorter than `start` and valid, with where it came from;
    else `start` alone."""
    found = best_periodic(problem, deadline)
    if found is None or found.objective >= start.objective * (1 - 1e-12):
        return Improved(start)
    valid = valid_start(problem, found.schedule)
    if valid is None:
        return Improved(start)
    return Improved(valid, Origin(start.name))


def valid_start(problem: Problem, schedule: Schedule) -> Start | None:
    """The schedule as a Start when it passes the validator under the problem's limit, else None."""
    report = check(schedule, problem.profile, problem.limit)
    if not report.ok or report.timeline is None:
        return None
    return Start(schedule.name, schedule, report.timeline, problem.objective.of(report.timeline))


@dataclass(frozen=True)
class Starts:
    """The start to go on with, and the starts the tuning and the periodic schedule replaced."""

    start: Start
    tuned: Origin | None = None
    periodic: Origin | None = None


def better_starts(problem: Problem, start: Start, lb: float, tune_seconds: float, periodic_seconds: float,
                  seed: int, until: float = math.inf) -> Starts:
    """`start`, or a better valid one from the per-rank tuned list greedy (for `tune_seconds`) and, on
    chunked placements under a limit, the periodic schedule (`periodic_seconds`, from when the tuning
    ends), neither past `until` (time.monotonic()); `start` unchanged when it meets the bound `lb` already.
    Also where each came from. Each search stops at its deadline or when it is done (the tuning's
    evaluation cap, the periodic sweep): the same problem, start and seed give the same answer unless a
    deadline cuts one short."""
    if status_for(start.objective, lb) is Status.OPTIMAL:
        return Starts(start)
    tuned = tuned_start(problem, start, min(time.monotonic() + tune_seconds, until), seed)
    if status_for(tuned.start.objective, lb) is Status.OPTIMAL or not periodic_applies(problem):
        return Starts(tuned.start, tuned.origin)
    periodic = periodic_start(problem, tuned.start, min(time.monotonic() + periodic_seconds, until))
    return Starts(periodic.start, tuned.origin, periodic.origin)
