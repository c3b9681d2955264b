"""The CP-SAT model: place every F, B and W of every microbatch on every rank.

The model is solved on an integer time grid: every duration and hop time is divided by `step` and
rounded DOWN. That makes the grid problem a relaxation of the real one (map a real schedule's times t
to floor(t / step): floor(a) + floor(b) <= floor(a + b), so every precedence and no-overlap still
holds, and memory events that merge onto one grid time only lower the level). Hence step x the grid
optimum is a lower bound on the real makespan, and step x (grid optimum - 1) on the real span (a rank's
first start can lose up to one step). The solution's per-rank orders are then re-timed with the exact
durations by the simulator, which always yields an executable schedule.

Constraint families, each in its own helper: intervals, data dependencies, one pass at a time per
rank, symmetry breaking, activation memory (a reservoir per rank), analytic bounds, each rank's first
start (pinned at its head on one route, at its input's arrival on two), objective. Where a split B
raises what a microbatch holds (mem_W > mem_B, torch's runtime), a backward may run fused (B and W as
one pass that frees mem_B at its end; fusable_chunks), which fits limits no split order fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ortools.sat.python import cp_model

from ..bounds.analytic import RankBound, earliest_starts, hold_times, objective_bound, rank_bounds
from ..budget import BUDGET, Budget
from ..bounds.relaxations import fusion_relaxation
from ...core.ir import Action, Kind
from ...core.stage_cost import StageCost
from ..problem import Pass, Problem
from ...core.objective import Objective

# Memory is scaled to integers with this many units per the smallest mem_B of the problem; the
# rounding error is far below any limit users give (a millionth of one microbatch's activations).
MEMORY_RESOLUTION = 1_000_000


def choose_step(problem: Problem, resolution: int) -> float:
    """The grid step: the shortest positive pass gets between `resolution` and 2 x `resolution` units,
    and among such steps the one that loses the least time to rounding down (summed over every pass
    and hop) wins. A step that divides the pass times nearly exactly keeps the relaxation, and so
    the proven bound, tight; a careless one loses up to a step on every pass of a critical path."""
    positive = [ps.duration for ps in problem.passes if ps.duration > 0]
    hops = [hop for ps in problem.passes for _, hop in ps.inputs if hop > 0]
    counts: dict[float, int] = {}
    for t in positive + hops:
        counts[t] = counts.get(t, 0) + 1
    shortest = min(positive)
    best_step, best_loss = shortest / resolution, math.inf
    for k in range(resolution, 2 * resolution + 1):
        for frac in (0.0, 0.25, 0.5, 0.75):
            step = shortest / (k + frac)
            loss = sum(n * (t - step * math.floor(t / step + 1e-9)) for t, n in counts.items())
            if loss < best_loss - 1e-12:
                best_step, best_loss = step, loss
    return best_step


@dataclass
class Variables:
    start: dict[Action, cp_model.IntVar] = field(default_factory=dict)
    end: dict[Action, cp_model.LinearExpr] = field(default_factory=dict)
    interval: dict[Action, cp_model.IntervalVar] = field(default_factory=dict)
    objective: cp_model.IntVar | None = None
    rank_first: list[cp_model.IntVar] = field(default_factory=list)
    rank_last: list[cp_model.IntVar] = field(default_factory=list)
    held: list[tuple[cp_model.IntVar, Action, Action]] = field(default_factory=list)  # length, from, until
    held_after: list[tuple[cp_model.IntVar, Action, Action]] = field(default_factory=list)  # from B's end to W's
    fused: dict[Action, cp_model.IntVar] = field(default_factory=dict)  # per B that may fuse with its W: whether it does
    horizon: int = 0


def _name(a: Action) -> str:
    return f"{a.kind.label}_c{a.chunk}_mb{a.microbatch}"


def durations(grid: Problem) -> dict[Action, int]:
    return {ps.action: int(ps.duration) for ps in grid.passes}


def add_intervals(model: cp_model.CpModel, grid: Problem, horizon: int) -> Variables:
    """One fixed-size interval per pass, its start no earlier than its inputs could allow."""
    earliest = earliest_starts(grid.passes)
    v = Variables(horizon=horizon)
    for ps in grid.passes:
        a, d = ps.action, int(ps.duration)
        s = model.new_int_var(int(earliest[a]), max(int(earliest[a]), horizon - d), f"start_{_name(a)}")
        v.start[a] = s
        v.end[a] = s + d
        v.interval[a] = model.new_fixed_size_interval_var(s, d, f"run_{_name(a)}")
    return v


def add_dependencies(model: cp_model.CpModel, grid: Problem, v: Variables) -> None:
    """A pass starts after each input has finished and crossed to this rank."""
    for ps in grid.passes:
        for src, hop in ps.inputs:
            model.add(v.start[ps.action] >= v.end[src] + int(hop))


def add_one_pass_at_a_time(model: cp_model.CpModel, grid: Problem, v: Variables,
                           passes: Sequence[Pass] | None = None) -> None:
    """One pass at a time on each rank, over `passes` (all of the problem's unless given: the large-
    neighbourhood search passes the ones it frees)."""
    chosen = grid.passes if passes is None else passes
    for r in range(grid.num_ranks):
        model.add_no_overlap([v.interval[ps.action] for ps in chosen if ps.rank == r])


def add_symmetry_breaking(model: cp_model.CpModel, grid: Problem, v: Variables) -> None:
    """Same-kind passes of one chunk run in microbatch order.

    Valid because microbatches have identical costs: take any schedule and, on every chunk and kind,
    relabel the k-th executed pass as microbatch k. The k-th F on the next chunk starts after its own
    input and those of the k-1 before it, i.e. after k distinct Fs of this chunk, so after the k-th
    earliest one (plus the hop); the same holds for B up the route and for W after B. Memory depends
    only on how many passes of each kind have run, not on their labels, so it is unchanged.
    DualPipe's two routes are two separate families of microbatches, ordered within each route.
    Not the Ws of a chunk whose backward may fuse (fusable_chunks): there a W keeps the label of its own
    B (relabel the Bs as above, and each W as its B), so that a fused B and W share one microbatch;
    split, memory depends on counts only and is unchanged, fused, the pair is the same pair.
    """
    fusable = fusable_chunks(grid)
    add_microbatch_order(model, grid, v, [ps.action for ps in grid.passes
                                          if not (ps.action.kind is Kind.W and ps.action.chunk in fusable)])


def add_microbatch_order(model: cp_model.CpModel, grid: Problem, v: Variables, actions: Sequence[Action]) -> None:
    """Each chunk's `actions` of one kind run in microbatch order (within a route): every one starts after
    the one of the next smaller microbatch among them ends."""
    m, pl = grid.num_microbatches, grid.placement
    groups: dict[tuple[int, Kind, int], list[Action]] = {}
    for a in actions:
        groups.setdefault((a.chunk, a.kind, pl.route_index(a.microbatch, m)), []).append(a)
    for group in groups.values():
        group.sort(key=lambda a: a.microbatch)
        for first, then in zip(group, group[1:]):
            model.add(v.start[then] >= v.end[first])


def fusable_chunks(grid: Problem) -> frozenset[int]:
    """The chunks whose backward the model may fuse: those whose B raises what a microbatch holds
    (mem_W > mem_B, torch's split backward). There a fused backward (B then W at once, freeing mem_B at
    its end: sim.rank_state.memory_delta) holds less than B and W apart, and a limit that no split
    order fits may still be met. Elsewhere fusing never holds less, so the split model loses nothing."""
    return frozenset(c for c, cost in enumerate(grid.chunk_costs) if cost.mem_W > cost.mem_B)


def bound_passes_of(grid: Problem) -> Sequence[Pass]:
    """The passes the model's analytic bounds read: the grid's own, relaxed for fused backwards
    (relaxations.fusion_relaxation) where the model may fuse them, so that the bounds also hold for
    its fused schedules."""
    return fusion_relaxation(grid) if fusable_chunks(grid) else grid.passes


def memory_scale(grid: Problem) -> float:
    return MEMORY_RESOLUTION / min(ps.alloc for ps in grid.passes if ps.alloc > 0)


def add_memory(model: cp_model.CpModel, grid: Problem, v: Variables, headroom: int = 0) -> None:
    """Activations on each rank stay within its limit.

    A microbatch's activations on a chunk are two held blocks: mem_B - mem_W from the start of its F
    to the end of its B, and mem_W from the start of its F to the end of its W. That is the paper's
    memory curve (F allocates at its start, B and W free at their ends), written as a cumulative
    constraint over variable-length intervals. Under the torch-runtime memory model B may leave more
    than F held (a block of mem_W - mem_B from the end of B to the end of W) and the loss chunk keeps
    mem_kept after W (a block to the horizon); see memory_blocks. (A reservoir constraint says the
    same, but CP-SAT's presolve expands it into a Boolean per pair of events: tens of seconds at p=8,
    m=24.)
    `headroom` (scaled units) tightens the limit should integer rounding ever let through a schedule
    that the exact check refuses.
    """
    scale = memory_scale(grid)
    # A block lasts at least the dependency path from its F to the pass that frees it; saying so
    # lets CP-SAT's energy reasoning on the cumulative see what bounds/analytic.py's memory-time bound sees.
    hold = hold_times(grid, grid.passes)
    dur = durations(grid)
    fusable = fusable_chunks(grid)
    consumers = _consumers(grid) if fusable else {}
    for r in range(grid.num_ranks):
        cap = grid.limit.per_rank[r]
        if math.isinf(cap):
            continue
        intervals, demands = [], []
        for ps in grid.passes:
            a = ps.action
            if ps.rank != r or a.kind is not Kind.F:
                continue
            cost = grid.cost_of(a.chunk, a.microbatch)
            # Demands round down and the limit up, so that the grid model stays a relaxation (its bound
            # holds; rounding demands to nearest refused a microbatch that fills the limit exactly).
            for block, demand, start, until in memory_blocks(cost, a, scale):
                if demand <= 0:
                    continue
                if until is None:  # kept until the iteration ends: to the horizon
                    intervals.append(model.new_interval_var(v.end[start], v.horizon - v.end[start], v.horizon,
                                                            f"mem_{_name(a)}_{block}"))
                    demands.append(demand)
                    continue
                shortest = {Kind.B: hold[a.chunk][0], Kind.W: hold[a.chunk][1]}[until.kind] if start == a else dur[until]
                size = model.new_int_var(min(int(shortest), v.horizon), v.horizon, f"held_{_name(a)}_{block}")
                if start == a:
                    v.held.append((size, a, until))
                    intervals.append(model.new_interval_var(v.start[a], size, v.end[until], f"mem_{_name(a)}_{block}"))
                elif a.chunk in fusable:  # from the end of B, unless B and W run as one fused backward
                    fused = _fused_var(model, v, start, until, consumers)
                    v.held_after.append((size, start, until))
                    intervals.append(model.new_optional_interval_var(v.end[start], size, v.end[until], ~fused,
                                                                     f"mem_{_name(a)}_{block}"))
                else:  # from the end of B
                    v.held_after.append((size, start, until))
                    intervals.append(model.new_interval_var(v.end[start], size, v.end[until], f"mem_{_name(a)}_{block}"))
                demands.append(demand)
        model.add_cumulative(intervals, demands, scaled_limit(cap, scale) - headroom)


def _fused_var(model: cp_model.CpModel, v: Variables, b: Action, w: Action,
               consumers: dict[Action, list[tuple[Action, float]]]) -> cp_model.IntVar:
    """Whether B `b` and its W `w` run as one fused backward: W then starts as B ends, and what waits on
    B's gradient (the B of the chunk before on the route) waits for the fused pass's end, W's, as the
    simulator has it. At B + W, the fused pass's time where it costs no less (relaxations.fusion_saves_time;
    where it costs more, the model stays a relaxation)."""
    if b in v.fused:
        return v.fused[b]
    fused = v.fused[b] = model.new_bool_var(f"fused_{_name(b)}")
    model.add(v.start[w] == v.end[b]).only_enforce_if(fused)
    for consumer, hop in consumers.get(b, ()):
        if consumer != w:
            model.add(v.start[consumer] >= v.end[w] + int(hop)).only_enforce_if(fused)
    return fused


def _consumers(grid: Problem) -> dict[Action, list[tuple[Action, float]]]:
    """Per pass, the passes that read its output and the hop to each."""
    out: dict[Action, list[tuple[Action, float]]] = {}
    for ps in grid.passes:
        for src, hop in ps.inputs:
            out.setdefault(src, []).append((ps.action, hop))
    return out


def scaled_limit(cap: float, scale: float) -> int:
    """A rank's limit in the model's memory units, rounded up (demands round down): the grid model
    stays a relaxation."""
    return int(math.ceil(cap * scale * (1 - 1e-12)))


def memory_blocks(cost: StageCost, f: Action, scale: float) -> list[tuple[str, int, Action, Action | None]]:
    """One microbatch's activations on a chunk as held blocks (name, scaled demand, from, until): the
    level is mem_B from F's start to B's end, mem_W from there to W's end and mem_kept after that (the
    loss chunk under torch's runtime). `from` is the F (its start) or the B (its end); `until` None is the
    end of the iteration. Demands round down (see add_memory)."""
    def down(x: float) -> int:
        return math.floor(x * scale * (1 + 1e-12))

    b, w = Action(f.chunk, Kind.B, f.microbatch), Action(f.chunk, Kind.W, f.microbatch)
    low = min(cost.mem_B, cost.mem_W)
    kept = min(cost.mem_kept or 0.0, low)
    return [("until_B", down(cost.mem_B - low), f, b), ("until_W", down(low - kept), f, w),
            ("B_to_W", down(cost.mem_W - low), b, w), ("kept", down(kept), w, None)]


def add_rank_windows(
    model: cp_model.CpModel, grid: Problem, v: Variables, horizon: int, bounds: list[RankBound],
    first_start_cap: list[int] | None = None,
) -> None:
    """Each rank's first start and last end, and the analytic lower bound on the time between them
    (bounds/analytic.py), which CP-SAT does not find by propagation.

    `first_start_cap` pins each rank's first pass no later than where an as-soon-as-possible executor
    starts it. Its first pass is microbatch 0's forward, which nothing on the rank delays, so an ASAP
    run starts it the moment its input arrives; on the grid that moment is floor(real time / step).
    Without this pin the model could shorten a rank's span by starting it late, which no executor
    does; with it, for any fixed order, the best span the model can find is the ASAP run's.
    """
    m, pl = grid.num_microbatches, grid.placement
    fusable = fusable_chunks(grid)
    for r in range(grid.num_ranks):
        mine = [ps.action for ps in grid.passes if ps.rank == r]
        # With passes in microbatch order per chunk, a rank starts with the F of a route's first
        # microbatch and ends with the W of a route's last one (any W of a chunk whose Ws are not
        # ordered: add_symmetry_breaking).
        firsts = [v.start[a] for a in mine if a.kind is Kind.F and (a.microbatch == 0 or pl.route_index(a.microbatch - 1, m) != pl.route_index(a.microbatch, m))]
        lasts = [v.end[a] for a in mine if a.kind is Kind.W and (a.chunk in fusable or a.microbatch == m - 1 or pl.route_index(a.microbatch + 1, m) != pl.route_index(a.microbatch, m))]
        first = model.new_int_var(0, horizon, f"first_start_rank{r}")
        last = model.new_int_var(0, horizon, f"last_end_rank{r}")
        model.add_min_equality(first, firsts)
        model.add_max_equality(last, lasts)
        if first_start_cap is not None:
            model.add(first <= first_start_cap[r])
        model.add(last - first >= int(math.ceil(bounds[r].span - 1e-9)))
        model.add(last >= int(math.ceil(bounds[r].end - 1e-9)))
        v.rank_first.append(first)
        v.rank_last.append(last)


def add_first_start_at_arrival(model: cp_model.CpModel, grid: Problem, v: Variables, slack: int) -> None:
    """With several routes, the pin of add_rank_windows does not hold (a rank may start with the route
    whose input comes later); this says the same in general: some route's first forward on the rank
    starts it, and no later than `slack` steps after its input arrives, as an as-soon-as-possible run
    starts it the moment the input is there. On the grid floor(a + b) may exceed floor(a) + floor(b)
    by one step, so `slack` is 1 unless every time sits on the grid (0)."""
    m, pl = grid.num_microbatches, grid.placement
    for r, first in enumerate(v.rank_first):
        leaders = [ps for ps in grid.passes if ps.rank == r and ps.action.kind is Kind.F
                   and (ps.action.microbatch == 0 or pl.route_index(ps.action.microbatch - 1, m)
                        != pl.route_index(ps.action.microbatch, m))]
        chosen = []
        for ps in leaders:
            b = model.new_bool_var(f"starts_rank{r}_{_name(ps.action)}")
            # A forward has one input at most: the previous chunk's forward (none at the route's start).
            arrival = v.end[ps.inputs[0][0]] + int(ps.inputs[0][1]) if ps.inputs else 0
            model.add(v.start[ps.action] <= arrival + slack).only_enforce_if(b)
            model.add(first == v.start[ps.action]).only_enforce_if(b)
            chosen.append(b)
        model.add_bool_or(chosen)


def add_objective(model: cp_model.CpModel, grid: Problem, v: Variables, horizon: int, bounds: list[RankBound]) -> None:
    lower = int(math.ceil(objective_bound(bounds, grid.objective) - 1e-9))
    obj = model.new_int_var(min(lower, horizon), horizon, grid.objective)
    if grid.objective is Objective.MAKESPAN:
        model.add_max_equality(obj, v.rank_last)
    else:
        for first, last in zip(v.rank_first, v.rank_last):
            model.add(obj >= last - first)
    v.objective = obj
    model.minimize(obj)


def add_hint(model: cp_model.CpModel, grid: Problem, v: Variables, starts: dict[Action, int],
             fused: frozenset[Action] = frozenset()) -> None:
    """Hint every variable, not only the starts: CP-SAT takes a complete hint as a first solution
    at once, while a partial one must be repaired by search and often is not, on large models.
    `fused`: the Bs whose backward the hinted schedule runs fused."""
    dur = durations(grid)
    for a, s in starts.items():
        model.add_hint(v.start[a], s)
    for b, var in v.fused.items():
        model.add_hint(var, b in fused)
    for size, src, until in v.held:
        model.add_hint(size, starts[until] + dur[until] - starts[src])
    for size, src, until in v.held_after:
        model.add_hint(size, starts[until] + dur[until] - starts[src] - dur[src])
    firsts, lasts = [], []
    for r in range(grid.num_ranks):
        mine = [ps.action for ps in grid.passes if ps.rank == r]
        firsts.append(min(starts[a] for a in mine))
        lasts.append(max(starts[a] + dur[a] for a in mine))
        model.add_hint(v.rank_first[r], firsts[r])
        model.add_hint(v.rank_last[r], lasts[r])
    assert v.objective is not None, "add_objective makes the objective before the hints"
    if grid.objective is Objective.MAKESPAN:
        model.add_hint(v.objective, max(lasts))
    else:
        model.add_hint(v.objective, max(l - f for f, l in zip(firsts, lasts)))


def build_model(
    grid: Problem, horizon: int, headroom: int = 0, first_start_cap: list[int] | None = None,
    arrival_slack: int | None = None, budget: Budget = BUDGET,
) -> tuple[cp_model.CpModel, Variables]:
    """The grid model with every constraint family; `budget` caps the rank bounds' walks that bound each
    rank's window and the objective."""
    model = cp_model.CpModel()
    v = add_intervals(model, grid, horizon)
    add_dependencies(model, grid, v)
    add_one_pass_at_a_time(model, grid, v)
    add_symmetry_breaking(model, grid, v)
    add_memory(model, grid, v, headroom)
    bounds = rank_bounds(grid, bound_passes_of(grid), budget=budget)
    add_rank_windows(model, grid, v, horizon, bounds, first_start_cap)
    if arrival_slack is not None:
        add_first_start_at_arrival(model, grid, v, arrival_slack)
    add_objective(model, grid, v, horizon, bounds)
    return model, v
