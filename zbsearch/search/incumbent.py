"""What the solver does to an incumbent schedule: read its objective, write its backwards split into B
and W (the form the CP-SAT models and the large-neighbourhood search place), or fused again."""

from __future__ import annotations

from typing import Any

from ..core.ir import Action, Kind, Schedule, build
from .problem import Problem
from ..sim.simulate import Timeline
from ..sim.validate import check


def objective_of(timeline: Timeline, objective: str) -> float:
    return timeline.makespan if objective == "makespan" else timeline.span


def split_backward(schedule: Schedule) -> Schedule:
    """The same orders with every full backward written as B then W and every overlapped pair as its
    two passes: the form the solver's model uses."""
    ranks = []
    for rank in schedule.ranks:
        out: list[Action] = []
        for action in rank:
            for a in action.passes():
                if a.kind is Kind.FULL_B:
                    out += [Action(a.chunk, Kind.B, a.microbatch), Action(a.chunk, Kind.W, a.microbatch)]
                else:
                    out.append(a)
        ranks.append(out)
    return build(schedule.name, schedule.placement, schedule.num_microbatches, ranks, **schedule.meta)


def fuse_adjacent(schedule: Schedule) -> Schedule:
    """The same orders with every B directly followed on its rank by the W of the same chunk and
    microbatch written as one fused backward (torch's B): one action instead of two."""
    ranks = []
    for rank in schedule.ranks:
        out: list[Action] = []
        for action in rank:
            last = out[-1] if out else None
            if (action.kind is Kind.W and last is not None and last.kind is Kind.B and last.chunk == action.chunk
                    and last.microbatch == action.microbatch):
                out[-1] = Action(action.chunk, Kind.FULL_B, action.microbatch)
            else:
                out.append(action)
        ranks.append(out)
    return build(schedule.name, schedule.placement, schedule.num_microbatches, ranks, **schedule.meta)


def fuse_if_faster(problem: Problem, best: Schedule, best_tl: Timeline, best_obj: float,
                   details: dict[str, Any]) -> tuple[Schedule, Timeline, float]:
    """`best` with its adjacent B and W fused when that is faster and still fits (it always holds no more
    between them), else `best` unchanged."""
    fused = fuse_adjacent(best)
    if fused.ranks == best.ranks:
        return best, best_tl, best_obj
    report = check(fused, problem.profile, problem.limit)
    if not report.ok or report.timeline is None:
        return best, best_tl, best_obj
    obj = objective_of(report.timeline, problem.objective)
    if obj >= best_obj:
        return best, best_tl, best_obj
    details["fused_backwards"] = sum(a.kind is Kind.FULL_B for rank in fused.ranks for a in rank)
    return fused, report.timeline, obj
