"""Per-rank tuning of the list greedy: each rank gets its own in-flight cap, B-or-F preference and
W policy (greedy_options.RankPolicy), chosen by an iterated local search over the engine's own timing.

Why: on pipelines whose stages differ in time or memory, the rank that sets the objective wants other
choices than its neighbours. On random heterogeneous pipelines at 0.75p the memory-bound first rank is
best off running each W right after its B (that frees the memory its next forward needs), while the
ranks after it fill gaps with W; no single variant of greedy_variants does both. On hetero-random #12
(bench/solve_bench.py) the tuned start was 4.2% shorter than the best uniform variant, found in about a
second, and CP-SAT from it reached in 30 s what it reached in 300 s from the uniform start.

The search: start from the best uniform list variants, then change one rank's choice at a time (its cap
by -2..+2, its preference, its W policy), keeping any change that shortens the objective, until none
does; then perturb a few ranks of the best at random and search again, while time and evaluations
last. Each evaluation is one run of the list engine, the simulator's own timing, so whatever it keeps
is exactly as good as it says; solve() still validates the winner.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace
from typing import Iterator

from ...core.ir import Placement
from ...core.objective import Objective
from ..problem import Problem
from .list_engine import ListEngine, fused_helps
from .options import CannotFit, EngineResult, GreedyOptions, RankPolicy, WMode

W_MODES: tuple[WMode, ...] = ("fill", "fit", "eager")
CAP_STEPS = (-2, -1, 1, 2)
Key = tuple[float, float]  # (objective, tie-break): see _Search.cost
# Perturbation rounds without a new best before the search stops early.
PATIENCE = 12


@dataclass
class Tuned:
    """The best per-rank variant found: its options, the engine's result and objective."""

    options: GreedyOptions
    result: EngineResult
    cost: float
    found_at: int  # the evaluation that found it (engine runs, counting from 1)
    key: Key = (math.inf, math.inf)


def w_modes(problem: Problem) -> tuple[WMode, ...]:
    """The W policies a rank may take: fused backwards too where they may fit when B and W apart do not
    (list_engine.fused_helps)."""
    return W_MODES + (("fused",) if fused_helps(problem) else ())


def uniform_starts(placement: Placement, base: GreedyOptions, modes: tuple[WMode, ...] = W_MODES
                   ) -> list[GreedyOptions]:
    """The list engine's uniform variants as per-rank policies: caps of 1x and 2x 1F1B's depth and
    memory only, each with B or F first and each W policy of `modes`."""
    p = placement.num_ranks
    # Where a route first enters each rank: 1F1B's depth there is p minus that position.
    entry = [min((j for route in placement.routes for j, c in enumerate(route) if placement.chunk_to_rank[c] == r),
                 default=0) for r in range(p)]
    out = []
    for warmup in (1, 2, None):
        for b_first in (False, True):
            for w_mode in modes:
                plain = replace(base, warmup=warmup, b_first=b_first, w_fill=w_mode == "fill", ranks=None)
                out.append(replace(base, ranks=tuple(
                    replace(plain.policy(r, entry[r], p), w_mode=w_mode) for r in range(p))))
    return out


def neighbours(ranks: tuple[RankPolicy, ...], r: int, modes: tuple[WMode, ...] = W_MODES
               ) -> Iterator[tuple[RankPolicy, ...]]:
    """Every policy list that differs from `ranks` in one choice of rank r (its W policy among `modes`)."""
    here = ranks[r]
    changed: list[RankPolicy] = []
    if here.inflight is not None:
        changed += [replace(here, inflight=here.inflight + d) for d in CAP_STEPS if here.inflight + d >= 1]
    changed.append(replace(here, b_first=not here.b_first))
    changed += [replace(here, w_mode=w) for w in modes if w != here.w_mode]
    for policy in changed:
        yield ranks[:r] + (policy,) + ranks[r + 1:]


class _Search:
    """The evaluations of one tuning run, against a deadline and an evaluation budget."""

    def __init__(self, problem: Problem, deadline: float, max_evaluations: int) -> None:
        self.problem = problem
        self.objective, self.deadline, self.max_evaluations = problem.objective, deadline, max_evaluations
        self.evaluations = 0
        self.best: Tuned | None = None
        self.modes = w_modes(problem)

    def spent(self) -> bool:
        return self.evaluations >= self.max_evaluations or time.monotonic() >= self.deadline

    def cost(self, options: GreedyOptions) -> Key:
        """The objective of the list engine with these options, then (ties) the ranks' summed spans
        (summed ends for the makespan): one rank sets the objective, and without the tie-break a change
        that shortens the others looks like no change at all."""
        self.evaluations += 1
        try:
            result = ListEngine(self.problem, options).run()
        except CannotFit:
            return (math.inf, math.inf)
        if self.objective is Objective.MAKESPAN:
            key = (result.cost(Objective.MAKESPAN), sum(result.last_end))
        else:
            key = (result.cost(Objective.SPAN), sum(e - s for s, e in zip(result.first_start, result.last_end)))
        if self.best is None or better(key, self.best.key):
            self.best = Tuned(options, result, key[0], self.evaluations, key)
        return key

    def descend(self, options: GreedyOptions, key: Key) -> None:
        """First-improvement descent over one rank's choice at a time, until no single change helps."""
        assert options.ranks is not None
        improved = True
        while improved and not self.spent():
            improved = False
            for r in range(len(options.ranks)):
                for ranks in neighbours(options.ranks, r, self.modes):
                    if self.spent():
                        return
                    trial = replace(options, ranks=ranks)
                    k = self.cost(trial)
                    if better(k, key):
                        options, key, improved = trial, k, True
                        break


def better(a: Key, b: Key) -> bool:
    """Whether key a beats key b: a shorter objective, or the same and a smaller tie-break."""
    return a[0] < b[0] * (1 - 1e-12) or (a[0] <= b[0] * (1 + 1e-12) and a[1] < b[1] * (1 - 1e-12))


def tune(problem: Problem, *, base: GreedyOptions = GreedyOptions("list"), deadline: float = math.inf,
         max_evaluations: int = 2000, seed: int = 0) -> Tuned | None:
    """The best per-rank list greedy found before `deadline` (time.monotonic()) and within
    `max_evaluations` engine runs; None when no start fits the limit. `base` carries the placement's
    fixed switches (pairs, by_route). The same arguments give the same answer unless the deadline cuts
    the search short."""
    search = _Search(problem, deadline, max_evaluations)
    uniform = uniform_starts(problem.placement, base, search.modes)
    starts = sorted(((search.cost(o), k, o) for k, o in enumerate(uniform)), key=lambda t: (t[0], t[1]))
    if search.best is None:
        return None
    rng = random.Random(seed)
    search.descend(starts[0][2], starts[0][0])
    stale = 0
    while not search.spent() and stale < PATIENCE:
        before = search.best.key
        search.descend(*_perturbed(search.best.options, rng, search))
        stale = stale + 1 if not better(search.best.key, before) else 0
    return search.best


def _perturbed(options: GreedyOptions, rng: random.Random, search: _Search) -> tuple[GreedyOptions, Key]:
    """Two to four random changes to the best policies, and their cost."""
    assert options.ranks is not None
    ranks = options.ranks
    for _ in range(rng.randint(2, 4)):
        r = rng.randrange(len(ranks))
        ranks = rng.choice(list(neighbours(ranks, r, search.modes)))
    trial = replace(options, ranks=ranks)
    return trial, search.cost(trial)
