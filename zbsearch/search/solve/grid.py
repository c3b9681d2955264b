"""CP-SAT on a refining time grid: solve on a coarse grid first and, while CP-SAT proves each grid
optimal and time remains, refine it. Each grid's bound holds for the real problem (the grid is a
relaxation, exact/cpsat.py), and finer grids lose less time to rounding. Every answer is re-timed with
the exact durations and validated before it replaces the incumbent."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from ...core.ir import Action, Kind, Schedule
from ...core.objective import Objective, Status, status_for
from ...sim.simulate import Timeline, simulate
from ...sim.validate import check
from ..bounds.analytic import RankBound
from ..exact.cpsat import choose_step, fusable_chunks
from ..exact.run_model import GiveUp, orders_from_starts, solve_grid
from ..options import SearchOptions
from ..problem import Problem, on_grid
from .incumbent import with_backwards_split
from .pair_phase import PAIR_MAX_PASSES
from .report import GridRound
from .starts import Start

# Finest grid the refinement goes to: the shortest pass in this many units.
MAX_RESOLUTION = 320
# Models up to this many passes start on the exact grid when there is one (see refine).
EXACT_FIRST_MAX_PASSES = 600


@dataclass(frozen=True)
class GridSearch:
    """What every grid round shares: the problem, its exact rank bounds, when the solve started and must
    stop (`deadline` seconds after `t0`), the solve's options (CP-SAT's workers and seed, the first
    grid's resolution, the budget, who hears of progress), and whether CP-SAT's bound holds for the
    problem (not where passes may pair or fuse)."""

    problem: Problem
    real_bounds: list[RankBound]
    t0: float
    deadline: float
    options: SearchOptions
    trust_bound: bool

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.t0)


@dataclass(frozen=True)
class GridRun:
    """The incumbent after the rounds, the bound they proved, the rounds, and CP-SAT's last status (or
    why it did not run)."""

    best: Start
    bound: float
    rounds: tuple[GridRound, ...]
    cpsat_status: str

    @property
    def gave_up(self) -> bool:
        """Whether the last round gave its time up to the large-neighbourhood search."""
        return bool(self.rounds) and self.rounds[-1].gave_up


@dataclass(frozen=True)
class _Outcome:
    status: Status
    bound: float
    schedule: Schedule | None
    timeline: Timeline | None
    wall: float
    rejected: str | None = None
    build: float = 0.0
    gave_up: bool = False


def refine(search: GridSearch, best: Start, lb: float) -> GridRun:
    """Grid rounds from the options' resolution (units in the shortest pass), doubling while each is
    proven optimal, until the incumbent meets the bound or the time is spent."""
    problem = search.problem
    rounds: list[GridRound] = []
    status = "not run"
    res = search.options.resolution
    if status_for(best.objective, lb) is Status.OPTIMAL:
        return GridRun(best, lb, (), status)
    # A small model whose times all sit on a common grid goes straight to that grid: only there can
    # a span be proven optimal (a coarser grid's bound loses a step), and the coarse rounds before it
    # cost small models more than they save.
    exact = exact_step(problem) if len(problem.passes) <= EXACT_FIRST_MAX_PASSES else None
    while status_for(best.objective, lb) is Status.FEASIBLE and search.left() > 0.5:
        if search.left() < len(problem.passes) * search.options.budget.cpsat_seconds_per_pass:
            status = "skipped: too little time left for a model of this size"
            break
        step = exact if exact is not None else choose_step(problem, res)
        outcome = _round(search, best, step, lb)
        rounds.append(GridRound(step, outcome.status, round(outcome.wall, 2), outcome.rejected, outcome.gave_up))
        if search.trust_bound:
            lb = max(lb, outcome.bound)
        if outcome.timeline is not None and outcome.schedule is not None:
            obj = problem.objective.of(outcome.timeline)
            if obj < best.objective * (1 - 1e-12):
                best = Start(best.name, outcome.schedule, outcome.timeline, obj)
        if outcome.status is not Status.OPTIMAL or exact is not None or grid_is_exact(problem, step) \
                or res >= MAX_RESOLUTION:
            break
        # A finer grid costs at least another model build, and CP-SAT overruns its limit by about
        # that much on large models: only refine when the time left is well above it.
        if search.left() < 3 * outcome.build + 1.0:
            break
        res *= 2
    return GridRun(best, lb, tuple(rounds), rounds[-1].cpsat_status if rounds else status)


def _round(search: GridSearch, best: Start, step: float, lb: float) -> _Outcome:
    """One CP-SAT solve on the grid of this step, hinted with the incumbent (its overlapped pairs and
    full backwards split into passes); its orders re-timed and validated with the exact times."""
    problem = search.problem
    grid = on_grid(problem, step)
    hint, hint_fused = _hint(best.schedule, grid)
    best_tl = best.timeline
    if any(a.kind is Kind.OVERLAP for rank in best.schedule.ranks for a in rank):
        # the horizon must hold the hint, whose pairs are apart
        best_tl = simulate(with_backwards_split(best.schedule), problem.profile)
    # Each rank's first pass is pinned no later than its head (cpsat.add_rank_windows). That holds with
    # one route only: with DualPipe's two, it starts when its input arrives (add_first_start_at_arrival).
    single = len(problem.placement.routes) == 1
    caps = [int(math.floor(b.head / step + 1e-9)) for b in search.real_bounds] if single else None
    slack = None if single else (0 if grid_is_exact(problem, step) else 1)

    def on_solution(elapsed: float, obj: int, bound: int) -> None:
        shown = max(lb, real_bound(problem, bound, step)) if search.trust_bound else lb
        search.options.tell(time.monotonic() - search.t0, min(best.objective, obj * step), shown, f"cp-sat {step:.3g}")

    result = solve_grid(grid, hint=hint, horizon=horizon(problem, search.real_bounds, best_tl, step),
                        time_limit=search.left(), workers=search.options.workers, seed=int(search.options.seed),
                        progress=on_solution, first_start_cap=caps, arrival_slack=slack, hint_fused=hint_fused,
                        budget=search.options.budget, give_up=_give_up(search, step, lb))
    if result.status is Status.INFEASIBLE:
        # The incumbent is feasible, so an infeasible grid model means the horizon or the memory
        # rounding cut it off (or a full backward the model cannot fuse, one that does not hold
        # less than its B and W apart): say so rather than hide it.
        return _Outcome(Status.INFEASIBLE, 0.0, None, None, result.wall, "grid model infeasible", result.build)
    bound = real_bound(problem, result.bound, step)
    if not result.starts:
        return _Outcome(result.status, bound, None, None, result.wall, build=result.build, gave_up=result.gave_up)
    candidate = orders_from_starts(grid, result.starts, "zbsearch", result.fused)
    report = check(candidate, problem.profile, problem.limit)
    if not report.ok:
        return _Outcome(result.status, bound, None, None, result.wall, report.problems[0], result.build,
                        gave_up=result.gave_up)
    return _Outcome(result.status, bound, candidate, report.timeline, result.wall, build=result.build,
                    gave_up=result.gave_up)


def _give_up(search: GridSearch, step: float, lb: float) -> GiveUp | None:
    """Where the round may stop early for the large-neighbourhood search: on a chunked placement (ranks holding
    several chunks) under a memory limit, a model too large for CP-SAT to prove in the default time, once it
    has had a share of the time left without proving more than `lb`: the budget's `grid_give_up_share` up to
    EXACT_FIRST_MAX_PASSES, `coarse_give_up_share` above (where the model starts on a grid coarser than exact).
    Measured at 30 s on results/capped_optimum.md's V rows: at p=4, m=12 (288 passes) the full model took
    family B's start 5-8% down in 19 s, the windows 11-14% in the same time (family A: the optimum, where the
    full model stopped 1.8-2.4% above it); at 108-192 passes the full model proved optima or found them late,
    its bound rising only at the end, so there it keeps all of it. On a coarse grid the model's passes are
    rounded down, and its orders lose about a step per pass when re-timed exactly; the windows, accepting only
    what the exact times improve, recover it: on issue 39's example (p=8, m=32, V, 1,536 passes; 60 s from its
    periodic start, four runs against three) half the time on the grid, then the windows, ended 0.8% lower on
    average than the grid alone. On linear placements the full model keeps its time: on three of solve_bench's
    hetero-random rows (p=8, 456-600 passes) the give-up widened the gaps from 0.63/0.38/1.28% to
    0.81/0.46/1.95%, and on the example's linear split half and half was no better than the grid alone."""
    problem, placement = search.problem, search.problem.placement
    passes = len(problem.passes)
    if passes <= PAIR_MAX_PASSES or placement.num_chunks <= placement.num_ranks or problem.limit.unlimited:
        return None
    budget = search.options.budget
    share = budget.grid_give_up_share if passes <= EXACT_FIRST_MAX_PASSES else budget.coarse_give_up_share
    return GiveUp(share * search.left(), int(math.ceil(lb / step - 1e-9)))


def _hint(schedule: Schedule, grid: Problem) -> tuple[dict[Action, int], frozenset[Action]]:
    """The incumbent's start times on the grid, each overlapped pair and full backward split into its
    passes, but a full backward kept whole where the model may fuse it (cpsat.fusable_chunks: its split B
    would raise memory): timed as one pass, its B starts with it and its W as its B ends. Also those
    backwards' Bs (the model's fused ones)."""
    timed = with_backwards_split(schedule, keep_whole=fusable_chunks(grid))
    hint: dict[Action, int] = {}
    fused = set()
    for slot in simulate(timed, grid.profile).iter_slots():
        a = slot.action
        if a.kind is Kind.FULL_B:
            b = Action(a.chunk, Kind.B, a.microbatch)
            fused.add(b)
            hint[b] = int(round(slot.start))
            hint[Action(a.chunk, Kind.W, a.microbatch)] = hint[b] + int(grid.chunk_costs[a.chunk].B)
        else:
            hint[a] = int(round(slot.start))
    return hint, frozenset(fused)


def real_bound(problem: Problem, grid_bound: int, step: float) -> float:
    """The real-time bound that a grid bound proves (see exact/cpsat.py): the grid is a relaxation, and a
    span can lose one step at a rank's first start unless every time is an exact multiple of the
    step, in which case real schedules map onto the grid exactly."""
    if problem.objective is Objective.MAKESPAN or grid_is_exact(problem, step):
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


def horizon(problem: Problem, real_bounds: list[RankBound], incumbent: Timeline, step: float) -> int:
    """Latest grid time the model needs. For makespan: the incumbent's. For span: an optimal order
    run as soon as possible starts each rank at its head (its first pass is microbatch 0's forward)
    and ends within the incumbent's span after it; with two routes, see below."""
    if problem.objective is Objective.MAKESPAN:
        return int(math.ceil(incumbent.makespan / step)) + 1
    heads = max(b.head for b in real_bounds)
    if len(problem.placement.routes) > 1:
        # A rank need not start at its head; its first pass waits for another rank's pass, which ends
        # within that rank's span of its own first start: a chain over at most p ranks.
        hop = max(problem.profile.comm, default=0.0)
        heads = (problem.num_ranks - 1) * (incumbent.span + hop)
    return int(math.ceil(max(heads + incumbent.span, incumbent.makespan) / step)) + 2
