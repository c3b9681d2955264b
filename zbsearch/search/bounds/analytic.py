"""Lower bounds on the objective that hold for every valid schedule of a problem.

They make the reported gap meaningful where CP-SAT's own bound is weak (the span objective, large instances).
Each bound is computed from a list of passes, so the same code bounds the exact problem and the grid's.

- head: no pass of rank r can start before microbatch 0's forwards reach it.
- work: a rank runs its passes one at a time.
- start idle: before rank r's first backward only forwards can run, and nothing is freed until a
  backward ends, so only the forwards whose activations fit in the limit together can fill the time
  until the first microbatch's gradient comes back, and of a chunk later on the route only those
  that start after microbatch 0's forwards reach it. The rest of that window is idle.
- end idle: between the end of rank r's last forward and that microbatch's first backward on r,
  the gradient makes the rest of the round trip; only B and W of microbatches already in memory
  at that moment can fill the window, and memory caps how many there are.
  Both hold on any placement (measured along each route through the rank); for one stage per rank
  they are the round trip of microbatch 0 to the last stage and back.
- memory-time (any placement): a microbatch's activations on a chunk stay from the start of its F
  to the end of its B (mem_B - mem_W) and of its W (mem_W), and neither can be shorter than the
  longest dependency path between those passes. All of it lies inside the rank's window, where at
  most `limit` is held at any moment, so the window lasts at least the total memory-time over the
  limit. Under tight limits this is the bound that binds: activations wait out the round trip.
- the rank on its own (its chunks on a single route): its passes alone, other ranks only delaying a
  microbatch, solved exactly by bounds/rank_sequence.py. It joins the start and end idle and the memory they
  share, where the bounds above take each alone; on a rank with several chunks (V-shape, interleaved) it
  also couples the chunks, which share the rank's memory and wait on each other's round trips.
- nesting (one route): a rank's window holds the window of every rank deeper on the route, from its
  first forward to its last backward, with the trips there and back (bounds/window_nesting.py).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Sequence

from ...core.ir import Action, Kind
from ..budget import BUDGET, Budget, past
from ..problem import Pass, Problem, longest_from
from .relaxations import bound_passes
from .rank_chain import RankChain, Step
from .rank_sequence import least_span
from .window_nesting import nested_spans
from ...sim.validate import MEMORY_RTOL
from ...core.objective import Objective


@dataclass(frozen=True)
class RankBound:
    rank: int
    head: float  # earliest start of the rank's first pass
    work: float
    start_idle: float
    end_idle: float
    disjoint: bool  # whether the two idle windows are known not to overlap
    memory_time: float = 0.0  # shortest window the rank's activations fit in under its limit
    trip_idle: float = 0.0  # idle before the first B of the rank's first chunk on a route
    trip_disjoint: bool = False  # whether that window and the end idle's are known not to overlap
    sequence: float = 0.0  # least span of the rank on its own (bounds/rank_sequence.py); 0 where not computed
    nested: float = 0.0  # the window of a deeper rank and the trips to it and back (bounds/window_nesting.py)

    @property
    def span(self) -> float:
        idle = self.start_idle + self.end_idle if self.disjoint else max(self.start_idle, self.end_idle)
        trip = self.trip_idle + self.end_idle if self.trip_disjoint else max(self.trip_idle, self.end_idle)
        return max(self.work + max(idle, trip), self.memory_time, self.sequence, self.nested)

    @property
    def end(self) -> float:
        return self.head + self.span


def earliest_starts(passes: Sequence[Pass]) -> dict[Action, float]:
    """Longest path from time 0 to each pass's start, over data dependencies only."""
    by_action = {ps.action: ps for ps in passes}
    es: dict[Action, float] = {}
    for ps in passes:  # Problem.passes lists producers before consumers within each microbatch
        es[ps.action] = max((es[a] + by_action[a].duration + hop for a, hop in ps.inputs), default=0.0)
    return es


def hold_times(problem: Problem, passes: Sequence[Pass]) -> dict[int, tuple[float, float]]:
    """For each chunk, the shortest time a microbatch's activations stay on it: (start of its F to the end of
    its B, start of its F to the end of its W), each the longest dependency path between the two."""
    return _hold_times(_forward_paths(problem, passes))


def _forward_paths(problem: Problem, passes: Sequence[Pass]) -> dict[int, dict[int, dict[Action, float]]]:
    """For the first microbatch of each route (costs do not depend on the microbatch, so it stands
    for its route) and each chunk on that route: the longest path from the start of the chunk's F
    to the end of every pass that depends on it. Keyed by microbatch, then chunk."""
    pl, m = problem.placement, problem.num_microbatches
    leaders: dict[int, list[Pass]] = {i: [] for i in sorted({pl.route_index(i, m): i for i in reversed(range(m))}.values())}
    for ps in passes:
        if ps.action.microbatch in leaders:
            leaders[ps.action.microbatch].append(ps)
    return {i: {c: longest_from(mb_passes, Action(c, Kind.F, i)) for c in pl.route(i, m)}
            for i, mb_passes in leaders.items()}


def _hold_times(paths: dict[int, dict[int, dict[Action, float]]]) -> dict[int, tuple[float, float]]:
    return {c: (since[Action(c, Kind.B, i)], since[Action(c, Kind.W, i)])
            for i, per_chunk in paths.items() for c, since in per_chunk.items()}


def rank_bounds(problem: Problem, passes: Sequence[Pass], chains: bool = True, nesting: bool = True,
                deadline: float | None = None, budget: Budget = BUDGET,
                chain_states: int | None = None) -> list[RankBound]:
    """Every bound above, per rank. `chains`: also walk the chains of ranks that hold several chunks
    (see _with_chains; each walk gives up past `chain_states` states, by default the budget's
    rank_walk_states, as does a one-chunk rank's walk), and with `nesting` nest each deeper rank's window
    in the ranks above it (bounds/window_nesting.py, whose deepest walk stops at `deadline`: no chain walk
    starts past it either); off where many problems are bounded in little time (the split walk). `budget`:
    state caps, exact fills' size."""
    p = problem.num_ranks
    es = earliest_starts(passes)
    work: dict[int, float] = defaultdict(float)
    head: dict[int, float] = {}
    for ps in passes:
        work[ps.rank] += ps.duration
        head[ps.rank] = min(head.get(ps.rank, math.inf), es[ps.action])
    chunks = _chunk_facts(passes)
    paths = _forward_paths(problem, passes)
    held = _memory_time(chunks, _hold_times(paths), problem.limit.per_rank)
    first_mb = [ps for ps in passes if ps.action.microbatch == 0]  # costs do not depend on the microbatch
    out: list[RankBound] = []
    alones: list[RankChain | None] = []
    for r in range(p):
        cap = problem.limit.per_rank[r] * (1 + MEMORY_RTOL)
        mine = {c: f for c, f in chunks.items() if f.rank == r}
        start_idle = end_idle = trip_idle = math.inf
        trip_disjoint = True
        routes = _route_facts(problem, paths, mine, r)
        for facts in routes:
            start_idle = min(start_idle, facts.to_first_b - _forwards_that_fit(mine, cap, facts, budget))
            end_idle = min(end_idle, facts.after_last_f - _backwards_that_fit(mine, cap, facts.held, budget))
            trip_idle = min(trip_idle, facts.to_own_b - _work_before_own_b(mine, cap, facts.held))
            first = mine[facts.held[0]]
            trip_disjoint = trip_disjoint and first.alloc * first.count > cap
        # The windows overlap only if every forward runs before the first backward, so all of
        # them fit in memory together (for the trip window: every F of that first chunk).
        disjoint = sum(f.alloc * f.count for f in mine.values()) > cap
        alone = _alone(problem, first_mb, mine, cap) if chains or len(mine) == 1 else None
        alones.append(alone)
        one_chunk = alone if alone is not None and len(alone.steps) <= 3 else None
        alone_span = (least_span(one_chunk, budget.rank_walk_states) or 0.0) if one_chunk is not None else 0.0
        out.append(RankBound(r, head[r], work[r], max(0.0, start_idle), max(0.0, end_idle), disjoint, held[r],
                             max(0.0, trip_idle), trip_disjoint, alone_span))
    if not chains:
        return out
    out = _with_chains(out, [a if a is not None and len(a.steps) > 3 else None for a in alones], problem.objective,
                       budget.rank_walk_states if chain_states is None else chain_states, deadline)
    if not nesting:
        return out
    return [replace(b, nested=n) for b, n in zip(out, nested_spans(problem, first_mb, alones, deadline, budget))]


# The chain walk (bounds/rank_sequence.py) costs up to a second per rank; it runs only on ranks whose other
# bounds come within this share of the largest (on byte-capped V-shape splits it raised a rank <= 8%).
CHAIN_REACH = 0.1


def _with_chains(out: list[RankBound], chains: list[RankChain | None], objective: str,
                 states: int, deadline: float | None = None) -> list[RankBound]:
    """The bounds with the chain walk's least span on the ranks that hold several chunks of one route and come
    within CHAIN_REACH of the largest rank bound; none started past `deadline` (the bounds without it hold)."""
    top = objective_bound(out, objective) if out else 0.0
    for r, chain in enumerate(chains):
        if past(deadline):
            break
        if chain is not None and in_chain_reach(objective_bound([out[r]], objective), top):
            out[r] = replace(out[r], sequence=least_span(chain, states) or 0.0)
    return out


def in_chain_reach(rank_bound: float, top: float) -> bool:
    """Whether a rank whose bound (before its chain walk) is `rank_bound` gets the walk, where the
    largest rank bound is `top`."""
    return rank_bound >= (1 - CHAIN_REACH) * top


def _alone(problem: Problem, first_mb: Sequence[Pass], mine: dict[int, "_Chunk"], cap: float) -> RankChain | None:
    """The rank on its own (bounds/rank_sequence.py) where its chunks lie on a single route; else None. Its
    chain, from microbatch 0's passes `first_mb` (in dependency order): the forwards in route order,
    the backwards in reverse, each lagged behind the one before by the longest dependency path from
    that one's start (through the other ranks); a weight pass after each backward."""
    route = problem.placement.routes
    if len(route) != 1 or not mine:
        return None
    here = [c for c in route[0] if c in mine]
    by_action = {ps.action: ps for ps in first_mb}
    order = [Action(c, Kind.F, 0) for c in here] + [Action(c, Kind.B, 0) for c in reversed(here)]
    if any(a not in by_action for a in order) or any(Action(c, Kind.W, 0) not in by_action for c in here):
        return None
    steps = []
    for k, a in enumerate(order):
        ps = by_action[a]
        lag = None if k == 0 else longest_from(first_mb, order[k - 1])[a] - ps.duration
        steps.append(Step(ps.duration, ps.alloc, ps.free, None if k == 0 else k - 1, lag))
    for c in reversed(here):
        ps = by_action[Action(c, Kind.W, 0)]
        steps.append(Step(ps.duration, ps.alloc, ps.free, order.index(Action(c, Kind.B, 0))))
    return RankChain(tuple(steps), mine[here[0]].count, cap)


@dataclass(frozen=True)
class _Chunk:
    rank: int
    count: int  # microbatches through this chunk
    F: float
    B: float
    W: float
    alloc: float  # held from F's start; W's part stays until W ends
    keep: float


@dataclass(frozen=True)
class _RouteFacts:
    to_first_b: float  # the route's first F on the rank starts -> its first B there can start
    after_last_f: float  # the route's last F on the rank ends -> that microbatch's first B there
    held: tuple[int, ...]  # chunks on the rank that one microbatch of this route holds at that moment
    to_own_b: float = 0.0  # the route's first F on the rank starts -> that chunk's own B can start
    arrivals: tuple[float, ...] = ()  # the route's first F on the rank starts -> each of `held`'s F can start


def _chunk_facts(passes: Sequence[Pass]) -> dict[int, _Chunk]:
    found: dict[int, dict] = defaultdict(lambda: {"count": 0})
    for ps in passes:
        f = found[ps.action.chunk]
        f["rank"] = ps.rank
        f[ps.action.kind.name] = ps.duration
        if ps.action.kind is Kind.F:
            f["count"] += 1
            f["alloc"] = ps.alloc
        elif ps.action.kind is Kind.W:
            f["keep"] = ps.free
    return {c: _Chunk(f["rank"], f["count"], f["F"], f["B"], f["W"], f["alloc"], f["keep"]) for c, f in found.items()}


def _memory_time(chunks: dict[int, _Chunk], hold: dict[int, tuple[float, float]], limits: Sequence[float]) -> list[float]:
    """Per rank, the shortest window that holds all its activations' memory-time under its limit."""
    need = [0.0] * len(limits)
    for c, f in chunks.items():
        to_b, to_w = hold[c]
        # mem_W > mem_B (torch's split backward): the rise after B stays at least until W has run
        low, rise = min(f.alloc, f.keep), max(0.0, f.keep - f.alloc)
        need[f.rank] += f.count * (max(0.0, f.alloc - f.keep) * to_b + low * to_w + rise * f.W)
    # The validator lets a peak exceed the limit by its relative tolerance; so does this bound.
    return [0.0 if math.isinf(cap) or cap <= 0 else n / (cap * (1 + MEMORY_RTOL)) for n, cap in zip(need, limits)]


def _route_facts(problem: Problem, paths: dict[int, dict[int, dict[Action, float]]], mine: dict[int, _Chunk],
                 rank: int) -> list[_RouteFacts]:
    """For each route through `rank`, on its first microbatch: how long after its first forward on
    the rank a backward can start there, and how long after its last forward there its gradient
    comes back."""
    pl, m = problem.placement, problem.num_microbatches
    out = []
    for i, per_chunk in paths.items():
        here = tuple(c for c in pl.route(i, m) if pl.chunk_to_rank[c] == rank)
        if not here:
            continue
        from_first, from_last = per_chunk[here[0]], per_chunk[here[-1]]
        b_starts = [from_first[Action(c, Kind.B, i)] - mine[c].B for c in here]
        back = here[-1]
        arrivals = tuple(from_first[Action(c, Kind.F, i)] - mine[c].F for c in here)
        out.append(_RouteFacts(min(b_starts), from_last[Action(back, Kind.B, i)] - mine[back].B - mine[back].F, here,
                               b_starts[0], arrivals))
    return out


def _work_before_own_b(mine: dict[int, _Chunk], cap: float, here: tuple[int, ...]) -> float:
    """Most work a rank can run before the first B of `here[0]`, its first chunk on a route: that
    chunk frees nothing until then, so at most cap / its alloc microbatches start there, each bringing
    its F there and its passes on the route's later chunks on the rank; chunks of other routes may run
    all their work."""
    first = mine[here[0]]
    k = first.count if math.isinf(cap) else blocks_that_fit(cap, first.alloc, first.count)
    per_microbatch = first.F + sum(mine[c].F + mine[c].B + mine[c].W for c in here[1:])
    others = sum(f.count * (f.F + f.B + f.W) for c, f in mine.items() if c not in here)
    return k * per_microbatch + others


# Above the budget's exact_combinations the fills below use their linear relaxation: still an upper bound on
# the work that fits (so the idle bound stays valid), only looser.


def _forwards_that_fit(mine: dict[int, _Chunk], cap: float, facts: _RouteFacts, budget: Budget) -> float:
    """Most forward work a rank can run before its first backward: nothing is freed until a
    backward ends, so all those forwards' activations are held at once; and a chunk later on the
    route gets its first forward only when microbatch 0's forwards reach it, so only the forwards
    that start between then and the first backward count (a V-shape's rank 0 can run nothing but
    embedding forwards while the first microbatch travels down to its head chunk)."""
    arrival = dict(zip(facts.held, facts.arrivals))
    window = facts.to_first_b
    # Another route's chunk (not in `arrival`): its forwards may have started before the window, any number.
    return most_that_fits(cap, [(f.alloc, f.F, forwards_that_start(window, arrival[c], f.F, f.count)
                                 if c in arrival else f.count) for c, f in mine.items()], budget.exact_combinations)


def forwards_that_start(window: float, arrival: float, duration: float, count: int) -> int:
    """How many of a chunk's `count` forwards, each `duration` long and run one at a time, can start
    before `window` when the first can start at `arrival`."""
    if duration <= 0:
        return count
    return min(count, max(0, math.ceil((window - arrival) / duration - 1e-9)))


def most_that_fits(room: float, items: Sequence[tuple[float, float, int]],
                   combinations: int = BUDGET.exact_combinations) -> float:
    """The most worth of (size, worth, count) items held at once in `room`: exact over whole counts
    when there are at most `combinations` (the budget's exact_combinations), else the linear relaxation
    (an upper bound, so idle bounds built on it stay valid)."""
    if math.isinf(room):
        return sum(worth * count for _, worth, count in items)
    head, (tail_size, tail_worth, tail_count) = items[:-1], items[-1]
    if len(head) == 1:  # two chunks (the V-shape), the split walk's hot path: one plain loop
        size, worth, count = head[0]
        return max(n * worth + blocks_that_fit(room - n * size, tail_size, tail_count) * tail_worth
                   for n in range(blocks_that_fit(room, size, count) + 1))
    ranges = [range(blocks_that_fit(room, size, count) + 1) for size, _, count in head]
    if math.prod(len(x) for x in ranges) > combinations:
        return fractional_fill(room, list(items))
    best = 0.0
    for counts in itertools.product(*ranges):
        left = room - sum(n * size for n, (size, _, _) in zip(counts, head))
        if left < 0:
            continue
        best = max(best, sum(n * worth for n, (_, worth, _) in zip(counts, head))
                   + blocks_that_fit(left, tail_size, tail_count) * tail_worth)
    return best


def _backwards_that_fit(mine: dict[int, _Chunk], cap: float, held: tuple[int, ...], budget: Budget) -> float:
    """Most B and W work a rank can run between its last forward and the first backward there of
    that forward's microbatch. Only microbatches whose activations are held at that moment can run
    (every forward on the rank is done): some awaiting B (worth B + W, holding alloc) and some
    awaiting only W (worth W, holding keep); the last microbatch holds its chunks and runs nothing."""
    chunks = list(mine.items())
    room0 = cap - sum(f.alloc for c, f in chunks if c in held)
    counts = {c: f.count - (c in held) for c, f in chunks}
    if math.isinf(cap):
        return sum(counts[c] * (f.B + f.W) for c, f in chunks)
    ranges = [range(blocks_that_fit(max(room0, 0.0), f.alloc, counts[c]) + 1) for c, f in chunks]
    if math.prod(len(x) for x in ranges) > budget.exact_combinations:
        items = [(f.alloc, f.B + f.W, counts[c]) for c, f in chunks] + [(f.keep, f.W, counts[c]) for c, f in chunks]
        return fractional_fill(room0, items)
    best = 0.0
    for waiting_b in itertools.product(*ranges):
        room = room0 - sum(n * f.alloc for n, (_, f) in zip(waiting_b, chunks))
        if room < 0:
            continue
        done = sum(n * (f.B + f.W) for n, (_, f) in zip(waiting_b, chunks))
        w_items = [(f.keep, f.W, counts[c] - n) for n, (c, f) in zip(waiting_b, chunks)]
        if len(w_items) == 1:
            keep, w, n_max = w_items[0]
            done += blocks_that_fit(room, keep, n_max) * w
        else:
            done += fractional_fill(room, w_items)
        best = max(best, done)
    return best


def blocks_that_fit(room: float, size: float, count: int) -> int:
    """How many blocks of `size` fit in `room`, at most `count`."""
    if size <= 0:
        return max(count, 0)
    # Divide, then floor with a tolerance: `room // size` rounds 4.99999... down to 4 when the room
    # holds exactly 5 blocks in decimal but not in binary floating point.
    return max(0, min(count, math.floor(room / size + 1e-9)))


def fractional_fill(room: float, items: list[tuple[float, float, int]]) -> float:
    """Linear relaxation of a bounded knapsack: (size, worth, count) items by worth per size, the
    last one cut to fit. No integer choice is worth more."""
    total = 0.0
    for size, worth, count in sorted(items, key=lambda x: -x[1] / x[0] if x[0] > 0 else -math.inf):
        if count <= 0:
            continue
        if size <= 0:
            total += worth * count
            continue
        take = min(count, max(room, 0.0) / size)
        total += take * worth
        room -= take * size
    return total


def objective_bound(bounds: Sequence[RankBound], objective: Objective | str) -> float:
    """The objective's lower bound from per-rank bounds: the largest span, or the latest end."""
    return max(b.span for b in bounds) if Objective.parse(objective) is Objective.SPAN else max(b.end for b in bounds)


def lower_bound(problem: Problem, passes: Sequence[Pass] | None = None, objective: str | None = None) -> float:
    """The best analytic lower bound on the objective (makespan or span); over `bound_passes` unless
    the passes are given."""
    bounds = rank_bounds(problem, passes if passes is not None else bound_passes(problem))
    return objective_bound(bounds, objective or problem.objective)
