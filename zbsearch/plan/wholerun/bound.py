"""The pipeline's lower bound over every split, placement, schedule and recompute choice of a shape, without
solving: the joint search's own cheap bound (search/partition/bounds.py: the DPs over splits of the rank
bounds of rank_bound.py, cut short at a deadline still a bound over every split), on the layers at their
least time and least memory over every recompute option where recompute is searched
(search/recompute/search.py's `least_memory`, as the recompute search bounds every choice), under the
request's memory limit; the least over the request's placements. Infinite when no split fits one
microbatch; `least_need` then says what memory the best split would need.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from ...core.placement import parse_placement
from ...core.profile import Profile
from ...core.recompute.levels import held_from_f
from ...profiling.partition import linear_partition
from ...search.budget import BUDGET, Budget
from ...search.entry.request import SEARCHED_RECOMPUTE, planned_profile
from ...search.partition.bounds import cheap_bound
from ...search.partition.enumerate import bound_input
from ...search.recompute.search import least_memory
from .cost import ShapeCosts


def bound_profile(costs: ShapeCosts) -> Profile:
    """The profile the bound reads: the request's fixed recompute levels applied, or, where recompute is
    searched, every layer at its least memory (and its time as profiled, the least)."""
    planned = planned_profile(costs.profile, costs.request)
    if (costs.request.recompute or "").strip() in SEARCHED_RECOMPUTE:
        return replace(planned, layers=least_memory(planned.layers or ()))
    return planned


def placements(costs: ShapeCosts) -> tuple[str, ...]:
    """The placements the request lets the search use."""
    given = (costs.request.placement or "auto").strip().lower()
    return costs.request.auto_placements if given == "auto" else (given,)


def pipeline_bound(costs: ShapeCosts, seconds: float, budget: Budget = BUDGET) -> float:
    """The bound over every split of the shape's pipeline (see the module), in microseconds; at most about
    `seconds` spent (each placement's DP gets an equal share of what is left, and stops there); `budget`
    caps the interleaved relaxations' enumerations, as the search's."""
    profile, request, p = bound_profile(costs), costs.request, costs.shape.p
    deadline = time.monotonic() + seconds
    names = placements(costs)
    best = math.inf
    for k, name in enumerate(names):
        placement = parse_placement(name, p)
        data = bound_input(profile, placement, request.mem_limit, request.objective, request.headroom, budget)
        share = time.monotonic() + max(0.0, deadline - time.monotonic()) / (len(names) - k)
        value, _ = cheap_bound(data, share)
        best = min(best, value)
    return best


def least_need(costs: ShapeCosts) -> tuple[float, tuple[int, ...]]:
    """The least bytes per GPU that static bytes and one microbatch's activations take on the best split of
    the layers over p stages (each layer at its least memory where recompute is searched; its gather
    buffer counted whole), and that split: a min-max split, exact (profiling.partition.linear_partition)."""
    layers = bound_profile(costs).layers or ()
    per_layer = [layer.static_bytes + layer.gather_bytes + held_from_f(layer) for layer in layers]
    p = min(costs.shape.p, len(per_layer))
    counts = linear_partition(per_layer, p)
    edges = [0]
    for c in counts:
        edges.append(edges[-1] + c)
    return max(math.fsum(per_layer[a:b]) for a, b in zip(edges, edges[1:])), tuple(counts)
