"""The joint search's last step: the full solver (CP-SAT, then its windows) on the best splits it scored.

It polishes the best split by its best start and, of those whose start comes within NEAR of it, the one of
least own bound (with none near, the runner-up), each for a time in proportion to what it could still gain
(its start's distance to its own bound), from its best start. A later split whose bound (the one solve()
starts from, taken first and handed to it: about 0.2 s at p=8, m=32) cannot beat the plan in hand is not
solved: its time goes on solving the best split further from that plan (driver.go_on). On issue 39's example
(p=8, m=32, 120 s) the runner-up was a linear split 5.8% behind the V one whose bound (3,067,682 us) the V
plan had passed (3,031,491-3,053,283): its 20 s took it to 3,240,182, and now go to the V split.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol, Sequence

from ...core.ir import Placement
from ..options import SearchOptions
from ..solve.driver import ProblemBounds, go_on, problem_bounds, solve
from ..solve.report import SolveResult
from ..solve.starts import Starts
from .scored import Scored

# How many of the best splits the solver polishes.
POLISH = 2
# The splits after the best that may be polished: those whose heuristic schedule is within this
# share of the best's (the first NEAR_CANDIDATES by heuristic), least own bound first.
NEAR = 0.02
NEAR_CANDIDATES = 40
# A polish given less time than this starts from the split's heuristic schedule as it is: its better starts
# would have no time to run; nor is a plan solved further with less.
MIN_POLISH_SECONDS = 1.0


class Bounded(Protocol):
    """What the polish asks of the split search: each split's own bound (SplitSearch.leaf_bound), and where
    to keep what solving a split proved."""

    proven: dict[tuple[str, tuple[int, ...]], float]

    def leaf_bound(self, placement: Placement, chains: bool = False) -> Callable[[tuple[int, ...]], float]: ...


def to_polish(search: Bounded, ranked: list[Scored]) -> list[Scored]:
    """The splits the solver polishes: the best by its heuristic schedule, then, among those whose
    heuristic comes within NEAR of it, the ones whose own bound is least. A split the heuristics
    rate a little worse can still be the better one to solve: the solver can take it down to its
    bound, and on gpt3-2.7b at 10 GiB the two best heuristic splits had the same bound (473.1 ms) and
    neither solved below 485.5 ms, while the fourth (486.5 ms, bound 468.6 ms) solves to 480.5 ms."""
    best = ranked[0]
    near = [s for s in ranked[1:NEAR_CANDIDATES] if s.found <= best.found * (1 + NEAR)]
    rest = sorted(near, key=lambda s: (search.leaf_bound(s.placement)(s.counts), s.found_key))
    return [best] + rest[:POLISH - 1] if rest else ranked[:POLISH]


def polish(search: Bounded, ranked: list[Scored], options: SearchOptions, end: float
           ) -> tuple[list[SolveResult], dict[int, str]]:
    """The solver's answers on the splits to_polish chooses, until `end` (time.monotonic()), and each
    answer's split origin (by id)."""
    chosen = to_polish(search, ranked)
    # Each split's time in proportion to how far its start is above its own bound: what the solver could
    # still gain there.
    room = [max(entry.found - search.leaf_bound(entry.placement)(entry.counts), 1e-9) for entry in chosen]
    solved: list[tuple[Scored, ProblemBounds, SolveResult]] = []
    for k, entry in enumerate(chosen):
        left = end - time.monotonic()
        if k > 0 and left <= 0:
            break  # the best is polished whatever the limit, the others only in the time left
        share = left * room[k] / sum(room[k:])
        assert entry.problem is not None and entry.start is not None
        bounds = problem_bounds(entry.problem, options.with_time(share))
        if solved and bounds.lower >= _best(solved)[2].objective:
            continue  # it cannot win: its time goes to the best plan below
        # With no time to improve it, the split's own heuristic start is the one to polish from.
        given = entry.starts if entry.starts is not None or share >= MIN_POLISH_SECONDS else Starts(entry.start)
        solved.append((entry, bounds, solve(entry.problem, options.with_time(share), given, bounds, entry.start)))
    left = end - time.monotonic()
    if left >= MIN_POLISH_SECONDS and len(solved) < len(chosen):
        best = _best(solved)
        entry, bounds, result = best
        solved[solved.index(best)] = (entry, bounds, go_on(result, options.with_time(left), bounds))
    for entry, _, result in solved:
        search.proven[(entry.placement.name, entry.counts)] = result.lower_bound
    return [result for _, _, result in solved], {id(result): entry.origin for entry, _, result in solved}


def _best(solved: Sequence[tuple[Scored, ProblemBounds, SolveResult]]) -> tuple[Scored, ProblemBounds, SolveResult]:
    return min(solved, key=lambda row: row[2].objective)
