"""Measured profiles in place of the estimate: the shipped H200 measurements of the Llama-3-8B-like shares."""

from __future__ import annotations

from pathlib import Path

import pytest

from zbsearch.core.errors import PlanError
from zbsearch.core.profile import load_profile
from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.cost import shape_costs
from zbsearch.plan.wholerun.shape import RunShape
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.presets import PRESETS

ROOT = Path(__file__).resolve().parents[3]
MEASURED = tuple(str(ROOT / "profiles" / f"h200-llama3-8b-tp{t}-measured.json") for t in (1, 2, 4, 8))
SHORT = str(ROOT / "profiles" / "h200-llama3-8b-4blocks-tp8-b2-measured.json")


def _costs(gpu: str, t: int, b: int = 1, measured: tuple[str, ...] = MEASURED):
    workload = Workload(PRESETS["llama3-8b"].shape, 64, preset="llama3-8b", measured=measured).check()
    d = 16 // (2 * t)
    return shape_costs(workload, make_cluster(gpu, 16), RunShape(t, 2, d, b, 64 // (d * b), "fsdp"))


@pytest.mark.parametrize("t", [1, 2, 8])
def test_a_shape_whose_share_was_measured_on_its_gpu_uses_the_measured_layers(t: int) -> None:
    costs = _costs("h200", t)
    measured = load_profile(MEASURED[[1, 2, 4, 8].index(t)])
    assert costs.profile.details["whole_run"]["measured"] == measured.name
    comm = costs.profile.details["whole_run"]["tp_block_us"]
    for got, want in zip(costs.profile.layers[1:-1], measured.layers[1:-1]):
        assert got.F == pytest.approx(want.F + comm) and got.W == want.W
    assert "measured, not estimated" in costs.profile.source["method"]


def test_another_gpu_another_microbatch_or_a_shorter_model_keep_the_estimate() -> None:
    assert _costs("h100", 2).profile.details["whole_run"]["measured"] is None  # measured on an H200
    assert _costs("h200", 2, b=2).profile.details["whole_run"]["measured"] is None  # measured at b = 1
    assert _costs("h200", 8, b=2, measured=(SHORT,)).profile.details["whole_run"]["measured"] is None  # 4 blocks


def test_an_estimate_is_refused_as_a_measurement() -> None:
    with pytest.raises(PlanError, match="not a measured profile") as err:
        Workload(PRESETS["llama3-8b"].shape, 64, measured=(str(ROOT / "profiles" / "h100.json"),)).check()
    assert err.value.subject == "measured"
