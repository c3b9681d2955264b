"""What the solver does to an incumbent schedule: write its backwards split into B and W (the form the
CP-SAT models and the large-neighbourhood search place), or fused again where that is faster."""

from __future__ import annotations

from ...core.ir import Action, Kind, Schedule, build
from ...sim.validate import check
from ..problem import Problem
from .starts import Start


def with_backwards_split(schedule: Schedule, keep_whole: frozenset[int] = frozenset()) -> Schedule:
    """The same orders with every full backward written as B then W and every overlapped pair as its
    two passes: the form the solver's model uses. Full backwards of the chunks in `keep_whole` stay as
    they are (where the model may fuse them: exact/cpsat.fusable_chunks)."""
    ranks = []
    for rank in schedule.ranks:
        out: list[Action] = []
        for action in rank:
            for a in action.passes():
                if a.kind is Kind.FULL_B and a.chunk not in keep_whole:
                    out += [Action(a.chunk, Kind.B, a.microbatch), Action(a.chunk, Kind.W, a.microbatch)]
                else:
                    out.append(a)
        ranks.append(out)
    return build(schedule.name, schedule.placement, schedule.num_microbatches, ranks, plan=schedule.plan, **schedule.meta)


def with_backwards_fused(schedule: Schedule) -> Schedule:
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
    return build(schedule.name, schedule.placement, schedule.num_microbatches, ranks, plan=schedule.plan, **schedule.meta)


def fuse_if_faster(problem: Problem, best: Start) -> tuple[Start, int | None]:
    """`best` with its adjacent B and W fused, and how many were, when that is faster and still fits (it
    always holds no more between them); else `best` unchanged and None."""
    fused = with_backwards_fused(best.schedule)
    if fused.ranks == best.schedule.ranks:
        return best, None
    report = check(fused, problem.profile, problem.limit)
    if not report.ok or report.timeline is None:
        return best, None
    obj = problem.objective.of(report.timeline)
    if obj >= best.objective:
        return best, None
    count = sum(a.kind is Kind.FULL_B for rank in fused.ranks for a in rank)
    return Start(best.name, fused, report.timeline, obj), count
