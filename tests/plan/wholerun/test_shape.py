"""The space of run shapes: what enumerate_shapes keeps, what it leaves out and why, and the one-line errors
where nothing is left."""

from __future__ import annotations

import pytest

from zbsearch.core.errors import PlanError
from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.shape import SHARDINGS, RunShape, Space, enumerate_shapes
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.presets import resolve_shape
from zbsearch.profiling.request import LlamaShape, MoeShape

TINY = LlamaShape(layers=8, hidden=64, heads=8)  # 8 heads, 8 blocks


def tiny_setup(batch: int = 32) -> tuple[Workload, object]:
    """16 GPUs, 8 to a node, the tiny llama at a global batch of `batch`."""
    return Workload(TINY, batch), make_cluster("h100", 16)


def test_tiny_llama_on_16_gpus_counts_and_reasons():
    workload, cluster = tiny_setup()
    found = enumerate_shapes(workload, cluster, Space())
    # (t, p): t in 1, 2, 4, 8 splits 8 heads inside a node; p divides 16 / t, at most 8 blocks: 13 pairs.
    # b in 1, 2, 4, 8 with d b dividing 32: 48 of 52; d = 1 (tp2 pp8, tp4 pp4, tp8 pp2) only ddp.
    assert len(found.shapes) == 36 * len(SHARDINGS) + 12 == 192
    assert len(set(found.shapes)) == 192
    assert all(s.gpus == 16 and s.m * s.b * s.d == 32 and s.ep == 1 for s in found.shapes)
    assert [r.line() for r in found.refused] == [
        "tp1 pp1 dp16 b4: m = 32/(16*4) = 0.5 is not whole",
        "tp1 pp1 dp16 b8: m = 32/(16*8) = 0.25 is not whole",
        "tp1 pp2 dp8 b8: m = 32/(8*8) = 0.5 is not whole",
        "tp1 pp16: more stages than the model's 8 blocks",
        "tp2 pp1 dp8 b8: m = 32/(8*8) = 0.5 is not whole",
        "tp2 pp8 dp1: zero1, zero2, fsdp, fsdp-reshard: sharding over one data-parallel rank is none (ddp)",
        "tp4 pp4 dp1: zero1, zero2, fsdp, fsdp-reshard: sharding over one data-parallel rank is none (ddp)",
        "tp8 pp2 dp1: zero1, zero2, fsdp, fsdp-reshard: sharding over one data-parallel rank is none (ddp)",
    ]
    # Enumeration order: t, p, b, then sharding in SHARDINGS order.
    assert found.shapes[:6] == (RunShape(1, 1, 16, 1, 2, "ddp"), RunShape(1, 1, 16, 1, 2, "zero1"),
                                RunShape(1, 1, 16, 1, 2, "zero2"), RunShape(1, 1, 16, 1, 2, "fsdp"),
                                RunShape(1, 1, 16, 1, 2, "fsdp-reshard"), RunShape(1, 1, 16, 2, 1, "ddp"))


def test_given_values_are_refused_with_reasons():
    workload, cluster = tiny_setup()
    found = enumerate_shapes(workload, cluster, Space(tp=(1, 3, 16), pp=(2, 3), micro_batch=(1, 3),
                                                      sharding=("fsdp",)))
    assert {(s.t, s.p, s.b) for s in found.shapes} == {(1, 2, 1)}
    assert [r.line() for r in found.refused] == [
        "tp1 pp2 dp8 b3: m = 32/(8*3) = 1.33333 is not whole",
        "tp1 pp3: does not divide the 16 GPUs tp1 leaves",
        "tp3: does not divide 16 GPUs",
        "tp16: more than the 8 GPUs of a node: tensor parallelism stays inside a node",
    ]
    # 6 heads in 2 key/value groups, FFN 320, on nodes of 6: t = 3 and 6 split the heads but not the groups.
    heads = enumerate_shapes(Workload(LlamaShape(layers=8, hidden=96, heads=6, kv_heads=2, ffn=320), 36),
                             make_cluster("h100", 12, 6), Space())
    assert {s.t for s in heads.shapes} == {1, 2}
    assert [r.line() for r in heads.refused if r.what.count(" ") == 0] == [
        "tp3: does not split 2 key/value heads, FFN 320", "tp6: does not split 2 key/value heads, FFN 320"]


def test_moe_expert_parallel_degrees_divide_dp_and_experts():
    moe = MoeShape(layers=4, hidden=64, heads=8, experts=6)
    found = enumerate_shapes(Workload(moe, 32), make_cluster("h100", 16), Space(tp=(1,), pp=(2,),
                                                                                 sharding=("fsdp",), ep=(1, 2, 3, 4)))
    assert sorted({(s.d, s.ep) for s in found.shapes}) == [(8, 1), (8, 2)]
    assert [r.line() for r in found.refused] == ["tp1 pp2 dp8 ep3: does not divide dp 8",
                                                "ep4: does not divide the 6 routed experts",
                                                "tp1 pp2 dp8 b8: m = 32/(8*8) = 0.5 is not whole"]
    dense = enumerate_shapes(*tiny_setup(), Space(tp=(8,), ep=(1, 2)))
    assert {s.ep for s in dense.shapes} == {1} and "ep2: the model has no experts (dense): only ep1" in \
        [r.line() for r in dense.refused]


def test_llama3_8b_on_64_gpus_is_a_few_hundred_shapes():
    found = enumerate_shapes(Workload(resolve_shape("llama3-8b", {})[0], 512), make_cluster("h100", 64), Space())
    assert len(found.shapes) == 372
    assert {s.t for s in found.shapes} == {1, 2, 4, 8} and max(s.p for s in found.shapes) == 32


@pytest.mark.parametrize("space, batch, subject, message", [
    (Space(tp=(3,)), 32, "tp", "tensor-parallel degree 3 leaves no shape of 16 GPUs for this model and batch "
     "(tp3: does not divide 16 GPUs): use one of 1, 2, 4, 8"),
    (Space(pp=(16,)), 32, "pp", "pipeline degree 16 leaves no shape of 16 GPUs for this model and batch "
     "(tp1 pp16: more stages than the model's 8 blocks): use one of 1, 2, 4, 8"),
    (Space(micro_batch=(3,)), 32, "micro_batch", "micro batch 3 leaves no shape of 16 GPUs for this model and "
     "batch (tp1 pp1 dp16 b3: m = 32/(16*3) = 0.666667 is not whole): use one of 1, 2, 4, 8"),
    (Space(ep=(2,)), 32, "ep", "expert-parallel degree 2 leaves no shape of 16 GPUs for this model and batch "
     "(ep2: the model has no experts (dense): only ep1): use one of 1"),
    (Space(tp=(8,), pp=(2,), sharding=("fsdp",)), 32, "tp", "tensor-parallel degree 8 leaves no shape of 16 GPUs "
     "for this model and batch (tp8 pp2 dp1: fsdp: sharding over one data-parallel rank is none (ddp)): use one "
     "of 1, 2, 4"),
    (Space(tp=(3,), pp=(5,)), 32, "tp", "no shape of 16 GPUs has tensor-parallel degree 3; pipeline degree 5 "
     "(tp3: does not divide 16 GPUs): fix fewer of these choices, or others that fit together"),
    (Space(sharding=("zero3",)), 32, "sharding", "sharding 'zero3' is not known: use one of ddp, zero1, zero2, "
     "fsdp, fsdp-reshard"),
    (Space(tp=(0,)), 32, "tp", "tensor-parallel degree 0 is not a count: give a whole number >= 1"),
    (Space(pp=()), 32, "pp", "pipeline degree choices () are not a list of values: give at least one, or none to "
     "search every value"),
])
def test_nothing_left_is_one_line_about_the_field(space, batch, subject, message):
    with pytest.raises(PlanError) as caught:
        enumerate_shapes(*tiny_setup(batch), space)
    assert (caught.value.subject, str(caught.value)) == (subject, message)


def test_a_batch_no_shape_divides_names_the_batches_that_would():
    # One head and two blocks: t = 1 and p <= 2, so d is 16 or 8 and d x b is at least 8.
    workload = Workload(LlamaShape(layers=2, hidden=64, heads=1), 12)
    with pytest.raises(PlanError) as caught:
        enumerate_shapes(workload, make_cluster("h100", 16), Space())
    assert caught.value.subject == "global_batch"
    assert str(caught.value) == ("global batch 12 is not divisible by data-parallel degree x micro batch of any "
                                 "shape on 16 GPUs (d x b in 8, 16, 32, 64, 128): use a batch one of them "
                                 "divides, e.g. 8 or 16")
    assert "\n" not in str(caught.value)
