"""One rank on its own, as bounds/rank_sequence.py walks it: a chain of steps (a pass each, the same for every
microbatch), the microbatch count and the rank's memory limit. A module of its own so that the walk in
Python (bounds/rank_sequence.py) and the one in numpy (bounds/chain_walk.py) both read it without a circle."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One pass of the rank's chain, the same for every microbatch: its duration, the memory it takes
    at its start (alloc) and gives back at its end (free), and the step of the same microbatch it
    follows (`after`, an index into the chain; None for the first), `lag` after that pass's start at
    the earliest (None: once that pass has ended, which on one machine is whenever it has run)."""

    duration: float
    alloc: float
    free: float
    after: int | None = None
    lag: float | None = None


@dataclass(frozen=True)
class RankChain:
    """A rank's chain of steps (each step after the one it names), the microbatch count and the
    rank's memory limit (inf for none)."""

    steps: tuple[Step, ...]
    m: int
    cap: float

    def round_trip(self) -> float:
        """From the first step's start to the end of the last lagged step, along the lags."""
        at = [0.0] * len(self.steps)
        last = 0
        for k, step in enumerate(self.steps):
            if step.after is not None and step.lag is not None:
                at[k], last = at[step.after] + step.lag, k
        return at[last] + self.steps[last].duration

    def room_in_trips(self) -> float:
        """How many round trips' worth of its passes the limit holds: the walk's size grows with it
        (inf where nothing is held or there is no trip; nan for a chain of zero-length passes)."""
        held = sum(step.alloc for step in self.steps)
        in_flight = self.cap / held if held > 0 else math.inf
        trip = self.round_trip()
        return in_flight * sum(step.duration for step in self.steps) / trip if trip > 0 else math.inf


@dataclass(frozen=True)
class RankPasses:
    """One chunk's forward, backward and weight pass: durations, memory taken at the start (alloc) and
    given back at the end (free) of each; the lag from a forward's start to its backward's start; the
    microbatch count and the rank's memory limit (inf for none)."""

    F: float
    B: float
    W: float
    alloc: tuple[float, float, float]
    free: tuple[float, float, float]
    lag: float
    m: int
    cap: float

    def chain(self) -> RankChain:
        (af, ab, aw), (ff, fb, fw) = self.alloc, self.free
        return RankChain((Step(self.F, af, ff), Step(self.B, ab, fb, 0, self.lag), Step(self.W, aw, fw, 1)),
                         self.m, self.cap)
