"""solve/report.py: the solver's records. SolveDetails.to_dict (key order, absent fields left out, the last
grid round's fields with the solve's own status), GridRound, PlacementOutcome and PartitionDetails as
dicts, SolveResult.gap, and report().to_dict(): the summary's keys, then the search's, then the details'."""

from __future__ import annotations

import dataclasses

import pytest

from zbsearch.core.ir import linear
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.objective import Status
from zbsearch.core.profile import uniform_profile
from zbsearch.search.exact.lns_report import LnsStats
from zbsearch.search.problem import Problem
from zbsearch.search.solve.report import (GridRound, PartitionDetails, PlacementOutcome, SolveDetails, SolveResult,
                                          SplitFacts)
from zbsearch.search.solve.starts import Origin, one_at_a_time, valid_start
from zbsearch.sim.summary import summarize

SEARCH_KEYS = ["objective", "objective_value", "lower_bound", "bubble_rate_lower_bound", "gap", "status",
               "solve_seconds", "start_heuristic", "heuristic_objective", "schedule_share"]


def _partition(origin: str | None) -> PartitionDetails:
    return PartitionDetails("auto", 90.0, 85.0, {"linear": {"bound": 85.0}}, 12, SplitFacts("auto", (2,), (("a", "b"),), ()),
                            origin)


def test_default_details_are_the_status_alone() -> None:
    assert SolveDetails().to_dict() == {"cpsat_status": "not run"}


def test_every_detail_in_the_order_the_solver_reached_it() -> None:
    rounds = (GridRound(2.0, Status.OPTIMAL, 0.5), GridRound(1.0, Status.FEASIBLE, 1.25, "grid model infeasible"))
    details = SolveDetails("feasible", "not used: pairs", Origin("zb-h1", 7), Origin("greedy"), rounds,
                           LnsStats(3, 2, 1, 0), None, 4, {"linear": PlacementOutcome(10.0, 9.0, Status.FEASIBLE)},
                           _partition("even"))
    out = details.to_dict()
    assert list(out) == ["cpsat_status", "cpsat_bound", "tuned_start", "periodic_start", "grid_step", "cpsat_seconds",
                         "rejected", "grid_rounds", "lns_windows", "lns_accepted", "lns_improved", "lns_rejected",
                         "fused_backwards", "placements", "split_origin", "own_split_bound", "any_split_bound",
                         "any_split_bound_by_placement", "splits_scored", "partition_rule", "partition"]
    # The last round's step, time and reason at top level; the rounds in order below.
    assert (out["grid_step"], out["cpsat_seconds"], out["rejected"]) == (1.0, 1.25, "grid model infeasible")
    assert out["grid_rounds"] == [r.to_dict() for r in rounds]
    assert out["tuned_start"] == {"from": "zb-h1", "found_at_evaluation": 7}
    assert out["periodic_start"] == {"from": "greedy"}
    assert out["placements"] == {"linear": {"objective": 10.0, "lower_bound": 9.0, "status": Status.FEASIBLE}}
    assert (out["lns_windows"], out["lns_accepted"], out["lns_improved"], out["lns_rejected"]) == (3, 2, 1, 0)
    assert out["fused_backwards"] == 4 and out["partition"] == {"rule": "auto", "layers_per_chunk": [2], "chunks": [["a", "b"]], "ranks": []} and out["split_origin"] == "even"


def test_the_solves_status_wins_over_the_last_rounds_and_keeps_its_place() -> None:
    details = SolveDetails("skipped: too little time left", grid_rounds=(GridRound(1.0, Status.OPTIMAL, 0.1),))
    out = details.to_dict()
    assert list(out)[0] == "cpsat_status" and out["cpsat_status"] == "skipped: too little time left"
    assert out["grid_rounds"][0]["cpsat_status"] is Status.OPTIMAL


def test_absent_details_are_left_out_and_the_lns_reason_takes_its_key() -> None:
    out = SolveDetails("optimal", lns_not_run="the start pairs passes", fused_backwards=0).to_dict()
    assert out == {"cpsat_status": "optimal", "lns": "the start pairs passes", "fused_backwards": 0}
    for absent in ("cpsat_bound", "tuned_start", "periodic_start", "grid_rounds", "grid_step", "placements",
                   "partition", "lns_windows"):
        assert absent not in out


@pytest.mark.parametrize("rejected,gave_up,keys", [
    (None, False, ["grid_step", "cpsat_status", "cpsat_seconds"]),
    ("no", False, ["grid_step", "cpsat_status", "cpsat_seconds", "rejected"]),
    (None, True, ["grid_step", "cpsat_status", "cpsat_seconds", "gave_up"]),
])
def test_a_grid_round_as_a_dict(rejected: str | None, gave_up: bool, keys: list[str]) -> None:
    out = GridRound(0.5, Status.UNKNOWN, 2.0, rejected, gave_up).to_dict()
    assert list(out) == keys
    assert out["grid_step"] == 0.5 and out["cpsat_status"] == "unknown" and out["cpsat_seconds"] == 2.0


def test_partition_details_name_the_origin_first_only_when_known() -> None:
    assert "split_origin" not in _partition(None).to_dict()
    assert list(_partition("moved").to_dict())[0] == "split_origin"
    assert _partition(None).to_dict()["partition_rule"] == "auto"


def _result(lower_bound: float, objective: float | None = None, details: SolveDetails | None = None) -> SolveResult:
    # p=2, m=2, F = B = W = 1, one microbatch at a time: makespan 10 (5 per microbatch), work 6 per rank.
    prof = uniform_profile(1, 1, 1, p=2, m=2)
    problem = Problem(prof, linear(2), 2, parse_mem_limit("1p", prof), "makespan")
    start = valid_start(problem, one_at_a_time(problem))
    assert start is not None and start.objective == pytest.approx(10.0)
    value = start.objective if objective is None else objective
    return SolveResult(problem, start.schedule, start.timeline, value, lower_bound, Status.FEASIBLE, 0.25, start.name,
                       start.objective, details or SolveDetails())


@pytest.mark.parametrize("lower_bound,objective,gap", [
    (9.0, None, 0.1), (10.0, None, 0.0), (8.0, None, 0.2),
    (11.0, None, 0.0),  # a bound above the objective gives no negative gap
    (1.0, 0.0, 0.0),  # an objective of 0 has no gap
])
def test_the_gap_is_the_share_of_the_objective_the_bound_leaves(lower_bound: float, objective: float | None,
                                                                gap: float) -> None:
    assert _result(lower_bound, objective).gap == pytest.approx(gap)


def test_the_report_has_the_summary_then_the_search_then_the_details() -> None:
    details = SolveDetails("optimal", fused_backwards=2)
    result = _result(8.0, details=details)
    out = result.report().to_dict()
    summary = list(summarize(result.timeline, result.problem.limit).to_dict())
    assert list(out) == summary + SEARCH_KEYS + list(details.to_dict())
    # Work 12 over 2 ranks under a bound of 8: a bubble of at least 1 - 12 / 16 = 0.25.
    assert out["bubble_rate_lower_bound"] == pytest.approx(0.25)
    assert out["gap"] == pytest.approx(0.2) and out["objective_value"] == pytest.approx(10.0)
    assert out["objective"] == "makespan" and out["status"] == "feasible" and out["start_heuristic"] == "one-at-a-time"
    assert out["cpsat_status"] == "optimal" and out["fused_backwards"] == 2
    assert _result(0.0).report().bubble_rate_lower_bound == 0.0  # no bound: nothing proven


def test_the_records_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SolveDetails().cpsat_status = "optimal"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        _result(9.0).objective = 1.0  # type: ignore[misc]
