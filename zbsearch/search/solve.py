"""zbsearch's search: heuristics for a strong start, CP-SAT to improve it, bounds to say how good it is.

solve() never returns anything worse than the best valid heuristic, and everything it returns has
passed the validator with the exact profile times and the exact memory limit.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .bounds import RankBound, objective_bound, rank_bounds
from .relaxations import bound_passes, fusion_saves
from .cpsat import choose_step, orders_from_starts, solve_grid
from .incumbent import fuse_if_faster, objective_of, split_backward
from . import lns
from ..core.errors import InfeasibleError, ZbsearchError
from ..core.ir import Action, Kind, Schedule, build
from .problem import Problem, on_grid
from ..sim.summary import summarize
from .solve_report import SolveReport
from .starts import Start, periodic_applies, periodic_start, tuned_start
from ..sim.simulate import Timeline, simulate
from ..sim.validate import check

# Share of the time limit kept back for re-timing and validating CP-SAT's answer at the end.
RESERVE = 0.10
# Finest grid the refinement goes to: the shortest pass in this many units.
MAX_RESOLUTION = 320
# CP-SAT cannot stop before its presolve and its first full-model search task are done, and on this
# 2-core machine those took about 2.9 ms per pass (26.6 s at p=32, m=96: 9,216 passes), whatever its
# time limit. With less time left than that, the call would only overrun, so it is skipped.
CPSAT_SECONDS_PER_PASS = 0.003
# Models up to this many passes start on the exact grid when there is one (see solve).
EXACT_FIRST_MAX_PASSES = 600
# Share of the time limit the per-rank tuning of the list greedy may take (greedy_tune.py); it stops
# sooner when its search settles, in about a second on p=8, m=25.
TUNE_SHARE = 0.15
# Share of the time limit for the periodic start (greedy_modulo.py), where it applies.
PERIODIC_SHARE = 0.1
# Share of the time limit the walk of the deepest rank's window may take (window_nesting.py): on the
# paper's V-shape at 1p it proves the start optimal in 0.1 s (p=16, m=48) to about 5 s (p=32, m=256).
NEST_SHARE = 0.3
# Relative tolerance under which the incumbent counts as equal to the lower bound (proven optimal).
OPTIMAL_RTOL = 1e-9


@dataclass(frozen=True)
class Progress:
    """One progress event: elapsed seconds, the incumbent and the bound in the profile's time unit."""

    elapsed: float
    incumbent: float
    bound: float
    phase: str


@dataclass
class SolveResult:
    problem: Problem
    schedule: Schedule
    timeline: Timeline
    objective: float
    lower_bound: float
    status: str  # optimal (incumbent equals a proven bound) or feasible
    solve_seconds: float
    start_heuristic: str
    heuristic_objective: float
    details: dict[str, Any] = field(default_factory=dict)

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
            details=dict(self.details),
        )


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


def heuristic_start(problem: Problem) -> tuple[str, Schedule, Timeline]:
    """The best valid heuristic schedule on this problem's placement, or microbatches one at a time
    when no heuristic fits. Candidates are ranked by exact timing first and only the winner is
    validated (unless it fails): a full validation at p=32, m=128 takes a second and a half."""
    from . import heuristics

    for name, s, t in heuristics.candidates(problem.profile, problem.num_microbatches, problem.limit,
                                            problem.objective, placements=[problem.placement], top=1,
                                            same_placement=True):
        if s.placement == problem.placement:
            return name, s, t
    fallback = one_at_a_time(problem)
    report = check(fallback, problem.profile, problem.limit)
    for options in ({"weights_at_once": True}, {"fused": True}):
        if not report.ok:
            fallback = one_at_a_time(problem, **options)
            report = check(fallback, problem.profile, problem.limit)
    if not report.ok:
        raise ZbsearchError(f"no heuristic produced a valid schedule ({report.problems[0]}); this is a bug, please report it")
    assert report.timeline is not None
    return "one-at-a-time", fallback, report.timeline


def solve(
    problem: Problem, *, time_limit: float = 30.0, workers: int = 2, seed: int = 0, resolution: int = 20,
    progress: Callable[[Progress], None] | None = None,
) -> SolveResult:
    """Find the best schedule for `problem` within `time_limit` seconds. Raises InfeasibleError (stating
    the smallest feasible limit) when the memory limit cannot be met."""
    t0 = time.monotonic()
    problem.check_feasible()
    name, best, best_tl = heuristic_start(problem)
    best_obj = objective_of(best_tl, problem.objective)
    real_bounds = rank_bounds(problem, problem.passes, deadline=time.monotonic() + NEST_SHARE * time_limit)
    # Where the profile gives an F&B pair time, a pass in a pair takes less than its own time; where a
    # fused backward costs less than B and W apart (an action overhead, a measured full backward), a
    # fused one beats the split pair. The proven bound is then the passes' at their shortest
    # (relaxations.bound_passes), and CP-SAT's (its model has neither pairs nor fused backwards) is unused.
    pairs, fusing = problem.profile.gives_overlap, fusion_saves(problem)
    relaxed = pairs or fusing
    lb = objective_bound(rank_bounds(problem, bound_passes(problem), deadline=time.monotonic() + NEST_SHARE * time_limit)
                         if relaxed else real_bounds, problem.objective)
    details: dict[str, Any] = {"cpsat_status": "not run"}
    if pairs:
        details["cpsat_bound"] = "not used: the profile gives an F&B overlap time and the CP-SAT model has no pairs"
    elif fusing:
        details["cpsat_bound"] = ("not used: a fused backward costs less than B and W apart here and the CP-SAT model "
                                  "splits every backward")
    name, best, best_tl, best_obj = _better_starts(problem, (name, best, best_tl, best_obj), lb, time_limit, seed, details)
    start, heuristic_obj = best, best_obj
    if progress:
        progress(Progress(time.monotonic() - t0, best_obj, lb, "heuristics"))

    # Solve on a coarse grid first; while CP-SAT proves each grid optimal and time remains, refine
    # the grid: each grid's bound holds, and finer grids lose less time to rounding.
    res = resolution
    rounds: list[dict[str, Any]] = []
    deadline = time_limit * (1 - RESERVE) - 0.5
    # A small model whose times all sit on a common grid goes straight to that grid: only there can
    # a span be proven optimal (a coarser grid's bound loses a step), and the coarse rounds before it
    # cost small models more than they save.
    exact = exact_step(problem) if len(problem.passes) <= EXACT_FIRST_MAX_PASSES else None
    while best_obj > lb * (1 + OPTIMAL_RTOL) and deadline - (time.monotonic() - t0) > 0.5:
        if deadline - (time.monotonic() - t0) < len(problem.passes) * CPSAT_SECONDS_PER_PASS:
            details["cpsat_status"] = "skipped: too little time left for a model of this size"
            break
        step = exact if exact is not None else choose_step(problem, res)
        outcome = _grid_round(problem, real_bounds, best, best_tl, step, t0, deadline, workers, seed, lb, best_obj,
                              progress, trust_bound=not relaxed)
        rounds.append({"grid_step": step, "cpsat_status": outcome.status, "cpsat_seconds": round(outcome.wall, 2)})
        if not relaxed:
            lb = max(lb, outcome.bound)
        if outcome.rejected:
            rounds[-1]["rejected"] = outcome.rejected
        if outcome.timeline is not None:
            obj = objective_of(outcome.timeline, problem.objective)
            if obj < best_obj * (1 - 1e-12):
                best, best_tl, best_obj = outcome.schedule, outcome.timeline, obj
        if outcome.status != "optimal" or exact is not None or grid_is_exact(problem, step) or res >= MAX_RESOLUTION:
            break
        # A finer grid costs at least another model build, and CP-SAT overruns its limit by about
        # that much on large models: only refine when the time left is well above it.
        if deadline - (time.monotonic() - t0) < 3 * outcome.build + 1.0:
            break
        res *= 2
    if rounds:
        details.update(rounds[-1])
        details["grid_rounds"] = rounds
    # Where the full model was skipped or stalled on the start, the time left goes to re-solving windows
    # of it (lns.py). Not after a grid proven optimal: windows on a grid could only win back rounding.
    stalled = best is start and (not rounds or rounds[-1]["cpsat_status"] != "optimal")
    if stalled and best_obj > lb * (1 + OPTIMAL_RTOL):
        best, best_tl, best_obj = _improve_by_lns(problem, best, best_tl, best_obj, t0 + deadline, workers, seed,
                                                  resolution, details)
        if progress and details.get("lns_windows"):
            progress(Progress(time.monotonic() - t0, best_obj, lb, "lns"))
    if fusing:
        best, best_tl, best_obj = fuse_if_faster(problem, best, best_tl, best_obj, details)
    status = "optimal" if best_obj <= lb * (1 + OPTIMAL_RTOL) else "feasible"
    meta = dict(best.meta, solver="zbsearch", start_heuristic=name, objective=problem.objective)
    schedule = Schedule("zbsearch" if best is not start else name, best.placement, best.num_microbatches, best.ranks, meta)
    return SolveResult(problem, schedule, best_tl, best_obj, min(lb, best_obj), status,
                       time.monotonic() - t0, name, heuristic_obj, details)


AUTO_PLACEMENTS = ("linear", "v")
# Placements `auto` adds when the user allows a second parameter copy per rank.
PARAM_COPY_PLACEMENTS = ("dualpipe",)


def solve_placements(
    problems: list[Problem], *, time_limit: float = 30.0, workers: int = 2, seed: int = 0,
    resolution: int = 20, progress: Callable[[Progress], None] | None = None,
) -> SolveResult:
    """Solve the same pipeline under several placements and return the best schedule.

    Each placement gets an equal share of the time still left when its turn comes, so time a
    placement does not need (it proved its optimum) goes to the next. The lower bound is the smallest
    of the placements' bounds: the best schedule over all of them is no better than that.
    """
    t0 = time.monotonic()
    results: list[SolveResult] = []
    refused: list[InfeasibleError] = []
    for k, problem in enumerate(problems):
        share = (time_limit - (time.monotonic() - t0)) / (len(problems) - k)
        try:
            results.append(solve(problem, time_limit=max(share, 0.0), workers=workers, seed=seed,
                                 resolution=resolution, progress=progress))
        except InfeasibleError as exc:
            refused.append(exc)
    if not results:
        raise refused[0]
    best = min(results, key=lambda r: (r.objective, max(r.timeline.peak_memory(q) for q in range(r.problem.num_ranks))))
    best.lower_bound = min(r.lower_bound for r in results)
    best.status = "optimal" if best.objective <= best.lower_bound * (1 + OPTIMAL_RTOL) else "feasible"
    best.solve_seconds = time.monotonic() - t0
    best.details["placements"] = {
        r.problem.placement.name: {"objective": r.objective, "lower_bound": r.lower_bound, "status": r.status}
        for r in results
    }
    return best


def _better_starts(problem: Problem, start: Start, lb: float, time_limit: float, seed: int,
                   details: dict[str, Any]) -> Start:
    """The start, or a better valid one from the per-rank tuned list greedy (for TUNE_SHARE of the time
    limit) and, on chunked placements under a limit, the periodic schedule (for PERIODIC_SHARE); the
    start unchanged when it meets the bound already."""
    if start[3] <= lb * (1 + OPTIMAL_RTOL):
        return start
    start = tuned_start(problem, start, time.monotonic() + TUNE_SHARE * time_limit, seed, details)
    if start[3] > lb * (1 + OPTIMAL_RTOL) and periodic_applies(problem):
        start = periodic_start(problem, start, time.monotonic() + PERIODIC_SHARE * time_limit, details)
    return start


def _improve_by_lns(problem: Problem, best: Schedule, best_tl: Timeline, best_obj: float, until: float, workers: int,
                    seed: int, resolution: int, details: dict[str, Any]) -> tuple[Schedule, Timeline, float]:
    """The incumbent after the large-neighbourhood search up to `until` (time.monotonic()), if better;
    unchanged when too little time is left for its first check and one window."""
    if until - time.monotonic() < 2 * (lns.MIN_SECONDS + lns.overhead(problem)):
        return best, best_tl, best_obj
    split = split_backward(best)
    known = best_tl if split.ranks == best.ranks else None  # validated already, unless split differs
    found = lns.improve(problem, split, until, timeline=known, workers=workers, seed=seed, resolution=resolution)
    if found is None:
        details["lns"] = "not run: the start is not valid with its backwards split"
        return best, best_tl, best_obj
    schedule, timeline, obj, stats = found
    details.update(stats.as_dict())
    return (schedule, timeline, obj) if obj < best_obj * (1 - 1e-12) else (best, best_tl, best_obj)


@dataclass
class _GridOutcome:
    status: str
    bound: float
    schedule: Schedule | None
    timeline: Timeline | None
    wall: float
    rejected: str | None = None
    build: float = 0.0


def _grid_round(
    problem: Problem, real_bounds: list[RankBound], best: Schedule, best_tl: Timeline, step: float, t0: float,
    time_limit: float, workers: int, seed: float, lb: float, best_obj: float,
    progress: Callable[[Progress], None] | None, trust_bound: bool = True,
) -> _GridOutcome:
    """One CP-SAT solve on the grid of this step, hinted with the incumbent (its overlapped pairs and
    full backwards split into passes); its orders re-timed and validated with the exact times.
    `trust_bound`: whether the model's bound holds for the problem (not when passes may pair)."""
    grid = on_grid(problem, step)
    split = split_backward(best)
    hint = {slot.action: int(round(slot.start)) for slot in simulate(split, grid.profile).iter_slots()}
    if any(a.kind is Kind.OVERLAP for rank in best.ranks for a in rank):
        best_tl = simulate(split, problem.profile)   # the horizon must hold the hint, whose pairs are apart
    # Each rank's first pass is pinned no later than its head (cpsat.add_rank_windows). That holds with
    # one route only: with DualPipe's two, it starts when its input arrives (add_first_start_at_arrival).
    single = len(problem.placement.routes) == 1
    caps = [int(math.floor(b.head / step + 1e-9)) for b in real_bounds] if single else None
    slack = None if single else (0 if grid_is_exact(problem, step) else 1)

    def on_solution(elapsed: float, obj: int, bound: int) -> None:
        if progress:
            shown = max(lb, _real_bound(problem, bound, step)) if trust_bound else lb
            progress(Progress(time.monotonic() - t0, min(best_obj, obj * step), shown, f"cp-sat {step:.3g}"))

    result = solve_grid(grid, hint=hint, horizon=_horizon(problem, real_bounds, best_tl, step),
                        time_limit=time_limit - (time.monotonic() - t0), workers=workers, seed=int(seed),
                        progress=on_solution, first_start_cap=caps, arrival_slack=slack)
    if result.status == "infeasible":
        # The incumbent is feasible, so an infeasible grid model means the horizon or the memory
        # rounding cut it off: say so rather than hide it.
        return _GridOutcome("infeasible", 0.0, None, None, result.wall, "grid model infeasible", result.build)
    bound = _real_bound(problem, result.bound, step)
    if not result.starts:
        return _GridOutcome(result.status, bound, None, None, result.wall, build=result.build)
    candidate = orders_from_starts(grid, result.starts, "zbsearch")
    report = check(candidate, problem.profile, problem.limit)
    if not report.ok:
        return _GridOutcome(result.status, bound, None, None, result.wall, report.problems[0], result.build)
    return _GridOutcome(result.status, bound, candidate, report.timeline, result.wall, build=result.build)


def _real_bound(problem: Problem, grid_bound: int, step: float) -> float:
    """The real-time bound that a grid bound proves (see cpsat.py): the grid is a relaxation, and a
    span can lose one step at a rank's first start unless every time is an exact multiple of the
    step, in which case real schedules map onto the grid exactly."""
    if problem.objective == "makespan" or grid_is_exact(problem, step):
        return step * grid_bound
    return step * (grid_bound - 1)


def exact_step(problem: Problem) -> float | None:
    """The coarsest step on which every pass and hop time is a whole number, with at most
    MAX_RESOLUTION units in the shortest pass; None when there is none."""
    times = _times(problem)
    shortest = min(ps.duration for ps in problem.passes if ps.duration > 0)
    for k in range(1, MAX_RESOLUTION + 1):
        if _whole(times, shortest / k):
            return shortest / k
    return None


def grid_is_exact(problem: Problem, step: float) -> bool:
    return _whole(_times(problem), step)


def _times(problem: Problem) -> set[float]:
    """Every distinct pass and hop time of the problem."""
    return {ps.duration for ps in problem.passes} | {hop for ps in problem.passes for _, hop in ps.inputs}


def _whole(times: set[float], step: float) -> bool:
    return all(abs(t / step - round(t / step)) < 1e-9 for t in times)


def _horizon(problem: Problem, real_bounds: list[RankBound], incumbent: Timeline, step: float) -> int:
    """Latest grid time the model needs. For makespan: the incumbent's. For span: an optimal order
    run as soon as possible starts each rank at its head (its first pass is microbatch 0's forward)
    and ends within the incumbent's span after it; with two routes, see below."""
    if problem.objective == "makespan":
        return int(math.ceil(incumbent.makespan / step)) + 1
    heads = max(b.head for b in real_bounds)
    if len(problem.placement.routes) > 1:
        # A rank need not start at its head; its first pass waits for another rank's pass, which ends
        # within that rank's span of its own first start: a chain over at most p ranks.
        hop = max(problem.profile.comm, default=0.0)
        heads = (problem.num_ranks - 1) * (incumbent.span + hop)
    return int(math.ceil(max(heads + incumbent.span, incumbent.makespan) / step)) + 2
