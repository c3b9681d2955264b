"""What every search is given besides its problem: one record in place of the time limit, workers, seed,
grid resolution, progress callback and Budget each entry point used to take one by one.

Each phase reads its share of the time limit and its state caps from `budget` (search/budget.py); a
search over several problems hands each one the same options with its own time (`with_time`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from .budget import BUDGET, Budget


@dataclass(frozen=True)
class Progress:
    """One progress event: elapsed seconds, the incumbent and the bound in the profile's time unit."""

    elapsed: float
    incumbent: float
    bound: float
    phase: str


@dataclass(frozen=True)
class SearchOptions:
    """`time_limit` in seconds; `workers` and `seed`: CP-SAT's; `resolution`: the first grid's units in the
    shortest pass (solve/grid.py); `progress`: told of each better incumbent or bound; `budget`: how the
    time is shared between phases and how many states a walk may expand."""

    time_limit: float = 30.0
    workers: int = 2
    seed: int = 0
    resolution: int = 20
    progress: Callable[[Progress], None] | None = None
    budget: Budget = BUDGET

    def with_time(self, seconds: float) -> SearchOptions:
        """The same options with `seconds` (none below zero: a share computed late may be negative).

        >>> shorter = SearchOptions(workers=4).with_time(-1.0)
        >>> shorter.time_limit, shorter.workers
        (0.0, 4)
        """
        return replace(self, time_limit=max(seconds, 0.0))

    def until(self, share: float) -> float:
        """The time.monotonic() at which a phase given `share` of the time limit from now must stop."""
        return time.monotonic() + share * self.time_limit

    def tell(self, elapsed: float, incumbent: float, bound: float, phase: str) -> None:
        """Report progress, where someone listens."""
        if self.progress is not None:
            self.progress(Progress(elapsed, incumbent, bound, phase))
