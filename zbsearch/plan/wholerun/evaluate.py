"""The per-shape entry points of whole-run planning, top-level functions of picklable arguments, so that a
process pool or Ray can run them: `bound_shape` (cheap: the step's lower bound, no solver) and
`evaluate_shape` (the joint search's plan and its step). A shape without pipelining (p = 1) has no schedule
to search (single.py)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

from ...core.errors import (InfeasibleError, MemoryLimitError, PartitionError, PlanError, ProfilerError,
    ZbsearchError)
from ...core.ir import Schedule
from ...core.memory import MemoryLimit
from ...core.planned_profile import for_plan
from ...search.entry.find_plan import find_plan
from ...search.options import SearchOptions
from ...sim.validate import check
from .bound import least_need, pipeline_bound
from .cluster import Cluster
from .cost import PlanChoices, ShapeCosts, shape_costs
from .family import best_family_plan, check_schedules, single_levels
from .shape_result import ShapeBound, ShapeResult
from .shape import RunShape
from .single import best_single, single_rank, single_step
from .step import StepTime, step_bound, timeline_step
from .workload import Workload

# The shape cannot run: it does not fit the GPU, or the model does not split as it asks.
REFUSALS = (InfeasibleError, MemoryLimitError, PartitionError, ProfilerError, PlanError)
BOUND_SECONDS = 2.0  # the most the bound's DPs over splits take per shape (cut short, still a bound)
GIB = 2**30


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def tokens_per_s_per_gpu(costs: ShapeCosts, step_us: float) -> float:
    """global batch x sequence / (step in seconds x GPUs)."""
    return 0.0 if math.isinf(step_us) else costs.tokens_per_step / (step_us / 1e6 * costs.shape.gpus)


def mfu(costs: ShapeCosts, step_us: float) -> float:
    """The model FLOPs of a step (forward and backward, no recompute) over GPUs x dense peak x step."""
    return costs.flops_per_step / (costs.shape.gpus * costs.peak_flops_per_us * step_us)


def bound_shape(workload: Workload, cluster: Cluster, shape: RunShape, options: SearchOptions = SearchOptions(),
                choices: PlanChoices = PlanChoices(), seconds: float = BOUND_SECONDS) -> ShapeBound:
    """A lower bound on the step of every plan of `shape` (step.step_bound on bound.pipeline_bound, in at most
    about `seconds`), or why the shape is refused: it does not split so, or even its best split cannot hold
    its static bytes and one microbatch (`least_bytes`: what that split needs per GPU). Without pipelining
    (p = 1) the bound is the step itself. `options.budget` caps the bound's enumerations as the search's."""
    t0 = time.monotonic()
    try:
        costs = shape_costs(workload, cluster, shape, choices)
    except REFUSALS as exc:
        return ShapeBound(shape, math.inf, math.inf, 0.0, _line(exc), seconds=time.monotonic() - t0)
    if shape.p == 1:
        one = best_single(costs)
        if one.peak_bytes > costs.usable_bytes:
            return _refused_bound(costs, one.peak_bytes, t0)
        step = single_step(costs, one).step_us
        return ShapeBound(shape, step, one.makespan_us, tokens_per_s_per_gpu(costs, step),
                          seconds=time.monotonic() - t0)
    try:
        pipe = pipeline_bound(costs, seconds, options.budget)
    except (InfeasibleError, MemoryLimitError):  # no room on some rank: as no split fitting
        pipe = math.inf
    if math.isinf(pipe):
        return _refused_bound(costs, least_need(costs)[0], t0)
    bound = step_bound(costs, pipe)
    return ShapeBound(shape, bound, pipe, tokens_per_s_per_gpu(costs, bound), seconds=time.monotonic() - t0)


def _refused_bound(costs: ShapeCosts, least: float, t0: float) -> ShapeBound:
    usable, headroom = costs.usable_bytes, costs.request.headroom
    reason = (f"shape {costs.shape.label()} does not fit: its best split needs at least {least / GIB:.3g} GiB per "
              f"GPU (static bytes and one microbatch), the GPU has {usable / GIB:.3g} GiB usable "
              f"({costs.capacity_bytes / GIB:.3g} GiB less {headroom:.0%} headroom)")
    return ShapeBound(costs.shape, math.inf, math.inf, 0.0, reason, least, time.monotonic() - t0)


def evaluate_shape(workload: Workload, cluster: Cluster, shape: RunShape, options: SearchOptions = SearchOptions(),
                   choices: PlanChoices = PlanChoices()) -> ShapeResult:
    """The joint search's plan for `shape` (find_plan within the options' time limit, validated again on the
    profile as planned) and what its step costs; `refused` where the shape cannot run (the message says
    why, with the least memory where it does not fit), `failed` where the search raised otherwise."""
    t0 = time.monotonic()
    try:
        costs = shape_costs(workload, cluster, shape, choices)
        if choices.schedules != "all":
            check_schedules(choices.schedules, choices.placement, choices.recompute)
            try:
                return _family_result(costs, t0)
            except REFUSALS as exc:  # the family was enumerated whole: none of its plans runs here
                return ShapeResult(shape, "refused", _line(exc), no_plan_proven=True, seconds=time.monotonic() - t0)
        if shape.p == 1:
            return _single_result(costs, t0)
        result = find_plan(costs.profile, costs.request, options)
    except REFUSALS as exc:
        return ShapeResult(shape, "refused", _line(exc), seconds=time.monotonic() - t0)
    except ZbsearchError as exc:
        return ShapeResult(shape, "failed", _line(exc), seconds=time.monotonic() - t0)
    joint = _solved(costs, result.schedule, result.problem.limit, result.lower_bound, str(result.status), t0)
    return _with_family(costs, choices, joint, t0)


def _with_family(costs: ShapeCosts, choices: PlanChoices, joint: ShapeResult, t0: float) -> ShapeResult:
    """The joint search's plan, or the shape's best 1F1B-family plan where that is faster: every schedule
    includes the family, and the family is cheap to enumerate (simulated), so a search over every schedule
    is never slower than the family on any shape (the joint search's placements leave the looped one out).
    The bound stays the joint search's: it holds for every plan of the shape."""
    try:
        check_schedules("1f1b-family", choices.placement, choices.recompute)
        best = best_family_plan(costs)
    except ZbsearchError:  # the asked placement or recompute is outside the family, or no family plan fits
        return joint
    family = _solved(costs, best.schedule, best.limit, None, "1f1b-family plan, faster than the joint search's", t0)
    if family.status != "solved" or family.step >= joint.step:
        return joint
    return replace(family, step_bound_us=joint.step_bound_us)


def _family_result(costs: ShapeCosts, t0: float) -> ShapeResult:
    """The best 1F1B-family plan of the shape (family.py), its own step as its bound (the family is
    enumerated whole); without pipelining, recompute none where it fits, else full."""
    if costs.shape.p == 1:
        refusal: InfeasibleError | None = None
        for each in single_levels(costs):
            try:
                return _single_result(each, t0)
            except InfeasibleError as exc:
                refusal = exc
        assert refusal is not None
        raise refusal
    best = best_family_plan(costs)
    return _solved(costs, best.schedule, best.limit, None, "1f1b-family: best of the family", t0)


def _single_result(costs: ShapeCosts, t0: float) -> ShapeResult:
    one = single_rank(costs)
    step = single_step(costs, one)
    return _metrics(costs, step, step.step_us, ShapeResult(
        costs.shape, "solved", timing=step, bubble_fraction=0.0, peak_bytes=(one.peak_bytes,),
        capacity_bytes=costs.capacity_bytes, layers_per_chunk=(len(costs.profile.layers or ()),),
        split=(tuple(layer.name for layer in costs.profile.layers or ()),), recompute=dict(one.levels),
        solver_status="optimal", seconds=time.monotonic() - t0))


def _solved(costs: ShapeCosts, schedule: Schedule, limit: MemoryLimit, pipeline_bound: float | None, status: str,
            t0: float) -> ShapeResult:
    """The result of a plan (find_plan's, with its bound on the makespan; or one whose own step is the bound,
    `pipeline_bound` None): validated on the profile as planned, then costed."""
    planned = for_plan(costs.profile, schedule)
    report = check(schedule, planned, limit)
    if not report.ok or report.timeline is None:
        return ShapeResult(costs.shape, "failed", "the plan found does not validate: " + "; ".join(report.problems),
                           seconds=time.monotonic() - t0)
    timeline = report.timeline
    step = timeline_step(costs, schedule, timeline)
    static = planned.static_bytes_per_rank(schedule.placement) or (0.0,) * schedule.num_ranks
    split = schedule.plan.split
    names = split.chunks if split is not None else ()
    route = schedule.placement.routes[0]
    bound = step.step_us if pipeline_bound is None else step_bound(costs, pipeline_bound)
    return _metrics(costs, step, bound, ShapeResult(
        costs.shape, "solved", timing=step, bubble_fraction=timeline.bubble_rate_makespan,
        peak_bytes=tuple(static[r] + timeline.peak_memory(r) for r in range(schedule.num_ranks)),
        capacity_bytes=costs.capacity_bytes, placement=schedule.placement.name, schedule_name=schedule.name,
        layers_per_chunk=tuple(len(names[c]) for c in route) if names else (), split=tuple(names),
        recompute=dict(schedule.plan.levels), plan=schedule.to_dict(), solver_status=status,
        seconds=time.monotonic() - t0))


def _metrics(costs: ShapeCosts, step: StepTime, bound: float, result: ShapeResult) -> ShapeResult:
    """`result` with its step's throughput, MFU and bound."""
    return replace(result, step_bound_us=bound, tokens_per_s_per_gpu=tokens_per_s_per_gpu(
        costs, step.step_us), mfu=mfu(costs, step.step_us))
