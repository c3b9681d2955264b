"""Choose the split of a model's layers, the placement and the schedule together, under a memory cap.

The method, per placement: score candidate splits (even, the chunk-time DP, the rank-balanced DP,
memory-capped DPs for the in-flight counts of 1F1B and ZB-H2 on each rank) with the fast heuristics
(the best valid heuristic schedule on that split: its objective, ties to the lower peak memory); move
boundary layers one at a time from the best, trying first the moves whose own lower bound is smallest
and never one whose bound cannot beat the best, while they improve the score (for a share of the time,
then again after the starts while the scoring share lasts); give the even and balanced splits (the ones
`--partition` names; the other seeds while the scoring share lasts) the tuned and periodic starts solve()
would give them under `--partition NAME`, for the same seconds (partition/scored.py); then polish with the
full solver (CP-SAT) the best split and, of those near it, the one of least own bound (partition/polish.py;
a later split whose bound cannot beat the plan in hand leaves its time to the best). So the answer is never
slower than the start `--partition even` or `balanced` solves from on the same placements (both starts run as
long there, and give the same schedule where neither is cut short by its deadline); CP-SAT's time on the split
differs, so the final plans may still differ by what it finds. The answer's lower bound is the bound over every
split (partition/bounds.py, tightened by partition/enumerate.py in the time kept for it), so its gap says how
far it is from the best plan of any partition.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ...core.errors import InfeasibleError, PartitionError
from ...core.ir import Placement
from ...core.objective import Objective, status_for
from ...core.memory import DEFAULT_HEADROOM, byte_cap, parse_mem_limit
from ...core.partition import check_chunk_counts, partition_profile, route_length
from ...core.profile import Profile
from ..budget import BUDGET, Budget, past
from ...core.placement import parse_placement
from ..problem import Problem
from ..solve.driver import solve
from ..options import SearchOptions
from ..solve.report import PartitionDetails, SolveResult
from ..solve.starts import heuristic_start
from ...profiling.partition import linear_partition
from .bounds import least_bound_split, split_bound
from .enumerate import bound_input, refined_bound
from .leaf import RankCache
from .report import rank_totals, split_facts
from .polish import polish
from .scored import NAMED, Scored, give_starts
from .candidates import (balanced_counts, even_counts, memory_capped_counts, parse_rule, rank_balanced,
    rank_work, transfers)

@dataclass(frozen=True)
class SplitRequest:
    """What to search: the profile with layers, the stage count, placements, limit and objective."""

    profile: Profile
    num_ranks: int
    placements: tuple[str, ...]
    mem_limit: str | None
    objective: Objective = Objective.MAKESPAN  # a word ("span") is taken and read as its member
    rule: str = "auto"  # auto, even, balanced or fixed:N1,N2,...
    headroom: float = DEFAULT_HEADROOM

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", Objective.parse(self.objective))


@dataclass
class SplitSearch:
    """The search state: every split scored so far, by placement and counts; `budget` caps its bounds'
    walks and enumerations."""

    request: SplitRequest
    deadline: float
    budget: Budget = BUDGET
    scored: dict[tuple[str, tuple[int, ...]], Scored] = field(default_factory=dict)
    refused: list[InfeasibleError] = field(default_factory=list)
    proven: dict[tuple[str, tuple[int, ...]], float] = field(default_factory=dict)  # solved splits' bounds
    ranks: RankCache = field(init=False, repr=False)  # each rank's own bound, once computed

    def __post_init__(self) -> None:
        self.ranks = RankCache(self.request.profile, self.problem, self.budget)

    def leaf_bound(self, placement: Placement, chains: bool = False) -> Callable[[tuple[int, ...]], float]:
        """A split's own bound: the analytic one (bounds/analytic.py, rank by rank: partition/leaf.py), or what
        solving it proved; inf when no schedule of it fits the limit. `chains`: with the walk over each
        rank's chain of chunks, which costs about ten times as much per rank (the walk gives it only the
        splits that could set its answer)."""
        def bound(counts: tuple[int, ...]) -> float:
            own = self.ranks.bound(placement, counts, chains)
            return max(own, self.proven.get((placement.name, tuple(counts)), 0.0))
        return bound

    def problem(self, placement: Placement, counts: Sequence[int]) -> Problem:
        req = self.request
        prof = partition_profile(req.profile, placement, counts)
        limit = parse_mem_limit(req.mem_limit, prof, placement, headroom=req.headroom)
        return Problem(prof, placement, req.profile.microbatches, limit, req.objective)

    def score(self, placement: Placement, counts: Sequence[int], origin: str) -> Scored:
        """The split's best heuristic schedule (past the search's scoring deadline, no more greedy variants
        than one that fits), kept once per split."""
        key = (placement.name + str(placement.num_chunks), tuple(counts))
        if key in self.scored:
            return self.scored[key]
        entry = Scored(placement, tuple(counts), origin)
        try:
            problem = self.problem(placement, counts)
            problem.check_feasible()
            start = heuristic_start(problem, self.deadline)
        except InfeasibleError as exc:
            self.refused.append(exc)
        else:
            entry.objective, entry.peak = start.objective, max(rank_totals(start.timeline))
            entry.problem, entry.start = problem, start
        self.scored[key] = entry
        return entry

    def time_left(self) -> float:
        return self.deadline - time.monotonic()


def named_splits(request: SplitRequest, placement: Placement) -> list[tuple[str, tuple[int, ...]]]:
    """The splits `--partition` names (NAMED), balanced first: where time is short it is scored first."""
    layers, k = request.profile.layers or (), route_length(placement)
    return [("balanced", balanced_counts(layers, k)), ("even", even_counts(layers, k))]


def seed_splits(request: SplitRequest, placement: Placement, budget: Budget = BUDGET,
                deadline: float | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """The candidate splits of one placement: the named ones, then the rank-balanced, least-bound and
    in-flight-fitting ones (`budget`: the least-bound split's caps; its DP stops at `deadline`, and then
    names no split)."""
    layers = request.profile.layers or ()
    out = named_splits(request, placement)
    balanced = out[0][1]
    out.append(("rank-balanced", rank_balanced(layers, balanced, placement)))
    least = least_bound_split(bound_input(request.profile, placement, request.mem_limit, request.objective,
                                          request.headroom, budget), deadline)
    if least is not None:
        out.append(("least-bound", least))
    cap = byte_cap(request.mem_limit, request.profile, request.headroom)
    if cap is not None and placement.num_chunks == placement.num_ranks:
        p, m = placement.num_ranks, request.profile.microbatches
        for name, flight in (("memory-1f1b", [min(m, p - r) for r in range(p)]),
                             ("memory-zb-h2", [min(m, 2 * (p - r) - 1) for r in range(p)])):
            counts = memory_capped_counts(layers, placement, [cap] * p, flight)
            if counts is not None:
                out.append((name, counts))
    return out


def improve_split(search: SplitSearch, start: Scored, budget_end: float) -> Scored:
    """One-layer transfers from `start` while they improve: the moves whose cheap bound (split_bound)
    is smallest first (ties: the one that unloads the busiest rank), and none whose bound cannot beat
    the best."""
    req = search.request
    layers = req.profile.layers or ()
    data = bound_input(req.profile, start.placement, req.mem_limit, req.objective, req.headroom, search.budget)
    best = start
    while time.monotonic() < budget_end:
        moves = sorted((split_bound(data, c), max(rank_work(layers, c, best.placement)), c)
                       for c in transfers(best.counts))
        better = None
        for own, _, counts in moves:
            if time.monotonic() >= budget_end or own >= best.objective:
                break
            cand = search.score(best.placement, counts, start.origin + " + layer moves")
            if cand.key < best.key and cand.objective < math.inf:
                better = cand
                break
        if better is None:
            break
        best = better
    return best


def fixed_split(request: SplitRequest, options: SearchOptions = SearchOptions()) -> SolveResult:
    """Solve one named split (even, balanced or fixed:...) on each placement; the best wins."""
    t0 = time.monotonic()
    time_limit = options.time_limit
    results = []
    search = SplitSearch(request, t0 + time_limit, options.budget)
    names = _placements_with_as_many_chunks(request)
    for k, name in enumerate(names):
        placement = parse_placement(name, request.num_ranks)
        _, counts = parse_rule(request.rule, request.profile.layers or (), placement)
        assert counts is not None
        share = (time_limit - (time.monotonic() - t0)) / (len(names) - k)
        try:
            results.append(solve(search.problem(placement, counts), options.with_time(share)))
        except InfeasibleError as exc:
            search.refused.append(exc)
    if not results:
        raise search.refused[0]
    return _finish(request, results, search, t0, request.rule, None)


def _placements_with_as_many_chunks(request: SplitRequest) -> tuple[str, ...]:
    """The placements to solve a named split on: for fixed:N1,N2,..., those of several tried whose route
    has one chunk per count (fixed:... under auto names one placement's chunks); else every placement
    asked. Where none has, the first is kept, and its error says which placement the counts fit."""
    rule = request.rule.strip().lower()
    if not rule.startswith("fixed:") or len(request.placements) == 1:
        return request.placements
    given = len(rule[len("fixed:"):].split(","))
    fits = tuple(name for name in request.placements
                 if route_length(parse_placement(name, request.num_ranks)) == given)
    return fits or request.placements[:1]


def search_splits(request: SplitRequest, options: SearchOptions = SearchOptions(time_limit=60.0)) -> SolveResult:
    """The joint search: the best split, placement and schedule found within the options' time limit."""
    if request.rule.strip().lower() != "auto":
        return fixed_split(request, options)
    t0 = time.monotonic()
    time_limit, budget = options.time_limit, options.budget
    search = SplitSearch(request, t0 + budget.split_search_share * time_limit, budget)
    placements = [parse_placement(name, request.num_ranks) for name in request.placements]
    for placement in placements:
        k = route_length(placement)
        if len(request.profile.layers or ()) < k:
            check_chunk_counts([1] * k, len(request.profile.layers or ()), placement)  # says there are too few layers
    # Every placement's named splits first, whatever the time (past the scoring share with one heuristic
    # each); then the other seeds, each a heuristic run (0.4 s at p=8, m=32; 2.5 s on the V-shape at p=8,
    # m=128), and layer moves for at most split_moves_share, while the scoring share lasts; then the named
    # splits start where `--partition NAME` would (scored.py) while the polish's time lasts; then more moves
    # while the scoring share lasts. Seeds and some moves come before those starts: at 25 s on p=8, m=32 the
    # starts took the whole scoring share, and with them first llama3-8b at 49 GiB kept the V balanced
    # split's 8,075.0 ms (seeds first, no moves: 6,726.7; seeds and moves: 6,269.7). The moves' share is
    # capped: at 80 s, moves until the scoring share's end took 30 s for 1% on deepseek-v2-lite's
    # heuristic schedule, and the starts after them left the polish 5 s.
    named = [search.score(pl, counts, origin) for pl in placements for origin, counts in named_splits(request, pl)]
    seeds = list(named)
    for placement in placements:
        for origin, counts in seed_splits(request, placement, budget, search.deadline):
            if origin not in NAMED and time.monotonic() < search.deadline:
                seeds.append(search.score(placement, counts, origin))
    _move_layers(search, placements, min(search.deadline, time.monotonic() + budget.split_moves_share * time_limit))
    _give_starts(search, named, options, t0 + (1 - budget.split_bound_share) * time_limit)
    _move_layers(search, placements, search.deadline)
    _give_starts(search, seeds, options, search.deadline)
    ranked = sorted((s for s in search.scored.values() if s.problem is not None), key=lambda s: s.found_key)
    if not ranked:
        raise _no_split_fits(request, search)
    options.tell(time.monotonic() - t0, ranked[0].found, 0.0, "split search")
    results, origins = polish(search, ranked, options, t0 + (1 - budget.split_bound_share) * time_limit)
    return _finish(request, results, search, t0, "auto", t0 + time_limit, origins)


def _move_layers(search: SplitSearch, placements: list[Placement], end: float) -> None:
    """improve_split from each placement's best split so far, the time until `end` shared equally."""
    for k, placement in enumerate(placements):
        best = min((s for s in search.scored.values() if s.placement == placement), key=lambda s: s.key, default=None)
        budget_end = time.monotonic() + (end - time.monotonic()) / (len(placements) - k)
        if best is not None and best.objective < math.inf:
            improve_split(search, best, budget_end)


def _give_starts(search: SplitSearch, seeds: list[Scored], options: SearchOptions, until: float | None) -> None:
    """The seeds given the starts solve() would give them under `--partition NAME` (scored.give_starts): the
    tune and periodic shares of the time limit over the placements (what fixed_split gives each), none
    past `until` (None: whatever the time), each start against the split's own bound. A seed whose own
    bound the best plan found already meets gets none: nothing solve() could find on it would be faster, so
    the joint plan stays at most its `--partition NAME` plan without them (at 25 s on deepseek-v2-lite p=8 at
    42 GiB with every block recomputed, the four named splits' starts took half the limit: 1,271.1 ms with
    them all, 1,146.8 with none)."""
    per_placement = options.time_limit / len(search.request.placements)
    budget = options.budget
    for entry in seeds:
        if past(until):
            return
        if entry.problem is None or entry.starts is not None:
            continue
        own, best = search.leaf_bound(entry.placement)(entry.counts), _best_found(search)
        if own >= best and best < entry.objective:
            continue
        give_starts(entry, own, budget.tune_share * per_placement, budget.periodic_share * per_placement,
                    options.seed, math.inf if until is None else until)


def _best_found(search: SplitSearch) -> float:
    return min((s.found for s in search.scored.values() if s.problem is not None), default=math.inf)


def _no_split_fits(request: SplitRequest, search: SplitSearch) -> Exception:
    prof = request.profile
    cap = byte_cap(request.mem_limit, prof, request.headroom)
    if cap is None:
        return search.refused[0] if search.refused else PartitionError("no split of the layers fits")
    gib = 2**30
    layers = prof.layers or ()
    heavy = max(layers, key=lambda layer: layer.static_bytes + layer.mem_B)
    need = heavy.static_bytes + heavy.mem_B
    if need > cap:
        return InfeasibleError(
            f"memory limit {request.mem_limit} is infeasible for any split: layer {heavy.name!r} alone needs "
            f"{need / gib:.3g} GiB (static bytes plus one microbatch of activations) but a rank has "
            f"{cap / gib:.3g} GiB: raise the limit above {need / gib:.3g} GiB or use more ranks")
    # One microbatch at a time on one stage per rank: the least cap some split fits is a min-max split
    # of static bytes plus activations (exact, as the profiler's time DP is for time).
    per_layer = [layer.static_bytes + layer.mem_B for layer in layers]
    counts = linear_partition(per_layer, request.num_ranks) if len(layers) >= request.num_ranks else None
    if counts is None:
        return search.refused[0] if search.refused else PartitionError("no split of the layers fits")
    least = max(sum(per_layer[sum(counts[:r]):sum(counts[:r + 1])]) for r in range(len(counts)))
    return InfeasibleError(
        f"memory limit {request.mem_limit} is infeasible for every split tried: on one stage per rank the least "
        f"any split needs is {math.ceil(least / gib * 100) / 100:g} GiB per rank (static bytes plus one "
        f"microbatch, layers per stage {','.join(map(str, counts))}); raise the limit to at least that")


@dataclass(frozen=True)
class SplitBound:
    """The bound over every split, and how each placement reached its own (JSON-ready: bound, splits
    bounded, whether the walk finished, and, once the search is done, the best plan found there)."""

    value: float
    by_placement: dict[str, dict[str, Any]]


def any_split_bound_of(request: SplitRequest, search: SplitSearch, incumbent: float,
                       deadline: float | None) -> SplitBound:
    """The bound over every split on the request's placements, and how it was reached per placement:
    the cheap DP alone (deadline None; it stops at the search's deadline), or tightened split by split
    until the deadline. A DP or walk cut short leaves a weaker bound, still over every split, and its
    placement's walk_complete False."""
    out, how = math.inf, {}
    stop = search.deadline if deadline is None else deadline
    for k, name in enumerate(request.placements):
        placement = parse_placement(name, request.num_ranks)
        data = bound_input(request.profile, placement, request.mem_limit, request.objective, request.headroom,
                           search.budget)
        # An equal share of what is left: a walk that finishes early hands its time to the next.
        left = len(request.placements) - k
        end = time.monotonic() + max(0.0, stop - time.monotonic()) / left
        value, visited, complete = refined_bound(data, incumbent, search.leaf_bound(placement), end,
                                                  search.leaf_bound(placement, chains=True), deadline is not None)
        how[name] = {"bound": value, "splits_bounded": visited, "walk_complete": complete}
        out = min(out, value)
    return SplitBound(out, how)


def _finish(request: SplitRequest, results: list[SolveResult], search: SplitSearch, t0: float,
            rule: str, deadline: float | None, origins: dict[int, str] | None = None) -> SolveResult:
    """The best result, with the bound over every split and the split's description; `origins`: where
    each result's split came from (by id), when the search proposed it."""
    best = min(results, key=lambda r: (r.objective, max(rank_totals(r.timeline))))
    over_splits = any_split_bound_of(request, search, best.objective, deadline)
    any_split, how = over_splits.value, over_splits.by_placement
    for name, placed in how.items():
        # The best plan found on each placement beside its bound: where the two stay far apart, the
        # gap is that placement's, whichever of them is weak.
        kind = parse_placement(name, request.num_ranks).name
        here = [s for s in search.scored.values() if s.placement.name == kind]
        found = [s.found for s in here] + [r.objective for r in results if r.problem.placement.name == kind]
        placed["best_found"] = min(found, default=math.inf)
        if any(math.isfinite(s.found) for s in here):  # where a recompute walk may start (recompute/search.py)
            placed["best_split"] = list(min(here, key=lambda s: s.found).counts)
    lower, status = best.lower_bound, best.status
    if rule == "auto":
        # The best plan over every split on these placements is no better than this bound; the
        # polished splits' own bounds say nothing about the other splits.
        lower = min(best.objective, any_split)
        status = status_for(best.objective, lower)
    facts = PartitionDetails(rule, best.lower_bound, any_split, how, len(search.scored), split_facts(best, rule),
                             (origins or {}).get(id(best)))
    schedule = replace(best.schedule, plan=best.problem.plan)
    return replace(best, schedule=schedule, lower_bound=lower, status=status, solve_seconds=time.monotonic() - t0,
                   details=replace(best.details, partition=facts))

