"""The summary every command prints: memory units and the memory curve."""

from __future__ import annotations

import pytest

from zbsearch.core.profile import Profile
from zbsearch.sim.summary import summarize
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate


def test_memory_curve_in_stage_units_ends_at_zero_and_peaks_at_the_reported_peak():
    stages = [{"F": 1, "B": 1, "W": 1, "mem_B": 4e9, "mem_W": 1e9}, {"F": 1, "B": 1, "W": 1, "mem_B": 2e9, "mem_W": 1e9}]
    prof = Profile.from_dict({"stages": stages, "memory_unit": "bytes", "microbatches": 3,
                              "source": {"kind": "estimated", "method": "test"}})
    summary = summarize(simulate(generate("zb-h1", 2, 3), prof), memory_curve=True)
    # The last rank defers its first W (ZB-H1), so it holds mem_W beside the next F: 2e9 + 1e9.
    assert summary.peak_memory_bytes_per_rank == [8e9, 3e9]
    assert summary.peak_memory_per_rank == [2.0, 1.5]
    for r, curve in enumerate(summary.memory_curve_per_rank):
        levels = [level for _, level in curve]
        assert max(levels) == pytest.approx(summary.peak_memory_per_rank[r])
        assert levels[-1] == pytest.approx(0.0)
        times = [t for t, _ in curve]
        assert times == sorted(times)
    # B frees mem_B - mem_W: on rank 1 (mem_B 2e9, mem_W 1e9) a B takes the level down by 0.5 stage units.
    assert summary.memory_curve_per_rank[1][:2] == [[1.0, 1.0], [3.0, 0.5]]


def test_no_curve_unless_asked():
    prof = Profile.from_dict({"stages": [{"F": 1, "B": 1, "W": 1}] * 2, "source": {"kind": "estimated", "method": "t"}})
    summary = summarize(simulate(generate("1f1b", 2, 2), prof))
    assert summary.memory_curve_per_rank is None
    assert "memory_curve_per_rank" not in summary.to_dict()


SUMMARY_KEYS = ["schedule", "placement", "ranks", "stages", "microbatches", "profile", "time_unit", "makespan", "span",
                "bubble_rate_makespan", "bubble_rate_span", "work_per_rank", "idle_per_rank", "span_per_rank",
                "peak_memory_per_rank", "peak_memory_bytes_per_rank", "param_copies", "static_bytes_per_rank",
                "mem_limit", "valid", "imbalance", "schedule_share_makespan", "schedule_share_span", "memory_model"]


def test_to_dict_keeps_the_json_keys_in_order_with_the_optional_ones_last():
    from dataclasses import replace

    from zbsearch.core.memory import parse_mem_limit

    prof = Profile.from_dict({"stages": [{"F": 1, "B": 2, "W": 1}] * 2, "microbatches": 4,
                              "source": {"kind": "estimated", "method": "t"}})
    summary = summarize(simulate(generate("zb-h1", 2, 4), prof), parse_mem_limit("1p", prof), valid=False,
                        memory_curve=True)
    assert list(replace(summary, memory_curve_per_rank=None).to_dict()) == SUMMARY_KEYS
    out = replace(summary, reason="rank 0 holds 3 x M_B").to_dict()
    assert list(out) == SUMMARY_KEYS + ["memory_curve_per_rank", "reason"]
    assert out["mem_limit"] == "1p" and out["valid"] is False and out["reason"] == "rank 0 holds 3 x M_B"
    assert out["makespan"] == summary.makespan == summary.cost("makespan")
    assert summary.bubble_rate("span") == summary.bubble_rate_span
    assert summary.peak_memory == max(summary.peak_memory_per_rank)
