"""Data parallelism's terms per pipeline rank (plan/wholerun/data_parallel.py): which collective each sharding
runs and when, the routed experts over d / ep, fsdp-reshard's per-pass gathers, the optimizer's bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zbsearch.core.layers import Layer
from zbsearch.core.sharding import param_bytes
from zbsearch.plan.wholerun.cluster import NDR400
from zbsearch.plan.wholerun.collectives import all_gather, all_reduce, reduce_scatter
from zbsearch.plan.wholerun.data_parallel import DataParallel, reshard_gathers
from zbsearch.plan.wholerun.parallel_layers import LayerParams

PARTS = param_bytes(2, "adam")  # bf16 weights and gradients, fp32 master, Adam: 2, 2, 4, 8
HBM = 3.35e12 / 1e6  # H100 bytes per microsecond


def group(sharding: str, d: int = 8, ep: int = 1, m: int = 4) -> DataParallel:
    return DataParallel(sharding, d, ep, m, NDR400, PARTS, HBM)


def test_each_sharding_runs_its_collectives() -> None:
    n = 1e8
    ar, rs, ag = all_reduce(2 * n, 8, NDR400), reduce_scatter(2 * n, 8, NDR400), all_gather(2 * n, 8, NDR400)
    ddp = group("ddp").traffic(n, 0)
    assert (ddp.start, ddp.mid, ddp.final) == (0.0, 0.0, pytest.approx(ar))
    for sharding in ("zero1", "fsdp"):
        t = group(sharding).traffic(n, 0)
        assert (t.start, t.mid, t.final) == (pytest.approx(ag), 0.0, pytest.approx(rs))
    zero2 = group("zero2").traffic(n, 0)
    assert (zero2.start, zero2.mid, zero2.final) == (pytest.approx(ag), pytest.approx(3 * rs), pytest.approx(rs))
    reshard = group("fsdp-reshard").traffic(n, 0)
    assert (reshard.start, reshard.mid, reshard.final) == (0.0, 0.0, pytest.approx(rs))


def test_the_optimizer_reads_and_writes_its_shard() -> None:
    n = 1e8
    assert group("ddp").traffic(n, 0).optimizer == pytest.approx(n * 28 / HBM)
    assert group("zero1").traffic(n, 0).optimizer == pytest.approx(n / 8 * 28 / HBM)


def test_routed_experts_sync_over_the_ranks_holding_them() -> None:
    n = 1e8
    t = group("zero1", d=8, ep=4).traffic(0, n)
    assert t.final == pytest.approx(reduce_scatter(2 * n, 2, NDR400))
    assert t.optimizer == pytest.approx(n / 2 * 28 / HBM)


def test_fsdp_reshard_adds_what_a_gather_takes_beyond_the_previous_pass() -> None:
    layers = [Layer("a", 1.0, 0.0, 1.0, full_backward=1.0), Layer("b", 1.0, 50.0, 1.0, full_backward=51.0),
              Layer("c", 1000.0, 1.0, 1.0, full_backward=2.0)]
    params = [LayerParams(x.name, 1e8) for x in layers]
    dp = group("fsdp-reshard")
    gather = dp.layer_gather(params[0])
    out = reshard_gathers(layers, params, dp)
    assert [x.F for x in out] == pytest.approx([1 + gather, 1 + gather - 1, 1000 + gather - 1])
    # I: prefetched behind the next layer's I; the embedding-like first layer (no I) gathers nothing there
    assert [x.B for x in out] == pytest.approx([0.0, 50 + gather - 1, 1 + gather])
    assert out[1].full_backward == pytest.approx(51 + gather - 1)
    assert reshard_gathers(layers, params, replace(dp, sharding="fsdp")) == tuple(layers)
