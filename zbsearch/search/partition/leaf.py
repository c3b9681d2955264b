"""A split's own analytic bound (bounds/analytic.py), kept rank by rank, for the walk over every split.

The walk (partition/enumerate.py) bounds thousands of splits, and most of them share most of their ranks:
on llama3-8b at p=8 under 49 GiB the V walk bounded 2,187 splits holding 148 distinct ranks (a rank
and its chunks' layer ranges). A rank's bound reads only its own chunks (their layers' times and
bytes, its static bytes and so its room) and the paths from its chunks' forwards to their own
backwards and from microbatch 0's start: the sums of the layers before and after its chunks on the
route and one hop per rank crossing, however the other ranks split those layers. That holds while
every hop costs the same (hops do not depend on where the cuts fall) and no pass time is relaxed chunk
by chunk along a path (an F&B pair time); with one route. Then a split whose ranks were all seen
costs a lookup, and the split's bound is the largest of its ranks' bounds, the same number the whole
problem gives. Otherwise each split is bounded from its whole problem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ...core.errors import InfeasibleError
from ...core.ir import Placement
from ...core.memory import ranks_short
from ...core.profile import Profile
from ..bounds.analytic import in_chain_reach, objective_bound, rank_bounds
from ..budget import BUDGET, Budget
from ..problem import Problem
from ..bounds.relaxations import bound_passes

RankKey = tuple[str, int, int, tuple[tuple[int, int], ...]]



@dataclass
class _Rank:
    plain: float  # without the walk over the rank's chain of chunks
    walked: float | None = None  # with it; None: not walked yet


def hops_uniform(profile: Profile) -> bool:
    """Whether every hop between ranks costs the same wherever the layers are cut."""
    layers = profile.layers or ()
    if profile.message_time(0.0) is None:
        return True  # the profile's comm per link, whatever the split
    return len({profile.message_time(layer.out_bytes) for layer in layers[:-1]}) <= 1


class RankCache:
    """Splits' own bounds from their ranks' bounds, each rank bounded once (see the module's docstring).
    `build` makes the problem of a split (placement, layers per chunk in route order); `budget` caps the
    walks (its split_rank_walk_states for chains of chunks)."""

    def __init__(self, profile: Profile, build: Callable[[Placement, Sequence[int]], Problem],
                 budget: Budget = BUDGET) -> None:
        self.build = build
        self.budget = budget
        self.exact = hops_uniform(profile)
        self.ranks: dict[RankKey, _Rank] = {}

    def bound(self, placement: Placement, counts: Sequence[int], chains: bool) -> float:
        """The split's own bound; inf when no schedule of it fits the limit. `chains`: with the walk over
        the chains of the ranks that come within CHAIN_REACH of the largest (bounds.rank_bounds)."""
        keys = _rank_keys(placement, counts) if self.exact and len(placement.routes) == 1 else None
        if keys is not None:
            known = [entry for entry in map(self.ranks.get, keys) if entry is not None]
            value = _combine(known, chains) if len(known) == len(keys) else None
            if value is not None:
                return value
        return self._bound_whole(placement, counts, chains, keys)

    def _bound_whole(self, placement: Placement, counts: Sequence[int], chains: bool,
                     keys: list[RankKey] | None) -> float:
        try:
            problem = self.build(placement, counts)
        except InfeasibleError:
            return math.inf
        if problem.profile.gives_overlap:
            self.exact, keys = False, None
        short = ranks_short(problem.profile, problem.placement, problem.limit)
        if any(short):
            for k, is_short in zip(keys or (), short):
                if is_short:  # this rank cannot hold one microbatch, in any split
                    self.ranks[k] = _Rank(math.inf, math.inf)
            return math.inf
        several = chains and placement.num_chunks > placement.num_ranks  # one chunk: walked in both
        # Without the nesting: its walks cost the split walk more splits than it raised (partition
        # study: the V bound over every split fell on llama3-8b p=4 61 GiB and deepseek 42 GiB).
        bounds = rank_bounds(problem, bound_passes(problem), chains=several, nesting=False, budget=self.budget,
                             chain_states=self.budget.split_rank_walk_states)
        # A rank holding several chunks gets `sequence` from the chain walk alone (bounds._with_chains), so
        # without it, it is the bound the walk started from: one call gives both.
        plain = [objective_bound([replace(b, sequence=0.0) if several and len(placement.chunks_on(b.rank)) > 1 else b],
                                 problem.objective) for b in bounds]
        walked = [objective_bound([b], problem.objective) for b in bounds] if several else None
        if keys is None:
            return max(walked or plain)
        top = max(plain)
        for r, k in enumerate(keys):
            entry = self.ranks.setdefault(k, _Rank(plain[r]))
            if walked is not None and in_chain_reach(plain[r], top):
                entry.walked = walked[r]  # the rank rank_bounds walked in this split
            elif chains and not several:
                entry.walked = plain[r]
        value = _combine([self.ranks[k] for k in keys], chains)
        assert value is not None  # every rank within reach of this split's largest was walked above
        return value


def _combine(ranks: Sequence[_Rank], chains: bool) -> float | None:
    """The split's bound from its ranks' entries; None where a rank the walk would reach (within
    CHAIN_REACH of the largest) has not been walked yet."""
    if not chains:
        return max(k.plain for k in ranks)
    top = max(k.plain for k in ranks)
    if any(k.walked is None and in_chain_reach(k.plain, top) for k in ranks):
        return None
    return max(k.plain if k.walked is None else k.walked for k in ranks)


def _rank_keys(placement: Placement, counts: Sequence[int]) -> list[RankKey]:
    """Per rank: the placement, the rank and the layer range of each of its chunks, in route order."""
    edges = [0]
    for c in counts:
        edges.append(edges[-1] + c)
    position = {c: k for k, c in enumerate(placement.routes[0])}

    def ranges(r: int) -> tuple[tuple[int, int], ...]:
        ordered = sorted(placement.chunks_on(r), key=position.__getitem__)
        return tuple((edges[position[c]], edges[position[c] + 1]) for c in ordered)

    return [(placement.name, placement.num_chunks, r, ranges(r)) for r in range(placement.num_ranks)]
