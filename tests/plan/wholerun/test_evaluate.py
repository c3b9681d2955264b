"""The per-shape entry points (plan/wholerun/evaluate.py): the cheap bound never exceeds the step of the plan
found, a shape too big for the GPU is refused with the least memory it needs, MFU without communication is
the workload's MFU less what the memory-bound embedding and optimizer take, and the records travel as JSON
and pickles."""

from __future__ import annotations

import json
import pickle

import pytest

from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.cost import shape_costs
from zbsearch.plan.wholerun.evaluate import bound_shape, evaluate_shape
from zbsearch.plan.wholerun.shape_result import ShapeBound, ShapeResult
from zbsearch.plan.wholerun.shape import RunShape
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.request import LlamaShape, MoeShape
from zbsearch.search.options import SearchOptions

LLAMA = LlamaShape(layers=4, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024)
MOE = MoeShape(layers=3, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024, dense_layers=1, experts=4, top_k=2,
               expert_ffn=256)
CLUSTER = make_cluster("h100", 8, 4)
QUICK = SearchOptions(time_limit=0.5, workers=1)

SHAPES = [(LLAMA, RunShape(2, 2, 2, 1, 4, "fsdp")), (LLAMA, RunShape(1, 1, 8, 1, 1, "zero2")),
          (MOE, RunShape(1, 2, 4, 1, 2, "zero1", 2)), (LLAMA, RunShape(1, 4, 2, 1, 4, "fsdp-reshard"))]


@pytest.fixture(scope="module", params=SHAPES, ids=lambda x: x[1].label())
def evaluated(request: pytest.FixtureRequest) -> tuple[ShapeBound, ShapeResult]:
    model, shape = request.param
    workload = Workload(model, global_batch=shape.m * shape.b * shape.d)
    return bound_shape(workload, CLUSTER, shape, QUICK), evaluate_shape(workload, CLUSTER, shape, QUICK)


def test_the_bound_is_never_above_the_plans_step(evaluated) -> None:
    bound, result = evaluated
    assert result.status == "solved" and bound.refused is None and result.timing is not None
    assert bound.step_bound_us <= result.timing.step_us * (1 + 1e-9)
    assert result.step_bound_us is not None and result.step_bound_us <= result.timing.step_us * (1 + 1e-9)
    assert bound.tokens_per_s_per_gpu_bound >= result.tokens_per_s_per_gpu * (1 - 1e-9)
    assert all(peak <= result.capacity_bytes for peak in result.peak_bytes)
    if result.shape.p == 1:  # no pipeline: no schedule, and the bound is the step itself
        assert result.plan is None and result.placement is None
        assert bound.step_bound_us == pytest.approx(result.timing.step_us)
    else:
        assert result.plan is not None and result.plan["placement"]["name"] == result.placement
        assert sum(result.layers_per_chunk) == len({n for chunk in result.split for n in chunk}) >= 5


def test_the_results_travel_as_json_and_pickles(evaluated) -> None:
    bound, result = evaluated
    assert ShapeResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert ShapeBound.from_dict(json.loads(json.dumps(bound.to_dict()))) == bound
    assert pickle.loads(pickle.dumps(result)) == result


@pytest.mark.parametrize("p, d", [(2, 4), (1, 8)])
def test_a_model_too_big_for_the_gpu_is_refused_with_the_least_memory(p: int, d: int) -> None:
    small = make_cluster("h100", 8, 4, memory_bytes=4e6)
    shape = RunShape(1, p, d, 1, 2, "ddp")
    workload = Workload(LLAMA, global_batch=2 * d)
    bound = bound_shape(workload, small, shape, QUICK)
    assert bound.refused is not None and "GiB" in bound.refused and bound.step_bound_us == float("inf")
    assert bound.least_bytes is not None and bound.least_bytes > 4e6
    result = evaluate_shape(workload, small, shape, QUICK)
    assert result.status == "refused" and result.reason and result.timing is None
    roomy = bound_shape(workload, make_cluster("h100", 8, 4, memory_bytes=bound.least_bytes / 0.9), shape, QUICK)
    assert roomy.refused is None  # the least memory named (with the headroom) is enough


def test_mfu_without_communication_is_the_workloads_less_the_memory_bound_work() -> None:
    one = make_cluster("h100", 1, 1)
    model = LlamaShape(layers=2, hidden=2048, heads=16, kv_heads=4, seq=1024, vocab=2048)
    workload = Workload(model, global_batch=16, mfu=0.5)
    shape = RunShape(1, 1, 1, 1, 16, "ddp")
    result = evaluate_shape(workload, one, shape, QUICK)
    assert result.status == "solved" and result.timing is not None and result.mfu is not None
    costs = shape_costs(workload, one, shape)
    embedding = next(x for x in costs.profile.layers if x.kind == "embedding")
    assert result.timing.exposed_start_us == result.timing.exposed_end_us == 0.0  # one GPU: no traffic
    # Every layer but the embedding runs its FLOPs at the workload's MFU; the embedding's gather and the
    # optimizer step are memory-bound and count no model FLOPs.
    flop_time = result.timing.step_us - 16 * (embedding.F + embedding.BW) - result.timing.optimizer_us
    assert result.mfu == pytest.approx(0.5 * flop_time / result.timing.step_us, rel=1e-6)
    assert 0.45 < result.mfu < 0.5  # a model this wide spends little beyond its matrix work
