"""The passes a lower bound reads: the problem's own, relaxed so that a bound on them also holds for
schedules that fuse a backward or overlap an F with a B (which the solver's split model never writes
but the simulator times).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ...core.ir import Kind
from ...core.stage_cost import StageCost
from ..problem import Pass, Problem


def overlap_relaxation(problem: Problem, passes: Sequence[Pass] | None = None) -> tuple[Pass, ...]:
    """The passes at their shortest when the profile gives an F&B pair time: each pass takes its own
    time times its chunk's overlap ratio (what it costs inside a pair). A relaxation: in any schedule,
    lay out each pair as its F then its backward (B, then W for a full one) at those times inside the
    pair's interval; every pass ends no later than the pair, so inputs still arrive in time, memory is
    allocated no earlier and freed no later. Bounds on these passes hold for schedules with pairs."""
    ratio = [cost.overlap_ratio for cost in problem.chunk_costs]
    return tuple(replace(ps, duration=ps.duration * ratio[ps.action.chunk])
                 for ps in (passes if passes is not None else problem.passes))


def fusion_saves(costs: Sequence[StageCost]) -> bool:
    """Whether a fused backward can beat its B and W run apart on some chunk: it costs less than the two
    (an action overhead paid once instead of twice, a measured full backward below B + W), or holds
    less (torch's split backward keeps more after I than a fused backward, mem_W > mem_B, and on the loss
    chunk keeps some of it until the iteration ends, mem_kept). `costs`: the problem's chunk costs."""
    return any(c.BW < (c.B + c.W) * (1 - 1e-12) or c.mem_W > c.mem_B or (c.mem_kept or 0.0) > 0 for c in costs)


def fusion_saves_time(costs: Sequence[StageCost]) -> bool:
    """Whether a fused backward costs less time than its B and W apart on some chunk (fusion_saves' time
    half): the CP-SAT model fuses a backward only at B + W, so only then does it miss fused schedules."""
    return any(c.BW < (c.B + c.W) * (1 - 1e-12) for c in costs)


def fusion_relaxation(problem: Problem, passes: Sequence[Pass] | None = None) -> tuple[Pass, ...]:
    """The passes at their shortest and lightest when a backward may be fused: each W takes the least
    of its own time and what a fused backward leaves after its B (full backward - B), and holds no more
    than mem_B after B. A relaxation: lay out each fused backward as its B then that W inside its
    interval; B ends no later than the fused pass, so inputs still arrive in time, and memory is freed
    no later and never raised. Bounds on these passes hold for schedules with fused backwards too."""
    costs = problem.chunk_costs
    out = []
    for ps in (passes if passes is not None else problem.passes):
        cost = costs[ps.action.chunk]
        keep = min(cost.mem_W, cost.mem_B)
        if ps.action.kind is Kind.W:
            ps = replace(ps, duration=min(ps.duration, max(0.0, cost.BW - cost.B)), free=keep)
        elif ps.action.kind is Kind.B:
            ps = replace(ps, free=cost.mem_B - keep)
        out.append(ps)
    return tuple(out)


def bound_passes(problem: Problem) -> tuple[Pass, ...]:
    """The passes a proven bound must read: the problem's own, relaxed where a backward may be fused
    (fusion_relaxation) and where passes may pair (overlap_relaxation), so that it holds for every
    schedule the simulator times, not only those the solver's split model writes."""
    passes = problem.passes
    if fusion_saves(problem.chunk_costs):
        passes = fusion_relaxation(problem, passes)
    if problem.profile.gives_overlap:
        passes = overlap_relaxation(problem, passes)
    return passes
