"""The recompute walk: one recompute choice on one split (`Levels`), scored with the heuristics
(`evaluate`), and the steps from it to its neighbours (`steps_from`), walked while one helps (`walk`),
the split improved after each step (`resplit`). search.py says where the walks start and what is done
with their ends.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Sequence

from ...core.errors import InfeasibleError
from ...core.ir import Placement
from ...core.layers import Layer
from ...core.partition import groups
from ...core.recompute.levels import held_from_f, option_of, with_recompute
from ...sim.simulate import Timeline
from ..budget import Budget
from ..problem import Problem
from ..solve.starts import heuristic_start
from ..partition.search import SplitRequest, SplitSearch, improve_split
from .microbatches import fewest

STEPS = (1, 2, 4)  # layers added per throttled rank in one step
RESPLIT_TRIES = 2  # where no step helps on the split, the best steps tried with their split improved


@dataclass
class Levels:
    """One recompute choice on one split: the levels by layer name, and what the heuristics make of it."""

    levels: dict[str, str]
    placement: Placement
    counts: tuple[int, ...]
    objective: float = math.inf
    tight: tuple[int, ...] = ()  # the ranks at their cap
    recompute_time: float = 0.0  # the recompute options' time, one microbatch through every layer

    @property
    def order_key(self) -> tuple[float, float]:
        """The walk's order of choices: the objective, then the recompute time."""
        return self.objective, self.recompute_time

    def beats(self, other: "Levels") -> bool:
        """A lower objective, or the same with less recompute, which leaves room to move the split (on
        a 70B-like profile at p=2 a rank off the critical path kept 24 layers recomputed)."""
        return self.objective < other.objective * (1 - 1e-9) or (
            self.objective <= other.objective * (1 + 1e-9) and self.recompute_time < other.recompute_time * (1 - 1e-9))


def rank_layers(request: SplitRequest, placement: Placement, counts: Sequence[int]) -> list[list[Layer]]:
    """The profile's layers on each rank for a split (route order)."""
    route = placement.routes[0]
    out: list[list[Layer]] = [[] for _ in range(placement.num_ranks)]
    for k, group in enumerate(groups(request.profile.layers or (), counts)):
        out[placement.chunk_to_rank[route[k]]].extend(group)
    return out


def evaluate(request: SplitRequest, levels: dict[str, str], placement: Placement,
              counts: Sequence[int], per_microbatch: bool) -> Levels:
    """The heuristics' best schedule of one split with these levels (recomputing, with `per_microbatch`,
    only the microbatches that need it), and which ranks sit at their cap."""
    layers = request.profile.layers or ()
    out = Levels(dict(levels), placement, tuple(counts), recompute_time=sum(
        option.time for x in layers if x.name in levels for option in [option_of(x, levels[x.name])] if option))
    search = SplitSearch(replace(request, profile=with_recompute(request.profile, levels, restage=False)), math.inf)
    try:
        problem = search.problem(placement, counts)
        problem.check_feasible()
        if per_microbatch:
            problem, start = fewest(problem, validate=False)
        else:
            start = heuristic_start(problem)
    except InfeasibleError:
        return out
    out.objective = start.objective
    out.tight = ranks_at_cap(problem, start.timeline)
    return out


def ranks_at_cap(problem: Problem, timeline: Timeline) -> tuple[int, ...]:
    """The ranks at their cap: their room would not take one more microbatch of their heaviest chunk."""
    costs = problem.chunk_costs
    return tuple(r for r in range(problem.num_ranks)
                 if timeline.peak_memory(r) + max(costs[c].mem_B for c in problem.placement.chunks_on(r))
                 > problem.limit.per_rank[r])


def with_more(layers: Sequence[Layer], levels: dict[str, str], k: int) -> dict[str, str]:
    """`levels` with up to k more of these layers recomputed in full, the most bytes saved per unit of
    time first."""
    free = [(x, full) for x in layers if x.name not in levels for full in [option_of(x, "full")] if full is not None]
    free.sort(key=lambda pair: -(held_from_f(pair[0]) - pair[1].mem_B) / max(pair[1].time, 1e-12))
    return {**levels, **{x.name: "full" for x, _ in free[:k]}}


def steps_from(request: SplitRequest, current: Levels) -> list[dict[str, str]]:
    """The recompute choices one step away (search.py's docstring lists them)."""
    ranks = rank_layers(request, current.placement, current.counts)
    tight = list(current.tight)
    loose = [r for r in range(len(ranks)) if r not in tight]
    steps = []
    for k in STEPS:
        grown, shrunk = dict(current.levels), dict(current.levels)
        for r in tight:
            grown = with_more(ranks[r], grown, k)
        for r in loose:
            shrunk = with_fewer(ranks[r], shrunk, k)
        steps += [grown, shrunk]
    steps += [with_more(ranks[r], current.levels, 1) for r in tight] if len(tight) > 1 else []
    steps += [with_fewer(ranks[r], current.levels, 1) for r in loose] if len(loose) > 1 else []
    return _distinct(steps, current)


def give_back_steps(request: SplitRequest, current: Levels) -> list[dict[str, str]]:
    """The recompute of STEPS[-1] layers given back on one rank at its cap: it may still hold all the
    microbatches its schedule wants there (1F1B's last rank holds one), and less recompute frees time to take
    layers (walk tries these where no other step helps)."""
    ranks = rank_layers(request, current.placement, current.counts)
    return _distinct([with_fewer(ranks[r], current.levels, STEPS[-1]) for r in current.tight], current)


def _distinct(steps: list[dict[str, str]], current: Levels) -> list[dict[str, str]]:
    return [s for s in {tuple(sorted(s.items())): s for s in steps}.values() if s != current.levels]


def with_fewer(layers: Sequence[Layer], levels: dict[str, str], k: int) -> dict[str, str]:
    """`levels` with the recompute of up to k of these layers given back, the last of them first."""
    mine = [x.name for x in layers if x.name in levels][-k:] if k else []
    return {name: level for name, level in levels.items() if name not in mine}


def walk(request: SplitRequest, start: Levels, deadline: float, per_microbatch: bool, budget: Budget) -> Levels:
    """From `start`, take the best step that lowers the objective (or keeps it and recomputes less), then
    improve the split for the new levels (its bounds capped by `budget`), until no step helps or the
    deadline passes."""
    best = start
    while time.monotonic() < deadline:
        found = _scored(request, steps_from(request, best), best, deadline, per_microbatch)
        step = min(found, key=lambda x: x.order_key, default=None)
        if step is None:
            return best
        if not step.beats(best):  # then a rank at its cap may give recompute back at no cost
            step = _best_beating(_scored(request, give_back_steps(request, best), best, deadline, per_microbatch),
                                 best) or step
        if step.beats(best):
            best = resplit(request, step, deadline, per_microbatch, budget)
            continue
        # On this split no step helps; where memory forced the split, one does once the split moves.
        moved = (resplit(request, x, deadline, per_microbatch, budget)
                 for x in sorted(found, key=lambda x: x.order_key)[:RESPLIT_TRIES])
        better = next((x for x in moved if x.beats(best)), None)
        if better is None:
            return best
        best = better
    return best


def _scored(request: SplitRequest, steps: list[dict[str, str]], current: Levels, deadline: float,
            per_microbatch: bool) -> list[Levels]:
    return [evaluate(request, levels, current.placement, current.counts, per_microbatch)
            for levels in steps if time.monotonic() < deadline]


def _best_beating(found: list[Levels], current: Levels) -> Levels | None:
    best = min(found, key=lambda x: x.order_key, default=None)
    return best if best is not None and best.beats(current) else None


def resplit(request: SplitRequest, current: Levels, deadline: float, per_microbatch: bool,
             budget: Budget) -> Levels:
    """The split improved for `current`'s levels by the joint search's one-layer moves (a named split,
    even, balanced or fixed:..., stays as named)."""
    if request.rule.strip().lower() != "auto":
        return current
    profile = with_recompute(request.profile, current.levels, restage=False)
    search = SplitSearch(replace(request, profile=profile), deadline, budget)
    entry = search.score(current.placement, current.counts, "recompute")
    moved = improve_split(search, entry, deadline)
    if moved.counts == current.counts or not moved.objective < current.objective:
        return current
    return evaluate(request, current.levels, moved.placement, moved.counts, per_microbatch)


def all_full(request: SplitRequest) -> dict[str, str]:
    """Every layer that lists it recomputed in full (the Megatron and torchtitan habit)."""
    layers = request.profile.layers or ()
    return with_more(layers, {}, len(layers))
