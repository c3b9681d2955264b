"""Large-neighbourhood search: re-solve one time window of the incumbent with CP-SAT, the rest fixed.

On large models the full CP-SAT model is too big to build in the time left, or it stalls on the
heuristic start. Here each step frees the passes whose incumbent start lies in one time window, on
every rank, and keeps everything else: the passes before the window stay at their incumbent grid
times (constants), and the passes after it keep their per-rank order behind the window. A pass never
waits on one that starts later, so the window's passes only wait on earlier ones; and memory on a rank
depends on the order of its own passes only, so reordering inside the window leaves the level after it
as it was. The window model therefore needs no-overlap and memory on the window's passes alone, with
the earlier passes as constants (their end times, and the blocks they hold into the window).

Its objective assumes the rest of each rank moves rigidly with the end of its window: the incumbent's
span (or makespan) minus what the window saves on the rank. That is exact for the last window and a
proxy elsewhere; the spliced orders are re-timed with the exact times by the simulator and validated,
and kept only when the real objective improves (or stays and the ranks' summed spans shrink, which lets
savings in the middle travel to the end over later steps).

Where a split B raises what a microbatch holds (torch's runtime: cpsat.fusable_chunks), the incumbent's
full backwards stay whole, and in the window each such backward may run fused or split, as in the full
model. With `choose`, the window also chooses which of its microbatches recompute (exact/recompute_flags.py).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace

from ortools.sat.python import cp_model

from ...core.ir import Action, Kind, Schedule
from ...core.objective import Objective
from ...core.plan_record import Choice
from ...sim.simulate import Timeline, simulate
from ...sim.validate import check
from ..problem import Pass, Problem, on_grid
from .cpsat import (Variables, add_microbatch_order, add_one_pass_at_a_time, choose_step, durations, fusable_chunks,
                    memory_scale, scaled_limit)
from . import recompute_flags
from .lns_report import LnsResult, LnsStats
from .run_model import orders_from_starts

# Passes a window frees, about; fewer on short time limits (see _window_size).
WINDOW_PASSES = 600
# Seconds CP-SAT gets per window, at most; the window model is small, and many short tries beat few
# long ones when the deadline is near.
WINDOW_SECONDS = 4.0
# Below this many seconds left, another window is not started.
MIN_SECONDS = 1.0
# Besides CP-SAT, a window costs a re-timing and a full validation of the whole schedule: about 3.6e-5 s
# per pass at p=64, m=512 (98,304 passes) on this 2-core machine when it was not shared; kept back at
# about three times that, so that the last window ends before the deadline on a busy machine too.
SECONDS_PER_PASS = 1e-4


def overhead(problem: Problem) -> float:
    """Seconds a window takes besides its CP-SAT search (see SECONDS_PER_PASS)."""
    return len(problem.passes) * SECONDS_PER_PASS


@dataclass(frozen=True)
class Window:
    """Per rank: how many passes of its order come before the window, and how many are in it."""

    before: tuple[int, ...]
    inside: tuple[int, ...]


def spans_sum(timeline: Timeline) -> float:
    return sum(timeline.span_of(r) for r in range(timeline.num_ranks))


def window_at(grid_tl: Timeline, t0: float, t1: float) -> Window:
    """The passes whose (grid) start lies in [t0, t1): a contiguous stretch of each rank's order,
    since an as-soon-as-possible run starts a rank's passes in order."""
    before, inside = [], []
    for slots in grid_tl.slots:
        before.append(sum(1 for s in slots if s.start < t0))
        inside.append(sum(1 for s in slots if t0 <= s.start < t1))
    return Window(tuple(before), tuple(inside))


def _split(action: Action, start: float, dur: dict[Action, int]) -> list[tuple[Action, int]]:
    """A slot's passes with their grid starts: a full backward (kept whole where the model may fuse it) is
    its B, then its W as the B ends."""
    s = int(round(start))
    if action.kind is not Kind.FULL_B:
        return [(action, s)]
    b = Action(action.chunk, Kind.B, action.microbatch)
    return [(b, s), (Action(action.chunk, Kind.W, action.microbatch), s + dur[b])]


def _inside(grid_tl: Timeline, window: Window, r: int, dur: dict[Action, int]) -> list[Action]:
    slots = grid_tl.slots[r][window.before[r]:window.before[r] + window.inside[r]]
    return [a for s in slots for a, _ in _split(s.action, s.start, dur)]


def _ranges(window: Window, slots: tuple, dur: dict[Action, int]
            ) -> tuple[dict[Action, int], dict[Action, int], list[list[Action]], frozenset[Action]]:
    """Fixed starts of the passes before the window, incumbent starts of those inside (the hint), each
    rank's passes after it, and the Bs the incumbent runs fused with their W."""
    fixed, hint, after, fused = dict[Action, int](), dict[Action, int](), list[list[Action]](), set[Action]()
    for r, rank_slots in enumerate(slots):
        b, n = window.before[r], window.inside[r]
        fixed.update(p for s in rank_slots[:b] for p in _split(s.action, s.start, dur))
        hint.update(p for s in rank_slots[b:b + n] for p in _split(s.action, s.start, dur))
        after.append([a for s in rank_slots[b + n:] for a, _ in _split(s.action, s.start, dur)])
        fused.update(Action(s.action.chunk, Kind.B, s.action.microbatch) for s in rank_slots
                     if s.action.kind is Kind.FULL_B)
    return fixed, hint, after, frozenset(fused)


@dataclass
class _WindowModel:
    model: cp_model.CpModel
    v: Variables
    rank_end: list[cp_model.IntVar]
    hint: dict[Action, int]
    fixed: dict[Action, int]
    after: list[list[Action]]
    flags: recompute_flags.Flags
    fused: frozenset[Action]  # the Bs run fused with their W outside the window (fixed, or after it)
    hinted_fused: frozenset[Action]  # the window's Bs the incumbent runs fused


def _add_window_passes(model: cp_model.CpModel, grid: Problem, inside: list[Pass], fixed: dict[Action, int],
                       free_at: list[int], horizon: int, flags: recompute_flags.Flags, fused: frozenset[Action]) -> Variables:
    """An interval per freed pass, never before its rank is free of the fixed passes nor before its fixed
    inputs have arrived (a fused B's output as its W ends); inputs inside the window are precedences. A B
    or W whose microbatch's recompute is chosen here (`flags`) runs as long as the choice says."""
    dur = durations(grid)
    v = Variables(horizon=horizon)

    def ready(src: Action) -> int:
        done = Action(src.chunk, Kind.W, src.microbatch) if src in fused else src
        return fixed[done] + dur[done]

    for ps in inside:
        a = ps.action
        lo = max([free_at[ps.rank]] + [ready(src) + int(hop) for src, hop in ps.inputs if src in fixed])
        s = model.new_int_var(lo, max(lo, horizon - dur[a]), f"start_{a}")
        v.start[a] = s
        flag = flags.get((a.chunk, a.microbatch)) if a.kind is not Kind.F else None
        if flag is None:
            v.end[a] = s + dur[a]
            v.interval[a] = model.new_fixed_size_interval_var(s, dur[a], f"run_{a}")
        else:
            v.end[a], v.interval[a] = recompute_flags.add_chosen_interval(model, grid, a, s, flag, horizon)
    for ps in inside:
        for src, hop in ps.inputs:
            if src in v.start:
                model.add(v.start[ps.action] >= v.end[src] + int(hop))
    return v


def _add_window_fusion(model: cp_model.CpModel, grid: Problem, inside: list[Pass], v: Variables) -> None:
    """Where a split B raises what a microbatch holds (cpsat.fusable_chunks), a B and its W both in the
    window may run fused: W then starts as B ends, and what waits on B's gradient waits for W's end (as
    the simulator has it); the block held from B's end to W's is then absent (_add_window_memory)."""
    fusable = fusable_chunks(grid)
    for ps in inside:
        b = ps.action
        w = Action(b.chunk, Kind.W, b.microbatch)
        if b.kind is Kind.B and b.chunk in fusable and w in v.start:
            v.fused[b] = model.new_bool_var(f"fused_{b}")
            model.add(v.start[w] == v.end[b]).only_enforce_if(v.fused[b])
    for ps in inside:
        for src, hop in ps.inputs:
            if src in v.fused and ps.action.kind is not Kind.W:
                w = Action(src.chunk, Kind.W, src.microbatch)
                model.add(v.start[ps.action] >= v.end[w] + int(hop)).only_enforce_if(v.fused[src])


def _add_window_memory(model: cp_model.CpModel, grid: Problem, v: Variables, fixed: dict[Action, int],
                       flags: recompute_flags.Flags) -> None:
    """Each rank's limit over the window: blocks a fixed pass opened and a freed pass closes start at
    their fixed time, blocks the window opens and a later pass closes last to the horizon, and blocks
    held across the whole window (opened before it, closed after) come off the limit. A microbatch whose
    recompute is chosen here opens blocks as large as the choice says (recompute_flags.chosen_blocks)."""
    scale, dur = memory_scale(grid), durations(grid)

    def when(a: Action, at_end: bool) -> int | cp_model.LinearExpr | None:
        if a in v.start:
            return v.end[a] if at_end else v.start[a]
        return fixed[a] + (dur[a] if at_end else 0) if a in fixed else None

    forwards: list[list[Pass]] = [[] for _ in range(grid.num_ranks)]
    for ps in grid.passes:
        if ps.action.kind is Kind.F and (ps.action in v.start or ps.action in fixed):
            forwards[ps.rank].append(ps)
    for r in range(grid.num_ranks):
        cap = grid.limit.per_rank[r]
        if math.isinf(cap):
            continue
        intervals, demands, held = [], [], 0
        for ps in forwards[r]:
            f = ps.action
            for block, demand, src, until in recompute_flags.chosen_blocks(grid, f, scale, flags.get((f.chunk, f.microbatch))):
                opened, closed = when(src, src != f), None if until is None else when(until, True)
                if opened is None or (src not in v.start and until is not None and until in fixed):
                    continue  # never opened before the window ends, or closed before it starts
                if src not in v.start and (until is None or until not in v.start):
                    held += demand  # type: ignore[assignment]  # int or, with a flag, an expression; opened before the window, closed after it
                    continue
                end = closed if closed is not None and until in v.start else v.horizon
                size = model.new_int_var(0, v.horizon, f"held_{f}_{block}")
                if src in v.fused:  # from B's end to W's: held only where the two run apart
                    intervals.append(model.new_optional_interval_var(opened, size, end, ~v.fused[src],
                                                                     f"mem_{f}_{block}"))
                else:
                    intervals.append(model.new_interval_var(opened, size, end, f"mem_{f}_{block}"))
                demands.append(demand)
        if intervals:
            model.add_cumulative(intervals, demands, scaled_limit(cap, scale) - held)


def build_window_model(grid: Problem, grid_tl: Timeline, window: Window, objective: str,
                       choose: bool = False) -> _WindowModel:
    """The window's CP-SAT model (see the module's docstring), with the incumbent as a complete hint.
    With `choose`, the model also chooses which of the window's microbatches recompute (exact/recompute_flags.py)."""
    dur = durations(grid)
    fixed, hint, after, fused = _ranges(window, grid_tl.slots, dur)
    by_action = {ps.action: ps for ps in grid.passes}
    inside = [by_action[a] for a in hint]
    free_at = [max([fixed[a] + dur[a] for s in grid_tl.slots[r][:window.before[r]]
                    for a, _ in _split(s.action, s.start, dur)], default=0) for r in range(grid.num_ranks)]
    spread = max(hint.values(), default=0) - min(hint.values(), default=0)
    model = cp_model.CpModel()
    flags = recompute_flags.add_flags(model, grid, hint) if choose else {}
    extra = len(flags) * recompute_flags.most_extra(grid)  # each chosen recompute may lengthen the rank by so much
    horizon = int(math.ceil(grid_tl.makespan)) + spread + max(dur.values()) + extra + 1
    v = _add_window_passes(model, grid, inside, fixed, free_at, horizon, flags, fused)
    # F and B in microbatch order as in the incumbent (torch needs the last stage's F so: torch_compatible;
    # elsewhere it is add_symmetry_breaking's order, free where costs are equal). W stays free.
    add_microbatch_order(model, grid, v, [ps.action for ps in inside if ps.action.kind in (Kind.F, Kind.B)])
    _add_window_fusion(model, grid, inside, v)
    add_one_pass_at_a_time(model, grid, v, inside)
    _add_window_memory(model, grid, v, fixed, flags)
    rank_end = _add_rigid_objective(model, grid, grid_tl, window, v, objective, free_at)
    # A complete hint (ends and the objective follow from the starts) is taken as a first solution at once.
    for a, s in hint.items():
        model.add_hint(v.start[a], s)
        if a.kind is not Kind.F and (a.chunk, a.microbatch) in flags:
            model.add_hint(v.end[a], s + dur[a])  # type: ignore[call-overload]  # a chosen pass's end is an IntVar
    recompute_flags.hint_flags(model, grid, flags)
    for b, var in v.fused.items():
        model.add_hint(var, b in fused)
    for r, end in enumerate(rank_end):
        model.add_hint(end, max([hint[a] + dur[a] for a in _inside(grid_tl, window, r, dur)], default=free_at[r]))
    return _WindowModel(model, v, rank_end, hint, fixed, after, flags,
                        frozenset(b for b in fused if b not in v.start), frozenset(b for b in fused if b in v.fused))


def _add_rigid_objective(model: cp_model.CpModel, grid: Problem, grid_tl: Timeline, window: Window, v: Variables,
                         objective: str, free_at: list[int]) -> list[cp_model.IntVar]:
    """Minimize the largest span (or end) when the rest of each rank moves with its window's end, then
    the sum of the ranks' window ends (scaled below one unit of the first)."""
    rank_end, dur = [], durations(grid)
    top = model.new_int_var(0, 10 * v.horizon, "objective")
    for r, slots in enumerate(grid_tl.slots):
        mine = _inside(grid_tl, window, r, dur)
        end = model.new_int_var(free_at[r], v.horizon, f"window_end_{r}")
        if mine:
            model.add_max_equality(end, [v.end[a] for a in mine])
        else:
            model.add(end == free_at[r])
        old = max((int(round(s.end)) for s in slots[window.before[r]:window.before[r] + window.inside[r]]),
                  default=free_at[r])
        first = 0 if Objective.parse(objective) is Objective.MAKESPAN or not slots else int(round(slots[0].start))
        rest = int(round(slots[-1].end)) - old if slots else 0
        model.add(top >= end + rest - first)
        rank_end.append(end)
    model.minimize(top * (len(rank_end) * 2 * v.horizon + 1) + sum(rank_end))
    return rank_end


def splice(grid: Problem, wm: _WindowModel, starts: dict[Action, int], name: str,
           fused: frozenset[Action] = frozenset()) -> Schedule:
    """Each rank's fixed passes, then its window in the solved order, then the rest in its old order;
    `fused`: the window's Bs solved fused with their W (those outside it stay as they ran)."""
    shift = wm.v.horizon + 1
    every = dict(wm.fixed)
    every.update(starts)
    for rank in wm.after:
        every.update((a, shift + k) for k, a in enumerate(rank))
    return orders_from_starts(grid, every, name, wm.fused | fused)


def solve_window(grid: Problem, grid_tl: Timeline, window: Window, objective: str, seconds: float,
                 workers: int, seed: int, choose: bool = False,
                 stats: LnsStats | None = None) -> tuple[Schedule, Choice | None] | None:
    """The window re-solved and spliced back, with the recompute choice it runs (None: every microbatch
    recomputes); None when CP-SAT found nothing (or only the hint). `choose`: see build_window_model.
    `stats.settled` is set when the window held every pass and CP-SAT proved it optimal: no later window
    can do better on the grid."""
    wm = build_window_model(grid, grid_tl, window, objective, choose)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, seconds)
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    status = solver.solve(wm.model)
    if stats is not None:
        stats.settled = status == cp_model.OPTIMAL and not any(window.before) and sum(window.inside) == sum(
            len(slots) for slots in grid_tl.slots)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    starts = {a: int(solver.value(s)) for a, s in wm.v.start.items()}
    fused = frozenset(b for b, var in wm.v.fused.items() if solver.boolean_value(var))
    changed = recompute_flags.changed(grid, wm.flags, solver)
    if starts == wm.hint and not changed and fused == wm.hinted_fused:
        return None
    chosen = recompute_flags.read_choice(grid, wm.flags, solver) if changed else grid.recompute_microbatches
    schedule = splice(grid, wm, starts, "zbsearch", fused)
    return (schedule, None) if chosen is None else (schedule.with_choice(chosen), chosen)


def _window_size(total: int, seconds: float) -> int:
    return max(50, min(WINDOW_PASSES, total // 4, int(WINDOW_PASSES * seconds / WINDOW_SECONDS)))


def pick_window(grid_tl: Timeline, size: int, k: int, rng: random.Random) -> Window:
    """The k-th window: the last stretch first (it holds every rank's last pass, where the objective is
    decided), then the first, then stretches at random. `size` is about how many passes it frees."""
    ends = sorted(s.start for s in grid_tl.iter_slots())
    n = len(ends)
    size = min(size, n)
    if k == 0:
        lo = n - size
    elif k == 1:
        lo = 0
    else:
        lo = rng.randrange(0, n - size + 1)
    t0 = ends[lo]
    t1 = ends[lo + size] if lo + size < n else math.inf
    return window_at(grid_tl, t0, t1)


def improve(problem: Problem, schedule: Schedule, deadline: float, *, timeline: Timeline | None = None,
            workers: int = 2, seed: int = 0, resolution: int = 20,
            choose: bool = False) -> LnsResult | None:
    """Windows re-solved one after another until `deadline` (time.monotonic()), from `schedule` (its
    backwards split into B and W, except where a split B raises memory: cpsat.fusable_chunks, whose full
    backwards the windows may keep whole or split); never worse than it. None when `schedule` is not valid. `timeline`:
    the schedule's, when the caller has validated it already (a full validation is costly on large models).
    With `choose` the windows also choose which microbatches recompute (exact/recompute_flags.py): `problem` and
    `schedule` carry the choice to start from (Problem.recompute_microbatches, and the same in the
    schedule's plan record), and the schedule returned carries the one it runs."""
    stats = LnsStats()
    best, best_tl = schedule, timeline
    if best_tl is None:
        report = check(best, problem.profile, problem.limit)
        if not report.ok or report.timeline is None:
            # Split apart, a fused backward can hold more than the limit allows (torch's runtime memory):
            # there is then no valid split incumbent to start from.
            return None
        best_tl = report.timeline
    best_obj, best_sum = problem.objective.of(best_tl), spans_sum(best_tl)
    grid = on_grid(problem, choose_step(problem, resolution))
    rng = random.Random(seed)
    grid_tl = simulate(best, grid.profile)
    while deadline - time.monotonic() > MIN_SECONDS + overhead(problem):
        left = deadline - time.monotonic() - overhead(problem)
        seconds = min(WINDOW_SECONDS, left - MIN_SECONDS / 2)
        window = pick_window(grid_tl, _window_size(len(grid.passes), seconds), stats.windows, rng)
        stats.windows += 1
        solved = solve_window(grid, grid_tl, window, problem.objective, seconds, workers, seed + stats.windows,
                              choose, stats)
        if solved is None:
            if stats.settled:
                break
            continue
        candidate, chosen = solved
        report = check(candidate, problem.profile, problem.limit)
        if not report.ok or report.timeline is None:
            stats.rejected += 1
            continue
        obj, total = problem.objective.of(report.timeline), spans_sum(report.timeline)
        if obj < best_obj * (1 - 1e-12) or (obj <= best_obj * (1 + 1e-12) and total < best_sum * (1 - 1e-12)):
            stats.accepted += 1
            stats.improved += obj < best_obj * (1 - 1e-12)
            best, best_tl, best_obj, best_sum = candidate, report.timeline, obj, total
            grid = replace(grid, recompute_microbatches=chosen)
            grid_tl = simulate(best, grid.profile)
            stats.history.append(best_obj)
        if stats.settled:  # the whole problem in one window, solved to optimality on the grid
            break
    return LnsResult(best, best_tl, best_obj, stats)
