"""One pipeline of a run shape (plan/wholerun/cost.py): tensor parallelism halves a block's FLOPs and matrix
weights and adds exactly its collectives, sequence parallelism divides the named activations, expert
parallelism the routed experts, the hop's link follows the mesh, and each sharding keeps its bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zbsearch.core.errors import PlanError
from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.collectives import all_gather, all_to_all, point_to_point, reduce_scatter
from zbsearch.plan.wholerun.cost import shape_costs
from zbsearch.plan.wholerun.parallel_layers import sequence_split
from zbsearch.plan.wholerun.shape import RunShape
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.build import profile_estimate
from zbsearch.profiling.request import LlamaShape, MoeShape, PipelineSetup, StageSplit
from zbsearch.profiling.tensor_parallel import tp_shard

LLAMA = LlamaShape(layers=4, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024)
MOE = MoeShape(layers=3, hidden=256, heads=4, kv_heads=2, seq=128, vocab=1024, dense_layers=1, experts=4, top_k=2,
               expert_ffn=256)
CLUSTER = make_cluster("h100", 8, 4)  # two nodes of 4 GPUs


def costs(t: int = 1, p: int = 2, d: int = 4, sharding: str = "ddp", model: LlamaShape = LLAMA, ep: int = 1):
    """A shape of t x p x d = 8 GPUs, one sequence per microbatch, two microbatches."""
    return shape_costs(Workload(model, global_batch=2 * d), CLUSTER, RunShape(t, p, d, 1, 2, sharding, ep))


def block(c, i: int = 1):
    return next(layer for layer in c.profile.layers if layer.name == f"layers.{i}")


def test_t_halves_a_blocks_flops_and_matrix_weights_and_adds_its_collectives() -> None:
    one, two = block(costs(t=1, d=4)), block(costs(t=2, d=2))
    flops1, flops2 = one.details["flops"], two.details["flops"]
    assert all(flops2[k] == pytest.approx(flops1[k] / 2) for k in ("F", "B", "W"))
    norms = 2 * LLAMA.hidden  # RMSNorm weights stay whole on every rank
    assert two.params - norms == (one.params - norms) // 2
    nbytes = 1 * LLAMA.seq * LLAMA.hidden * 2  # b*s*h in bf16
    link = CLUSTER.intra
    expected = 2 * (all_gather(nbytes, 2, link) + reduce_scatter(nbytes, 2, link))
    assert expected == pytest.approx(2 * 2 * (link.latency_us + nbytes / 2 / link.bytes_per_us))
    assert two.F == pytest.approx(one.F / 2 + expected)
    assert two.B == pytest.approx(one.B / 2 + expected)
    assert two.W == pytest.approx(one.W / 2)  # the weight gradient adds none
    assert one.details["collectives_us"] == {"F": 0.0, "I": 0.0, "W": 0.0}
    assert "2 all-gathers + 2 reduce-scatters" in costs(t=2, d=2).profile.source["method"]


def test_sequence_parallelism_divides_the_named_activations_by_t() -> None:
    shaped = block(costs(t=2, d=2))
    share = tp_shard(LLAMA, 2)
    plain = next(x for x in profile_estimate(share, "h100", StageSplit(stages=2), PipelineSetup(microbatches=2),
                                             attention="sdpa").layers if x.name == "layers.1")
    saved, kept, stored = sequence_split(share, 1, 2, "bf16", "sdpa")
    hidden = 1 * LLAMA.seq * LLAMA.hidden * 2
    # attention and MLP norm inputs, the normed q/k/v and MLP inputs (4 x h), the two 1/rms in fp32, halved
    assert saved == pytest.approx((4 * hidden + 2 * 4 * LLAMA.seq) / 2)
    assert shaped.mem_B_torch == pytest.approx(plain.mem_B_torch - saved)
    assert shaped.mem_W == pytest.approx(plain.mem_W - kept)
    assert shaped.mem_W_torch == pytest.approx(plain.mem_W_torch - saved - stored)
    assert shaped.out_bytes == plain.out_bytes / 2
    full = shaped.recompute[0]
    assert full.level == "full" and full.mem_B == pytest.approx(hidden / 2) and full.time == pytest.approx(shaped.F)


def test_expert_parallelism_divides_the_routed_experts_and_adds_the_all_to_alls() -> None:
    one, two = costs(model=MOE, d=4, ep=1), costs(model=MOE, d=4, ep=2)
    routed = 3 * MOE.hidden * MOE.expert_size * MOE.experts
    by_name = {x.name: x for x in two.params}
    assert by_name["layers.1"].expert == routed / 2 and by_name["layers.0"].expert == 0.0
    nbytes = 1 * MOE.seq * MOE.top_k * MOE.hidden * 2
    a2a = 2 * all_to_all(nbytes, 2, CLUSTER.intra)  # t*ep = 2 GPUs: inside a node
    assert block(two).F == pytest.approx(block(one).F + a2a)
    assert block(two).B == pytest.approx(block(one).B + a2a)
    assert block(two, 0).F == pytest.approx(block(one, 0).F)  # the dense block: no all-to-all


def test_the_hop_link_follows_the_mesh() -> None:
    nbytes = 1 * LLAMA.seq * LLAMA.hidden * 2
    intra, inter = point_to_point(nbytes, CLUSTER.intra), point_to_point(nbytes, CLUSTER.inter)
    # t*d = 1: four stages in each node of 4, the boundary between the nodes crosses
    deep = replace(LLAMA, layers=8)
    assert costs(t=1, p=8, d=1, model=deep).profile.comm == (intra, intra, intra, inter, intra, intra, intra)
    assert costs(t=1, p=4, d=2).profile.comm == (intra, inter, intra)  # t*d = 2
    assert costs(t=2, p=2, d=2).profile.comm == (point_to_point(nbytes / 2, CLUSTER.inter),)  # t*d = 4: a node
    assert costs(t=2, p=4, d=1).profile.comm == (point_to_point(nbytes / 2, CLUSTER.intra),
                                                 point_to_point(nbytes / 2, CLUSTER.inter),
                                                 point_to_point(nbytes / 2, CLUSTER.intra))  # b*s*h / t


@pytest.mark.parametrize("sharding, keep, gathered, how", [
    ("ddp", 16.0, 0.0, None), ("zero1", 4 + 12 / 4, 0.0, "zero1"), ("zero2", 2 + 14 / 4, 0.0, "zero2"),
    ("fsdp", 4 + 12 / 4, 0.0, "zero1"), ("fsdp-reshard", 2 + 14 / 4, 2.0, "fsdp-whole-grads")])
def test_each_sharding_keeps_its_static_bytes(sharding: str, keep: float, gathered: float, how) -> None:
    c = costs(d=4, sharding=sharding)
    for layer in c.profile.layers:
        assert layer.static_bytes == pytest.approx(layer.params * keep)
        assert layer.gather_bytes == pytest.approx(layer.params * gathered)
    recorded = c.profile.sharding
    assert (recorded.how if recorded else None) == how and (recorded is None or recorded.degree == 4)


def test_shapes_that_do_not_fit_the_cluster_or_batch_are_refused() -> None:
    with pytest.raises(PlanError, match="uses 4 GPUs"):
        shape_costs(Workload(LLAMA, global_batch=4), CLUSTER, RunShape(1, 2, 2, 1, 2, "ddp"))
    with pytest.raises(PlanError, match="global batch"):
        shape_costs(Workload(LLAMA, global_batch=5), CLUSTER, RunShape(1, 2, 4, 1, 2, "ddp"))
    with pytest.raises(PlanError, match="expert-parallel degree 3"):
        shape_costs(Workload(MOE, global_batch=8), CLUSTER, RunShape(1, 2, 4, 1, 2, "ddp", 3))
