"""zbsearch's search: heuristics for a strong start, CP-SAT to improve it, bounds to say how good it is.

solve() never returns anything worse than the best valid heuristic, and everything it returns has
passed the validator with the exact profile times and the exact memory limit. Its phases, and the share
of the time limit each may take, are in search/budget.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ...core.errors import InfeasibleError
from ...core.objective import Status, status_for
from ..bounds.analytic import RankBound, objective_bound, rank_bounds
from ..bounds.relaxations import bound_passes, fusion_saves, fusion_saves_time
from ..exact import lns
from ..exact.cpsat import fusable_chunks
from ..options import Progress, SearchOptions
from ..problem import Problem
from .grid import GridSearch, refine
from .incumbent import fuse_if_faster, with_backwards_split
from .pair_phase import pair_bound
from .report import PlacementOutcome, SolveDetails, SolveResult
from .starts import Start, Starts, better_starts, heuristic_start

__all__ = ["Progress", "SearchOptions", "SolveResult", "solve", "solve_placements"]


@dataclass(frozen=True)
class ProblemBounds:
    """The exact passes' rank bounds (what CP-SAT's windows read), the proven lower bound, and why
    CP-SAT's own bound cannot be trusted here, where it cannot: what solve() takes before CP-SAT, and what a
    caller that takes it first (to tell whether solving could beat a plan in hand) hands to solve()."""

    real: list[RankBound]
    lower: float
    distrust: str | None
    fusing: bool


def problem_bounds(problem: Problem, options: SearchOptions) -> ProblemBounds:
    """Where the profile gives an F&B pair time, a pass in a pair takes less than its own time; where a
    fused backward costs less than B and W apart (an action overhead, a measured full backward), a fused
    one beats the split pair. The proven bound is then the passes' at their shortest
    (relaxations.bound_passes), and CP-SAT's (its model has no pairs and fuses a backward only at the
    time of B and W apart) is unused. Where a fused backward only holds less, the analytic bound reads the
    relaxed passes too, and CP-SAT's holds (its model may fuse those backwards)."""
    budget = options.budget
    real = rank_bounds(problem, problem.passes, deadline=options.until(budget.nest_share), budget=budget)
    pairs, fusing = problem.profile.gives_overlap, fusion_saves(problem.chunk_costs)
    distrust = None
    if pairs:
        distrust = "not used: the profile gives an F&B overlap time and the CP-SAT model has no pairs"
    elif fusion_saves_time(problem.chunk_costs):
        distrust = ("not used: a fused backward costs less than B and W apart here and the CP-SAT model "
                    "splits every backward")
    # A fused backward that only holds less (mem_W > mem_B, or the loss chunk's mem_kept) is in CP-SAT's
    # model (cpsat.fusable_chunks; its grid drops mem_kept, which only lightens it), so its bound holds;
    # the analytic one must still read the relaxed passes, which hold for fused schedules too.
    relaxed = real if not (pairs or fusing) else rank_bounds(
        problem, bound_passes(problem), deadline=options.until(budget.nest_share), budget=budget)
    return ProblemBounds(real, objective_bound(relaxed, problem.objective), distrust, fusing)


def go_on(result: SolveResult, options: SearchOptions, bounds: ProblemBounds | None = None) -> SolveResult:
    """`result` solved further for the options' time, from its own plan: the answer if better, as one record
    (its start and first grid rounds, the bounds of both, the seconds of both); else `result`. `bounds`: its
    problem's, where the caller has them (solve's)."""
    first = Start(result.start_heuristic, result.schedule, result.timeline, result.objective)
    again = solve(result.problem, options, Starts(first, result.details.tuned_start, result.details.periodic_start),
                  bounds)
    seconds = result.solve_seconds + again.solve_seconds
    lower = min(max(result.lower_bound, again.lower_bound), again.objective, result.objective)
    if again.objective >= result.objective * (1 - 1e-12):
        return replace(result, lower_bound=lower, status=status_for(result.objective, lower), solve_seconds=seconds)
    details = replace(again.details, grid_rounds=result.details.grid_rounds + again.details.grid_rounds)
    return replace(again, lower_bound=lower, status=status_for(again.objective, lower), solve_seconds=seconds,
                   heuristic_objective=result.heuristic_objective, details=details)


def _better_starts(problem: Problem, start: Start, lb: float, options: SearchOptions) -> Starts:
    """starts.better_starts with the budget's tune and periodic shares of the time limit."""
    budget = options.budget
    return better_starts(problem, start, lb, budget.tune_share * options.time_limit,
                         budget.periodic_share * options.time_limit, options.seed)


def solve(problem: Problem, options: SearchOptions = SearchOptions(), starts: Starts | None = None,
          bounds: ProblemBounds | None = None, first: Start | None = None) -> SolveResult:
    """Find the best schedule for `problem` within the options' time limit, spent as their budget says.
    `starts`: the heuristic start already improved by starts.better_starts (the partition search's named
    splits), in place of those phases; the answer is never worse than its start. `bounds`: problem_bounds(problem,
    options), where the caller took them already. `first`: the heuristic start, where the caller found it
    already (the partition search's scored splits): the better starts go on from it, and so the answer is
    never worse than it, where the heuristics run again in a short limit may try fewer variants.
    Raises InfeasibleError (stating the smallest feasible limit) when the memory limit cannot be met."""
    t0 = time.monotonic()
    problem.check_feasible()
    if starts is not None:
        first = starts.start
    elif first is None:
        first = heuristic_start(problem, options.until(options.budget.start_share))
    bounds = problem_bounds(problem, options) if bounds is None else bounds
    starts = _better_starts(problem, first, bounds.lower, options) if starts is None else starts
    start = starts.start
    options.tell(time.monotonic() - t0, start.objective, bounds.lower, "heuristics")
    end = options.time_limit * (1 - options.budget.reserve) - 0.5  # after t0: re-timing and validation follow
    pairs = pair_bound(problem, start.objective, bounds.lower, options, t0 + end)
    lower = max(bounds.lower, pairs.value if pairs is not None else 0.0)
    if pairs is not None:
        options.tell(time.monotonic() - t0, start.objective, lower, "pair bound")
    search = GridSearch(problem, bounds.real, t0, end, options, trust_bound=bounds.distrust is None)
    run = refine(search, start, lower)
    best, lb = run.best, run.bound
    lns_stats, lns_not_run = None, None
    # Where the full model was skipped or stalled on the start, the time left goes to re-solving windows
    # of it (exact/lns.py). Not after a grid proven optimal: windows on a grid could only win back rounding.
    # So too where the grid gave up its time (its bound had not risen: grid.py's _give_up).
    stalled = best is start and (not run.rounds or run.rounds[-1].cpsat_status is not Status.OPTIMAL)
    if (stalled or run.gave_up) and status_for(best.objective, lb) is Status.FEASIBLE:
        best, lns_stats, lns_not_run = _improve_by_lns(problem, best, t0 + search.deadline, options)
        if lns_stats is not None and lns_stats.windows:
            options.tell(time.monotonic() - t0, best.objective, lb, "lns")
    fused = None
    if bounds.fusing:
        best, fused = fuse_if_faster(problem, best)
    details = SolveDetails(run.cpsat_status, bounds.distrust, starts.tuned, starts.periodic, run.rounds, lns_stats,
                           lns_not_run, fused, pair_bound=pairs)
    improved = best.schedule is not start.schedule
    meta = dict(best.schedule.meta, solver="zbsearch", start_heuristic=start.name, objective=problem.objective)
    # The plan record is the problem's, with the choice the answer was timed with (exact/lns.py may choose).
    plan = problem.plan.with_choice(best.schedule.plan.recompute_microbatches)
    schedule = replace(best.schedule, name="zbsearch" if improved else start.name, meta=meta, plan=plan)
    # The timeline names the schedule it times: summaries print that name, so it must be the answer's.
    timeline = replace(best.timeline, schedule=schedule)
    return SolveResult(problem, schedule, timeline, best.objective, min(lb, best.objective),
                       status_for(best.objective, lb), time.monotonic() - t0, start.name, start.objective, details)


def solve_placements(problems: list[Problem], options: SearchOptions = SearchOptions()) -> SolveResult:
    """Solve the same pipeline under several placements and return the best schedule.

    Each placement gets an equal share of the time still left when its turn comes, so time a
    placement does not need (it proved its optimum) goes to the next. The lower bound is the smallest
    of the placements' bounds: the best schedule over all of them is no better than that.
    """
    t0 = time.monotonic()
    results: list[SolveResult] = []
    refused: list[InfeasibleError] = []
    for k, problem in enumerate(problems):
        share = (options.time_limit - (time.monotonic() - t0)) / (len(problems) - k)
        try:
            results.append(solve(problem, options.with_time(share)))
        except InfeasibleError as exc:
            refused.append(exc)
    if not results:
        raise refused[0]
    best = min(results, key=lambda r: (r.objective, max(r.timeline.peak_memory(q) for q in range(r.problem.num_ranks))))
    lower = min(r.lower_bound for r in results)
    outcomes = {r.problem.placement.name: PlacementOutcome(r.objective, r.lower_bound, r.status) for r in results}
    return replace(best, lower_bound=lower, status=status_for(best.objective, lower),
                   solve_seconds=time.monotonic() - t0, details=replace(best.details, placements=outcomes))


def _improve_by_lns(problem: Problem, best: Start, until: float,
                    options: SearchOptions) -> tuple[Start, lns.LnsStats | None, str | None]:
    """The incumbent after the large-neighbourhood search up to `until` (time.monotonic()), if better,
    with the search's counts, or why it did not run; unchanged (and no counts) when too little time is
    left for its first check and one window."""
    if until - time.monotonic() < 2 * (lns.MIN_SECONDS + lns.overhead(problem)):
        return best, None, None
    split = with_backwards_split(best.schedule, keep_whole=fusable_chunks(problem))
    known = best.timeline if split.ranks == best.schedule.ranks else None  # validated already, unless split differs
    found = lns.improve(problem, split, until, timeline=known, workers=options.workers, seed=options.seed,
                        resolution=options.resolution)
    if found is None:
        return best, None, "not run: the start is not valid with its backwards split"
    if found.objective < best.objective * (1 - 1e-12):
        return Start(best.name, found.schedule, found.timeline, found.objective), found.stats, None
    return best, found.stats, None
