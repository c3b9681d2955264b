"""The pair phase of solve(): where memory binds on a small problem, the bound with two ranks kept whole.

Under a tight limit the analytic bound (bounds/analytic.py) lets every microbatch's round trip through the
other ranks take its shortest path, and stood 6-13% below proven optima there (results/capped_optimum.md);
keeping rank 0 and one other rank whole (exact/rank_subset.py) closed that to 0-2% where CP-SAT proved the
pair within a minute (results/capped_pair_bound.md). It only pays on small problems: past a few hundred
passes CP-SAT proves less on a pair than the analytic bound already says. So it runs only there, before
the grid model, for the budget's `pair_share` of the time limit, and what it proves is the lower bound the
grid rounds start from (a start it proves optimal skips them).

Pairs go in the order that bound best on those instances: rank 0 with the deepest rank (the V-shape's
turn), then with its neighbour, then with the others, each an equal share of the time left.

Each pair runs on the grid of the solver's coarse rounds (the options' resolution: 20-40 units in the
shortest pass, durations rounded down: still a bound). On the grid exact for times rounded to 100 us, no
pair of results/capped_pair_bound.md's rows was proven in its 2-3 s, and the one row it had raised fell
back to the analytic bound.
"""

from __future__ import annotations

import math
import time

from ..exact.rank_subset import SubsetBound, applies, subset_bound
from ..options import SearchOptions
from ..problem import Problem
from .report import PairBound

# Above this many passes the pair's model is left out (results/capped_pair_bound.md: at p=3, m=9, 162
# passes, CP-SAT had not proven a pair in 60 s; at p=8, m=32 it proved less than the analytic bound; in
# solve at 30 s, the one pair proven was at p=4, m=8, 192 passes, and none at p=4, m=12, 288).
PAIR_MAX_PASSES = 200
# A pair is not started with less than this many seconds for it (a model's build and presolve).
MIN_PAIR_SECONDS = 0.5


def worth_a_pair(problem: Problem, incumbent: float, lower: float) -> bool:
    """Whether the phase runs: a bound the pair model holds for (exact/rank_subset.applies), a limit on
    some rank, three ranks or more (two kept of two is the grid model itself), few enough passes, and a
    gap left."""
    return applies(problem) and problem.num_ranks >= 3 and len(problem.passes) <= PAIR_MAX_PASSES \
        and not problem.limit.unlimited and lower < incumbent * (1 - 1e-12)


def pair_order(p: int) -> list[int]:
    """The rank kept with rank 0 in each pair, in the order tried (see the module)."""
    return [p - 1, 1] + list(range(2, p - 1))


def pair_bound(problem: Problem, incumbent: float, lower: float, options: SearchOptions,
               until: float = math.inf) -> PairBound | None:
    """The phase (see the module) for the budget's pair_share of the time limit, not past `until`
    (time.monotonic()); None where it does not run."""
    if not worth_a_pair(problem, incumbent, lower):
        return None
    t0 = time.monotonic()
    deadline = min(t0 + options.budget.pair_share * options.time_limit, until)
    order = pair_order(problem.num_ranks)
    best: SubsetBound | None = None
    tried = 0
    for k, r in enumerate(order):
        share = (deadline - time.monotonic()) / (len(order) - k)
        if share < MIN_PAIR_SECONDS:
            break
        found = subset_bound(problem, (0, r), share, workers=options.workers, seed=int(options.seed),
                             resolution=options.resolution)
        tried += 1
        if best is None or found.value > best.value:
            best = found
        if best.value >= incumbent * (1 - 1e-12):
            break  # the start is proven optimal
    if best is None:
        return None
    return PairBound(best.value, best.kept, best.proven, tried, time.monotonic() - t0)
