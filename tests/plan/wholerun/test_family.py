"""Shapes planned with 1F1B-family schedules only (plan/wholerun/family.py): the plan is a 1F1B or interleaved
1F1B schedule at an even or balanced split with recompute none or full, valid under the shape's limit, its bound
its own step; where only 1F1B applies (m not a multiple of p), the joint search, which starts from 1F1B on those
splits and recompute choices, is never slower on the pipeline; the placement and recompute asked narrow the
family; nothing fitting is refused with the least memory, and where the cheap bound lets a shape through but
no family plan fits, its bound is infinite; bad choices are refused naming the field."""

from __future__ import annotations

import json
import math

import pytest

from zbsearch.core.errors import PlanError
from zbsearch.plan.wholerun.bound import least_need
from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.cost import PlanChoices, shape_costs
from zbsearch.plan.wholerun.evaluate import bound_shape, evaluate_shape
from zbsearch.plan.wholerun.family import FAMILY, check_schedules, levels_tried, placements_tried
from zbsearch.plan.wholerun.shape import RunShape
from zbsearch.plan.wholerun.shape_result import ShapeResult
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.request import LlamaShape
from zbsearch.search.options import SearchOptions

LLAMA = LlamaShape(layers=8, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024)
CLUSTER = make_cluster("h100", 8, 4)
QUICK = SearchOptions(time_limit=1.0, workers=1)
FAMILY_ONLY = PlanChoices(schedules="1f1b-family")


def _evaluate(shape: RunShape, choices: PlanChoices = FAMILY_ONLY, cluster=CLUSTER):
    return evaluate_shape(Workload(LLAMA, shape.m * shape.b * shape.d), cluster, shape, QUICK, choices)


@pytest.mark.parametrize("shape", [RunShape(1, 2, 4, 1, 3, "fsdp"), RunShape(1, 4, 2, 1, 6, "zero1"),
                                   RunShape(2, 2, 2, 1, 5, "fsdp-reshard")], ids=RunShape.label)
def test_where_only_1f1b_applies_the_joint_search_is_never_slower_on_the_pipeline(shape: RunShape) -> None:
    family, joint = _evaluate(shape), _evaluate(shape, PlanChoices())
    assert family.status == joint.status == "solved", (family.reason, joint.reason)
    assert family.schedule_name == "1f1b" and family.placement == "linear"
    assert family.timing is not None and joint.timing is not None
    # The joint search scores 1F1B on the even and balanced splits, without recompute and with every layer
    # recomputed, among its starts on the linear placement, and returns nothing slower than its starts.
    assert joint.timing.makespan_us <= family.timing.makespan_us * (1 + 1e-9)


@pytest.mark.parametrize("shape", [RunShape(1, 2, 4, 1, 4, "fsdp"), RunShape(1, 4, 2, 1, 8, "zero2")],
                         ids=RunShape.label)
def test_the_family_plan_is_1f1b_or_interleaved_and_its_bound_is_its_step(shape: RunShape) -> None:
    result = _evaluate(shape)
    assert result.status == "solved" and result.timing is not None and result.plan is not None
    assert result.schedule_name in FAMILY and result.placement in ("linear", "interleaved")
    assert result.step_bound_us == pytest.approx(result.timing.step_us)
    assert all(peak <= result.capacity_bytes for peak in result.peak_bytes)
    assert set(result.recompute.values()) <= {"full"}
    cheap = bound_shape(Workload(LLAMA, shape.m * shape.b * shape.d), CLUSTER, shape, QUICK, FAMILY_ONLY)
    assert cheap.bound <= result.timing.step_us * (1 + 1e-9)


def test_the_placement_and_recompute_asked_narrow_the_family() -> None:
    shape = RunShape(1, 2, 4, 1, 4, "fsdp")
    looped = _evaluate(shape, PlanChoices(schedules="1f1b-family", placement="interleaved:2"))
    assert looped.schedule_name == "interleaved-1f1b" and looped.placement == "interleaved"
    assert len(looped.layers_per_chunk) == 4
    full = _evaluate(shape, PlanChoices(schedules="1f1b-family", recompute="full"))
    blocks = {f"layers.{i}" for i in range(LLAMA.layers)}
    assert full.status == "solved" and blocks <= set(full.recompute) and set(full.recompute.values()) == {"full"}


def test_without_pipelining_the_family_recomputes_nothing_where_it_fits_and_records_full_where_asked() -> None:
    shape = RunShape(2, 1, 4, 1, 2, "zero1")
    plain = _evaluate(shape)
    assert plain.status == "solved" and plain.plan is None and plain.recompute == {}
    full = _evaluate(shape, PlanChoices(schedules="1f1b-family", recompute="full"))
    blocks = {f"layers.{i}" for i in range(LLAMA.layers)}
    assert blocks <= set(full.recompute) and full.timing is not None and plain.timing is not None
    assert full.timing.makespan_us > plain.timing.makespan_us  # the recompute is charged and recorded


def test_nothing_fitting_is_refused_with_the_least_memory() -> None:
    shape = RunShape(1, 2, 4, 1, 4, "ddp")
    tiny = make_cluster("h100", 8, 4, memory_bytes=2e6)
    result = _evaluate(shape, cluster=tiny)
    assert result.status == "refused" and result.reason is not None
    assert "1F1B-family" in result.reason or "does not fit" in result.reason


def cheap_room(workload: Workload, shape: RunShape) -> float:
    """A GPU capacity whose usable bytes are just what the best split needs for its static bytes and one
    microbatch at its least memory: the cheap bound lets the shape through, a pipeline holding more than one
    microbatch on its first rank does not fit."""
    costs = shape_costs(workload, CLUSTER, shape, FAMILY_ONLY)
    return least_need(costs)[0] * costs.capacity_bytes / costs.usable_bytes


def test_a_shape_no_family_plan_fits_bounds_the_familys_certificate_at_infinity() -> None:
    """The family is enumerated whole, so a shape the cheap bound lets through but where none of its plans fits
    cannot be faster than the chosen plan: its bound is infinite, in the record and read back."""
    shape = RunShape(1, 2, 4, 1, 4, "ddp")
    workload = Workload(LLAMA, shape.m * shape.b * shape.d)
    cheap = bound_shape(workload, CLUSTER, shape, QUICK, FAMILY_ONLY)
    # Between the cheap bound's need (static bytes and one microbatch) and what the family's plans need.
    room = make_cluster("h100", 8, 4, memory_bytes=cheap_room(workload, shape))
    result = _evaluate(shape, cluster=room)
    assert result.status == "refused" and result.no_plan_proven and result.bound == math.inf
    assert ShapeResult.from_dict(json.loads(json.dumps(result.to_dict()))).bound == math.inf
    assert _evaluate(shape).bound == pytest.approx(_evaluate(shape).step_bound_us)  # solved: its own step


def test_the_family_tries_none_and_full_and_every_chunk_count() -> None:
    assert levels_tried("auto-layers") == ("none", "full") and levels_tried("full") == ("full",)
    tried = [(name, placement.name, v) for name, placement, v in placements_tried("auto", 4)]
    assert tried == [("1f1b", "linear", None)] + [("interleaved-1f1b", "interleaved", v) for v in (2, 3, 4)]


@pytest.mark.parametrize("schedules, placement, recompute, subject", [
    ("zb-only", "auto", "auto-layers", "schedules"), ("1f1b-family", "v", "auto-layers", "placement"),
    ("1f1b-family", "dualpipe", "auto-layers", "placement"), ("1f1b-family", "auto", "auto", "ok"),
    ("1f1b-family", "auto", "fixed:layers.0", "recompute"), ("all", "v", "fixed:layers.0", "ok")])
def test_bad_schedule_choices_are_refused_naming_the_field(schedules: str, placement: str, recompute: str,
                                                           subject: str) -> None:
    if subject == "ok":
        check_schedules(schedules, placement, recompute)
        return
    with pytest.raises(PlanError) as caught:
        check_schedules(schedules, placement, recompute)
    assert caught.value.subject == subject


@pytest.mark.parametrize("shape", [RunShape(1, 2, 4, 1, 4, "fsdp"), RunShape(1, 4, 2, 1, 8, "zero1"),
                                   RunShape(2, 2, 2, 1, 6, "fsdp-reshard")], ids=RunShape.label)
def test_every_schedule_is_never_slower_than_the_1f1b_family_on_any_shape(shape: RunShape) -> None:
    # m a multiple of p: interleaved 1F1B applies, on a placement the joint search does not try; the search over
    # every schedule keeps the family's plan where it is faster, with the joint search's bound.
    family, every = _evaluate(shape), _evaluate(shape, PlanChoices())
    assert family.status == every.status == "solved", (family.reason, every.reason)
    assert every.step <= family.step * (1 + 1e-12)
    assert every.bound <= every.step * (1 + 1e-9) and every.bound <= family.step * (1 + 1e-9)


def test_a_slower_joint_plan_gives_way_to_the_family_and_keeps_its_bound() -> None:
    import time
    from dataclasses import replace

    from zbsearch.plan.wholerun.cost import shape_costs
    from zbsearch.plan.wholerun.evaluate import _with_family

    shape = RunShape(2, 2, 2, 1, 6, "fsdp-reshard")
    joint = _evaluate(shape, PlanChoices())
    assert joint.timing is not None
    slow = replace(joint, timing=replace(joint.timing, makespan_us=joint.timing.makespan_us * 10))
    costs = shape_costs(Workload(LLAMA, 12), CLUSTER, shape, PlanChoices())
    kept = _with_family(costs, PlanChoices(), slow, time.monotonic())
    assert kept.schedule_name in FAMILY and kept.step < slow.step
    assert kept.step_bound_us == slow.step_bound_us  # the joint search's bound: it holds for every plan
    assert _with_family(costs, PlanChoices(), joint, time.monotonic()) is joint
