"""The memory rule of the chunked greedy engines (chunked, vshape): when one more forward
may run on a rank that holds several chunks of the route.

Levels come from zbsearch.sim.rank_state's `ChunkProgress.held`, the simulator's own rule, and are
compared with `fits`, as in the other engines.
"""

from __future__ import annotations

import math
from typing import Sequence

from ...sim.rank_state import ChunkProgress
from .options import fits


def level(chunks: Sequence[ChunkProgress], ks: Sequence[int]) -> float:
    """Activation memory held now on the rank holding route positions `ks`."""
    return sum(chunks[q].held() for q in ks)


def admits(chunks: Sequence[ChunkProgress], ks: Sequence[int], k: int, cap: float, freed: float = 0.0) -> bool:
    """Whether route position k's next F fits on the rank holding positions `ks` (route order) under
    `cap`, now or once `freed` more memory is free.

    Room stays for the remaining forwards here of the oldest microbatch in flight, so it can always
    finish them and the pipeline cannot jam on memory: its own F may use that room, any other F (a
    new microbatch above all) must leave it. The room may be lent out while microbatches that have run
    every forward of the route hold as much here: their backwards need no memory and will free it."""
    entered = chunks[ks[0]].forwards
    oldest = min((chunks[q].forwards for q in ks[1:]), default=entered)
    mine = chunks[k].forwards == oldest and (k != ks[0] or oldest >= entered)
    if oldest >= entered and k != ks[0]:
        oldest = entered      # nothing in flight owes a forward here
    need = sum(chunks[q].cost.mem_B for q in ks if chunks[q].forwards <= oldest)
    if mine:
        extra = need
    else:
        extra = chunks[k].cost.mem_B + max(0.0, need - freeable(chunks, ks))
    return fits(level(chunks, ks) - freed + extra, cap)


def freeable(chunks: Sequence[ChunkProgress], ks: Sequence[int]) -> float:
    """Memory on a rank held by microbatches that have run every forward of the route (their
    backwards and weight passes need no memory, so it will be freed)."""
    done = chunks[-1].forwards
    out = 0.0
    for q in ks:
        c = chunks[q]
        out += max(0, min(c.forwards, done) - c.backwards) * c.cost.mem_B + (c.backwards - c.weights) * c.cost.mem_W
    return out


def inflight_caps(chunks: list[ChunkProgress], hop: list[float], on_rank: list[list[int]], m: int,
                  factor: float) -> list[float]:
    """Per rank, `factor` times the microbatches it needs in flight to stay busy at the pipeline's
    pace: the round trip from its first chunk's F to that chunk's B (every pass and hop on the way
    down the route and back) over the busiest rank's work per microbatch."""
    n = len(chunks)
    tail = [0.0] * (n + 1)
    for k in range(n - 1, -1, -1):
        c = chunks[k].cost
        tail[k] = tail[k + 1] + c.F + c.B + (2 * hop[k] if k < n - 1 else 0.0)
    period = max(sum(chunks[k].cost.F + chunks[k].cost.B + chunks[k].cost.W for k in ks) for ks in on_rank)
    return [max(1.0, math.ceil(factor * tail[ks[0]] / period)) if period > 0 else math.inf for ks in on_rank]


class RouteArrivals:
    """When the inputs of a single-route engine's next passes arrive. The engine keeps `chunks` (one
    ChunkProgress per route position), `hop` (the hop after each position) and `m`."""

    chunks: Sequence[ChunkProgress]
    hop: Sequence[float]
    m: int

    def f_arrival(self, k: int) -> float | None:
        """When the input of position k's next F arrives; None if not known yet or none is left."""
        i = self.chunks[k].forwards
        if i >= self.m:
            return None
        if k == 0:
            return 0.0
        t = self.chunks[k - 1].f_end[i]
        return None if t < 0 else t + self.hop[k - 1]

    def b_arrival(self, k: int) -> float | None:
        """When the gradient for position k's next B arrives (no sooner than its own F ends)."""
        chunk = self.chunks[k]
        i = chunk.backwards
        if i >= chunk.forwards:
            return None
        if k == len(self.chunks) - 1:
            return chunk.f_end[i]
        t = self.chunks[k + 1].b_end[i]
        return None if t < 0 else max(chunk.f_end[i], t + self.hop[k])
