"""`zbsearch solve --json` keeps its keys: the lists below were printed by the build before the search
was split into subpackages and its diagnostics became a record (commit 311df30), so a change to the
records that drops, renames or reorders a key fails here. Keys a solve writes only when it reached that
stage in its time (a CP-SAT round, the windows, ...) may come or go between runs of one case: they are
listed in STAGES, in the order the records write them, and each case fixes the rest."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app

SUMMARY = ["schedule", "placement", "ranks", "stages", "microbatches", "profile", "time_unit", "makespan", "span",
           "bubble_rate_makespan", "bubble_rate_span", "work_per_rank", "idle_per_rank", "span_per_rank",
           "peak_memory_per_rank", "peak_memory_bytes_per_rank", "param_copies", "static_bytes_per_rank",
           "mem_limit", "valid", "imbalance", "schedule_share_makespan", "schedule_share_span",
           "memory_model"]  # memory_model: added with issue 28 (reports name their accounting)
SEARCH = ["objective", "objective_value", "lower_bound", "bubble_rate_lower_bound", "gap", "status",
          "solve_seconds", "start_heuristic", "heuristic_objective", "schedule_share", "cpsat_status"]
GRID = ["grid_step", "cpsat_seconds", "grid_rounds"]
PARTITION = ["own_split_bound", "any_split_bound", "any_split_bound_by_placement", "splits_scored",
             "partition_rule", "partition"]
CAP = ["uncapped_bound"]  # added with issue 39: what the pipeline needs without the memory limit (a bound)
# written only where the solve got that far
STAGES = ["cpsat_bound", "tuned_start", "periodic_start", "grid_step", "cpsat_seconds", "rejected", "gave_up",
          "grid_rounds", "lns_windows", "lns_accepted", "lns_improved", "lns_rejected", "lns", "fused_backwards",
          "split_origin", "pair_bound", "pair_bound_ranks", "pair_bound_proven", "pair_bound_pairs_tried",
          "pair_bound_seconds"]
# every key in the order SolveReport.to_dict writes them
ORDER = (SUMMARY + SEARCH + STAGES[:STAGES.index("fused_backwards") + 1] + ["placements", "split_origin"]
         + PARTITION + CAP + STAGES[STAGES.index("pair_bound"):])
ROUND_STAGES = ["rejected", "gave_up"]  # a grid round's, where it had them


CASES = {
    # proven optimal by the heuristics and the bounds: CP-SAT never runs
    "bounds": (["--uniform", "1,2,1", "-p", "4", "-m", "8", "--mem-limit", "1p", "--placement", "v"],
               SUMMARY + SEARCH + ["placements"] + CAP),
    # CP-SAT runs on a grid
    "grid": (["--uniform", "1,2,1", "-p", "4", "-m", "8", "--mem-limit", "0.75p", "--objective", "span"],
             SUMMARY + SEARCH + GRID + ["placements"] + CAP),
    # the joint search over splits of a layered profile (its polish may or may not reach a CP-SAT round in 10 s)
    "partition": (["--profile", "profiles/h100.json", "--mem-limit", "2p"], SUMMARY + SEARCH + PARTITION + CAP),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_solve_json_keys_are_the_previous_builds(case: str) -> None:
    args, keys = CASES[case]
    result = CliRunner().invoke(app, ["solve", *args, "--time-limit", "10", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) <= set(ORDER) and list(out) == sorted(out, key=ORDER.index)
    assert [key for key in out if key in keys] == keys
    assert set(out) - set(keys) <= set(STAGES)
    for placement in out.get("placements", {}).values():
        assert list(placement) == ["objective", "lower_bound", "status"]
    for grid_round in out.get("grid_rounds", []):
        assert list(grid_round) == ["grid_step", "cpsat_status", "cpsat_seconds",
                                    *[key for key in ROUND_STAGES if key in grid_round]]
    if "partition" in out:
        assert list(out["partition"]) == ["rule", "layers_per_chunk", "chunks", "ranks"]
        assert list(out["partition"]["ranks"][0]) == ["rank", "chunks", "static_bytes", "peak_activation_bytes",
                                                      "total_bytes", "cap_bytes", "fits"]
