"""The chosen plan of a whole run, rebuilt once from its record and validated once on its shape's profile,
for everything that writes it out: the schedule file (`configure -o`), the page's plan sections and the
trainers' exports (exports.py).

A search result holds the plan as JSON and the shape it was solved for, not the costs it was solved on:
those are the shape's again (cost.shape_costs, a pure function of the workload, cluster, shape and
choices). Each writer rebuilding and checking the plan on its own costed the shape and simulated the plan
once per writer, and at different limits; `chosen_plan` does it once, at the limit the plan records, and
keeps the timeline so that no writer has to simulate it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import PlanError, ScheduleError
from ...core.ir import Schedule
from ...core.memory import MemoryLimit, parse_mem_limit
from ...core.objective import Objective
from ...core.partition import split_from_layers
from ...core.plan_record import Split
from ...core.planned_profile import for_plan
from ...core.profile import Profile
from ...interop.formats.layer_split import split_of
from ...sim.simulate import Timeline
from ...sim.validate import check
from .cluster import Cluster
from .cost import PlanChoices, shape_costs
from .shape_result import ShapeResult
from .workload import Workload


@dataclass(frozen=True)
class ChosenPlan:
    """The chosen shape's plan as its writers read it: its result, the profile it was solved on (the
    shape's, before the plan's split and levels are applied), the schedule (None without pipelining), the
    layer split, the recompute levels every microbatch runs, the chunks that recompute on some
    microbatches only, the bytes a GPU may fill, the objective it was solved for, and, with a pipeline, the
    timeline it validated to and the limit it was validated at."""

    result: ShapeResult
    profile: Profile
    schedule: Schedule | None
    split: Split
    levels: dict[str, str]
    partial: dict[int, list[int]]
    usable_bytes: float
    objective: Objective
    timeline: Timeline | None = None
    limit: MemoryLimit | None = None

    @property
    def planned(self) -> Profile:
        """The profile the plan is costed on (its split, recompute and sharding applied: for_plan), kept in
        the timeline so that no writer derives it again; without a pipeline, the shape's own."""
        return self.timeline.profile if self.timeline is not None else self.profile


def chosen_plan(result: ShapeResult, workload: Workload, cluster: Cluster, choices: PlanChoices) -> ChosenPlan:
    """The plan of `result` on its shape's profile, validated there as planned (its split, recompute and
    sharding: for_plan) at the memory limit it records.

    Raises
    ------
    PlanError
        The result holds no plan.
    ScheduleError
        Its schedule does not validate on the profile it was solved on, at its limit.
    """
    label = result.shape.label()
    if result.status != "solved":
        raise PlanError(f"shape {label} has no plan ({result.status}: {result.reason})", subject="export_dir")
    costs = shape_costs(workload, cluster, result.shape, choices)
    profile, objective = costs.profile, Objective.parse(costs.request.objective)
    if result.plan is None:  # no pipeline: the whole model on one rank (single.py), nothing to simulate
        names = [name for chunk in result.split for name in chunk]
        split = split_from_layers([names], profile.layers or ())
        return ChosenPlan(result, profile, None, split, dict(result.recompute), {}, costs.usable_bytes, objective)
    schedule = Schedule.from_dict(result.plan)
    planned = for_plan(profile, schedule)
    limit = parse_mem_limit(schedule.plan.mem_limit, planned, schedule.placement)
    report = check(schedule, planned, limit)
    if not report.ok or report.timeline is None:
        problem = report.problems[0] if report.problems else "it did not simulate"
        raise ScheduleError(f"the chosen plan of shape {label} does not validate on its shape's profile at its "
                            f"limit {limit.text}: {problem}", subject="export_dir")
    levels, partial = schedule.plan.levels_for_every_microbatch(result.shape.m)
    return ChosenPlan(result, profile, schedule, split_of(schedule, profile), levels, partial, costs.usable_bytes,
                      objective, report.timeline, limit)
