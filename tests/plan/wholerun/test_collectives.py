"""Collectives over a link (alpha-beta): one GPU is free, a ring moves 2(n-1)/n (all-reduce) or (n-1)/n
(all-gather, reduce-scatter, all-to-all) of the bytes per GPU in n - 1 steps (2(n - 1) for all-reduce)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zbsearch.core.errors import PlanError
from zbsearch.plan.wholerun.cluster import NDR400, Link
from zbsearch.plan.wholerun.collectives import all_gather, all_reduce, all_to_all, point_to_point, reduce_scatter

NO_LATENCY = replace(NDR400, latency_us=0.0)
NO_BANDWIDTH_COST = Link("ideal", 1e12, 7.0, "test", efficiency=1.0)  # time is the latency steps, nearly


@pytest.mark.parametrize("op", [all_reduce, all_gather, reduce_scatter, all_to_all])
def test_one_gpu_or_no_bytes_cost_nothing(op) -> None:
    assert op(1e9, 1, NDR400) == 0.0 and op(0.0, 8, NDR400) == 0.0


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_volumes_follow_the_ring(n: int) -> None:
    nbytes = 3e8
    seconds = nbytes / NO_LATENCY.bytes_per_us  # the whole tensor once over the link, in microseconds
    assert all_reduce(nbytes, n, NO_LATENCY) == pytest.approx(2 * (n - 1) / n * seconds)
    for op in (all_gather, reduce_scatter, all_to_all):
        assert op(nbytes, n, NO_LATENCY) == pytest.approx((n - 1) / n * seconds)
    assert point_to_point(nbytes, NO_LATENCY) == pytest.approx(seconds)


@pytest.mark.parametrize("n", [2, 8])
def test_latency_is_paid_per_step(n: int) -> None:
    assert all_reduce(8.0, n, NO_BANDWIDTH_COST) == pytest.approx(2 * (n - 1) * 7.0)
    assert all_gather(8.0, n, NO_BANDWIDTH_COST) == pytest.approx((n - 1) * 7.0)
    assert point_to_point(8.0, NO_BANDWIDTH_COST) == pytest.approx(7.0)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(PlanError, match="whole number of GPUs"):
        all_gather(1.0, 0, NDR400)
    with pytest.raises(PlanError, match="non-negative size"):
        reduce_scatter(-1.0, 2, NDR400)
