"""A rank's window contains every deeper rank's window, with the trip there and back.

Rank r starts with the forward of microbatch 0 on its first chunk of the route and ends after the
weight pass of the last microbatch there, which follows that chunk's last backward. Take a rank q
whose first chunk lies later on the route. Microbatch 0's forward reaches q's first chunk only after
the forwards in between (and the hops), and the last microbatch's gradient comes back from q's first
chunk to r's only after the backwards in between. In between, q runs from its own first forward to its
last backward (with passes of one kind on a chunk in microbatch order, as cpsat.add_symmetry_breaking
shows loses nothing, q's last backward is that of the last microbatch on its first chunk). So

    span(r) >= trip down from r to q + window(q) + trip back from q to r + r's weight pass,

where window(q) is at least q's forwards and backwards, and at least the least time rank q on its own
needs from its first forward to its last backward (rank_sequence.least_to_last_backward: the other ranks
only delay a microbatch, its memory limit holds). Under a tight limit that walk sees the waves: a rank
that holds only a few microbatches at once sends them round in groups, and every rank above it waits
for the last group. On the V-shape at 0.5p (hetero p=8, m=8, span) the one-rank bounds stop at 3,700
and this one reaches 4,398, the best schedule found.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from ...core.ir import Action, Kind
from ..budget import BUDGET, Budget, past
from ..problem import Pass, Problem, longest_from
from .rank_chain import RankChain
from .rank_sequence import least_to_last_backward

# The walks' state caps are the budget's (budget.py): `nesting_walk_states` for each rank but the
# deepest; a chain of several chunks whose limit holds more than about one round trip of its passes runs
# out of it, and then so do the ranks with more room: the walks go from the tightest rank up and stop at
# the first that runs out. The deepest rank (the V-shape's turn, the last stage) is walked first and with
# more (`deepest_walk_states`, or `deepest_one_chunk_states` for one chunk, walked a state at a time in
# Python with no deadline): its window sits inside every other rank's, the longest trips around it. On
# the V-shape at 0.5p (hetero p=8) its walk needs about 2,000 states per microbatch and lifts the bound by
# 5-7%. On the paper's V-shape at 1p it proves the greedy start optimal (solve_bench v-large; its walk,
# bounds/chain_walk.py with the turn's twin passes pooled: 0.1 s at p=16, m=48, 1.4 s at p=32, m=96, about 5 s
# at p=32, m=256), so it gets what the caller's deadline allows, else `deepest_seconds`.
# A chain whose limit holds more than DEEPEST_ROOM round trips is not walked: memory hardly holds it
# back, and on a GPT-3-2.7B-like V split (17.9 round trips, chunks of unequal cost, so no twins) the walk
# took 22 s and raised nothing. The paper's V at 1p holds 2.4-2.5; the hetero V rows at 1p, 3.1.
DEEPEST_ROOM = 4.0


def nested_spans(problem: Problem, first_mb: Sequence[Pass], chains: Sequence[RankChain | None],
                 deadline: float | None = None, budget: Budget = BUDGET) -> list[float]:
    """Per rank, the bound above over every deeper rank (0 where there is none). `first_mb`: microbatch
    0's passes in dependency order; `chains[q]`: rank q on its own (bounds._alone), None where its
    chunks are not on one route; `deadline` (time.monotonic()): when the deepest rank's walk gives up
    (default: the budget's deepest_seconds from now); `budget`: the walks' state caps."""
    pl, m = problem.placement, problem.num_microbatches
    if len(pl.routes) != 1:
        return [0.0] * problem.num_ranks
    route = pl.routes[0]
    lead: dict[int, int] = {}  # rank -> its first chunk on the route
    for c in route:
        lead.setdefault(pl.chunk_to_rank[c], c)
    by_action = {ps.action: ps for ps in first_mb}
    position = {c: k for k, c in enumerate(route)}
    deepest = max(lead, key=lambda q: position[lead[q]])
    windows = _windows(chains, by_action, lead, m, deepest,
                       time.monotonic() + budget.deepest_seconds if deadline is None else deadline, budget,
                       deadline is not None)
    # Longest paths from the start of each rank's first forward and of its first chunk's backward
    # (microbatch 0's: every microbatch costs the same).
    down = {q: longest_from(first_mb, Action(c, Kind.F, 0)) for q, c in lead.items()}
    back = {q: longest_from(first_mb, Action(c, Kind.B, 0)) for q, c in lead.items()}
    out = [0.0] * problem.num_ranks
    for r, cr in lead.items():
        for q, cq in lead.items():
            if position[cq] <= position[cr]:
                continue
            f, b = by_action[Action(cq, Kind.F, 0)], by_action[Action(cq, Kind.B, 0)]
            there = down[r][f.action] - f.duration
            home = back[q][Action(cr, Kind.B, 0)] - b.duration
            out[r] = max(out[r], there + windows[q] + home + by_action[Action(cr, Kind.W, 0)].duration)
    return out


def _windows(chains: Sequence[RankChain | None], by_action: dict[Action, Pass], lead: dict[int, int],
             m: int, deepest: int, deadline: float, budget: Budget, binding: bool = True) -> dict[int, float]:
    """Per rank, a lower bound on the time from its first forward to its last backward; with `binding` (the
    caller's deadline), no walk starts past `deadline`, else only the deepest rank's stops there."""
    out = {q: m * sum(ps.duration for ps in by_action.values() if ps.rank == q and ps.action.kind is not Kind.W)
           for q in lead}
    # Without a limit nothing holds a rank back and the walk has no end of states: those are skipped.
    walkable = {q: chain for q, chain in enumerate(chains) if chain is not None}
    rooms = {q: room for q, chain in walkable.items() if (room := chain.room_in_trips()) < math.inf}
    # Past the deadline no walk starts (a bound without them still holds): a solve given no time left
    # spent 2 s here at p=8, m=128 (`python bench/time_limit.py`).
    if binding and past(deadline):
        return out
    if deepest in rooms and (rooms[deepest] <= DEEPEST_ROOM or len(walkable[deepest].steps) <= 3):
        chain = walkable[deepest]
        states = budget.deepest_walk_states if len(chain.steps) > 3 else budget.deepest_one_chunk_states
        found = least_to_last_backward(chain, states, deadline)
        out[deepest] = max(out[deepest], found or 0.0)
    for q in sorted(rooms, key=lambda q: (rooms[q], q)):
        if q == deepest:
            continue
        if binding and past(deadline):
            break
        found = least_to_last_backward(walkable[q], budget.nesting_walk_states)
        if found is None:
            break  # out of budget (or nothing fits): the ranks with more room would be too
        out[q] = max(out[q], found)
    return out
