"""`find_plan`: what `zbsearch solve` runs, as one library call.

It takes the profile as loaded and a `PlanRequest` (the limit, objective and placements, the partition
rule, the memory levers), and decides what the command line used to decide: a profile that lists its
layers is costed from them (the split `balanced` unless the request names a rule), the memory
accounting, sharding and fixed recompute levels are applied to the profile (core/planned_profile.py), and
the request goes to the engine that serves it: `solve_placements` on the profile's own stages,
`search_splits` for a split, `search_with_recompute` where recompute is searched too.

Errors carry the request field they are about (`ZbsearchError.subject`), so a caller can name its own
spelling of the field (the CLI's flag) without reading the message.
"""

from __future__ import annotations

from dataclasses import replace

from ...core.errors import ZbsearchError, about
from ...core.memory import no_limit
from ...core.objective import Objective
from ...core.profile import Profile, check_stages
from ..bounds.analytic import objective_bound, rank_bounds
from ..bounds.relaxations import bound_passes
from ..problem import Problem, make_problems
from ..options import Progress, SearchOptions
from ..solve.driver import SolveResult, solve_placements
from ..recompute.search import search_with_recompute
from ..partition.search import SplitRequest, search_splits
from .request import SEARCHED_RECOMPUTE, PlanRequest, planned_profile

def problems_for(profile: Profile, request: PlanRequest) -> list[Problem]:
    """The problems of a request on the profile's own stages, one per placement tried."""
    return make_problems(profile, request.mem_limit, request.objective, request.placement or "linear",
                         request.auto_placements, request.headroom)


def find_plan(profile: Profile, request: PlanRequest, options: SearchOptions = SearchOptions()) -> SolveResult:
    """The best plan found for `request` on `profile` within the options' time limit (spent as their
    Budget says), validated, with its bound and what the same pipeline needs at least without the memory
    limit (`details.uncapped_bound`): what `zbsearch solve` prints and writes.

    Raises
    ------
    ZbsearchError
        A subclass naming the problem in one line, with `subject` the request field it is about (None:
        the profile or no one field).
    """
    result = _search(profile, request, options)
    return replace(result, details=replace(result.details, uncapped_bound=uncapped_bound(result.problem)))


def uncapped_bound(problem: Problem) -> float | None:
    """A lower bound on the problem's pipeline (its split, placement and microbatches) without its memory
    limit; None where it has none. The rank bounds on passes at their shortest (relaxations.bound_passes:
    valid for fused backwards and F&B pairs too), without the chain walks: a quick bound, never above the
    uncapped optimum, so `objective - bound` is the most the limit (and the search) can cost."""
    if problem.limit.unlimited:
        return None
    free = replace(problem, limit=no_limit(problem.profile))
    return objective_bound(rank_bounds(free, bound_passes(free), chains=False, nesting=False), problem.objective)


def _search(profile: Profile, request: PlanRequest, options: SearchOptions) -> SolveResult:
    """The engine that serves the request: the profile's own stages, a split, or recompute searched too."""
    if request.mem_limit is None:
        raise ZbsearchError("a plan needs a memory limit: e.g. 2p, 48GiB, auto (or none for no limit)",
                            subject="mem_limit")
    rule = request.partition_rule(profile)
    if rule is not None and request.stages is not None:
        with about("stages"):
            check_stages(request.stages)
    planned = planned_profile(profile, request)
    if rule is None:
        problems = problems_for(planned, request)
        with about("mem_limit"):  # infeasible: the limit is below what the pipeline needs
            return solve_placements(problems, options)
    names = (request.placement,) if request.placement and request.placement.strip().lower() != "auto" else \
        request.auto_placements
    split = SplitRequest(planned, request.stages or planned.num_stages, tuple(names), request.mem_limit,
                         Objective.parse(request.objective), rule, request.headroom)
    recompute = (request.recompute or "").strip()
    if recompute in SEARCHED_RECOMPUTE:
        return search_with_recompute(split, options, per_microbatch=recompute == "auto")
    return search_splits(split, options)
