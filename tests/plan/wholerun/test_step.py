"""A step's time (plan/wholerun/step.py): the solved plan's makespan plus the exposed data-parallel terms and
the optimizer, by the overlap rules, and never below the step's bound over every plan of the shape."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.cost import shape_costs
from zbsearch.plan.wholerun.shape import RunShape
from zbsearch.plan.wholerun.step import StepTime, average_rank_bound, rank_layers, step_bound, step_time, sync_bound
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.request import LlamaShape
from zbsearch.search.entry.find_plan import find_plan
from zbsearch.search.options import SearchOptions

LLAMA = LlamaShape(layers=4, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024)
CLUSTER = make_cluster("h100", 8, 4)
QUICK = SearchOptions(time_limit=0.5, workers=1)


@pytest.fixture(scope="module", params=["fsdp", "zero2", "ddp"])
def solved(request: pytest.FixtureRequest):
    costs = shape_costs(Workload(LLAMA, global_batch=8), CLUSTER, RunShape(2, 2, 2, 1, 4, request.param))
    return costs, find_plan(costs.profile, costs.request, QUICK)


def test_the_step_is_the_makespan_plus_the_exposed_terms(solved) -> None:
    costs, result = solved
    step = step_time(costs, result.schedule)
    assert step.makespan_us == pytest.approx(result.objective)
    assert step.step_us == pytest.approx(step.makespan_us + step.exposed_start_us + step.exposed_end_us
                                         + step.optimizer_us)
    names = rank_layers(result.schedule)
    assert sorted(n for rank in names for n in rank) == sorted(x.name for x in costs.profile.layers)
    for rank, held in zip(step.ranks, names):
        assert rank.traffic == costs.traffic(held)
        assert rank.exposed_start_us == pytest.approx(max(0.0, rank.traffic.start - rank.first_start_us))
        end = max(rank.last_end_us, rank.first_gradient_us + rank.traffic.mid) + rank.traffic.final
        assert rank.exposed_end_us == pytest.approx(max(0.0, end - step.makespan_us))
    assert step.ranks[0].first_start_us == 0.0  # rank 0 waits for nothing: it pays its whole gather
    assert step.exposed_start_us == max(r.exposed_start_us for r in step.ranks) >= step.ranks[0].traffic.start
    assert step.optimizer_us == max(r.traffic.optimizer for r in step.ranks) > 0
    if costs.shape.sharding == "zero2":
        assert all(r.traffic.mid == pytest.approx(3 * r.traffic.final) for r in step.ranks)


def test_the_step_is_never_below_its_bound(solved) -> None:
    costs, result = solved
    step = step_time(costs, result.schedule)
    bound = step_bound(costs, result.lower_bound)
    assert result.lower_bound <= result.objective
    assert bound <= step.step_us * (1 + 1e-9)
    assert bound > result.lower_bound  # the data-parallel terms and the optimizer add to the pipeline's bound
    assert step_bound(costs, float("inf")) == float("inf")


def test_the_step_round_trips_through_json(solved) -> None:
    costs, result = solved
    step = step_time(costs, result.schedule)
    assert StepTime.from_dict(json.loads(json.dumps(step.to_dict()))) == step


def test_zero2_syncs_bound_the_step_where_the_link_is_slow() -> None:
    """zero2 reduce-scatters the gradients every microbatch: on a slow data-parallel link they outlast the
    pipeline, and the step bound must see them (it once counted one layer's final sync only, 2.6x below a
    Mixtral plan), yet stay below the step of plans on every split the search tries."""
    slow = make_cluster("h100", 8, 2, inter_gbps=1.0)
    costs = shape_costs(Workload(LLAMA, global_batch=8), slow, RunShape(1, 2, 4, 1, 2, "zero2"))
    result = find_plan(costs.profile, costs.request, QUICK)
    step = step_time(costs, result.schedule)
    bound = step_bound(costs, result.lower_bound)
    assert sync_bound(costs) > result.objective  # the syncs outlast the pipeline here
    assert bound <= step.step_us * (1 + 1e-9)
    assert bound >= 0.5 * step.step_us  # the sync's total over the ranks, averaged: within 2x
    for counts in ((1, 5), (3, 3), (5, 1)):  # other splits: their plans' steps are no faster than the bound
        fixed = replace(costs.request, partition=f"fixed:{','.join(map(str, counts))}", placement="linear")
        other = find_plan(costs.profile, fixed, QUICK)
        assert bound <= step_time(costs, other.schedule).step_us * (1 + 1e-9)


def test_a_ranks_gather_work_and_sync_bound_the_step_together() -> None:
    """zero1 gathers the weights before a rank's first pass and reduce-scatters after its last: on a slow link
    the rank that starts at once pays both in full, and the bound sees each rank's gather, work and sync
    together (it once took the first layer's gather and one layer's sync only), yet stays below the step of
    plans on every split the search tries."""
    slow = make_cluster("h100", 8, 2, inter_gbps=20.0)
    costs = shape_costs(Workload(LLAMA, global_batch=8), slow, RunShape(1, 2, 4, 1, 2, "zero1"))
    result = find_plan(costs.profile, costs.request, QUICK)
    each = [costs.traffic([layer.name]) for layer in costs.profile.layers]
    old = result.lower_bound + each[0].start + min(x.final for x in each)
    assert average_rank_bound(costs) > old
    for counts in ((1, 5), (3, 3), (5, 1)):
        fixed = replace(costs.request, partition=f"fixed:{','.join(map(str, counts))}", placement="linear")
        step = step_time(costs, find_plan(costs.profile, fixed, QUICK).schedule)
        assert step_bound(costs, result.lower_bound) <= step.step_us * (1 + 1e-9)
        assert average_rank_bound(costs) <= step.makespan_us + step.exposed_start_us + step.exposed_end_us + 1e-6
