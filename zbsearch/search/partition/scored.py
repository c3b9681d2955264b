"""One split on one placement as the partition search holds it: the best heuristic schedule of it (the
score the search moves by), and, on the splits the search names, the starts `solve` would give it.

`--partition NAME` solves one named split, and solve() starts CP-SAT from the heuristic start improved by
the tuned list greedy and, on chunked placements under a limit, the periodic schedule (solve/starts.py).
The joint search scores a split with the heuristic start alone (one heuristic run; the better starts take
seconds), so a named split it scored could rank below what `--partition NAME` starts from: under tight
caps on V the periodic start wins (issue 39: 3,048,356 us from it on the balanced split against a joint
plan of 3,177,731 us). The seeds get those starts too (`give_starts`), with the seconds `--partition NAME`
would give them; the search ranks and polishes splits by the best start found (`found_key`), and the
polish starts from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.ir import Placement
from ..problem import Problem
from ..solve.starts import Start, Starts, better_starts
from .report import rank_totals

# The splits `--partition` names: every placement's even and balanced seeds are scored and given the
# better starts whatever the time; the other seeds (rank-balanced, least-bound, memory-capped) while the
# search's scoring share lasts.
NAMED = ("even", "balanced")


@dataclass
class Scored:
    """One split on one placement, scored by its best heuristic schedule (`objective`, `peak`); `start`,
    that schedule; `starts`, on a split given them (give_starts), the start solve() would go on from."""

    placement: Placement
    counts: tuple[int, ...]
    origin: str
    objective: float = math.inf
    peak: float = math.inf  # the largest rank's static bytes + peak activations
    problem: Problem | None = None
    start: Start | None = None
    starts: Starts | None = None

    @property
    def key(self) -> tuple[float, float]:
        """The heuristic's objective and peak: what one-layer moves compare."""
        return self.objective, self.peak

    @property
    def found(self) -> float:
        """The best objective known on this split: its better starts' where it has them."""
        return self.starts.start.objective if self.starts is not None else self.objective

    @property
    def found_key(self) -> tuple[float, float]:
        """The best start's objective and peak: what the polish ranks by."""
        if self.starts is None or self.problem is None:
            return self.key
        return self.found, max(rank_totals(self.starts.start.timeline))


def give_starts(entry: Scored, lb: float, tune_seconds: float, periodic_seconds: float, seed: int,
                until: float = math.inf) -> None:
    """`entry`'s heuristic start improved as solve() improves it (starts.better_starts, `lb` its own bound),
    each search for its seconds and none past `until` (time.monotonic()); nothing where it was not scored."""
    if entry.problem is None or entry.start is None or entry.starts is not None:
        return
    entry.starts = better_starts(entry.problem, entry.start, lb, tune_seconds, periodic_seconds, seed, until)
