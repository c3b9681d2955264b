"""Where the bubble comes from (issue 12, item 7): the imbalance between stages, which no schedule
removes, and what the schedule adds on top of it, in summaries, reports and the planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.profile import Profile
from zbsearch.plan.microbatches import microbatches_for_target
from zbsearch.plan.planner import plan
from zbsearch.report.render import bubble_split
from zbsearch.schedules import REGISTRY, generate
from zbsearch.sim.simulate import simulate
from zbsearch.sim.summary import imbalance, summarize

# Per microbatch, the three stages work F+B+W = 3, 4 and 6.
THREE = Profile.from_dict({"stages": [{"F": 1, "B": 1, "W": 1}, {"F": 1, "B": 2, "W": 1}, {"F": 2, "B": 2, "W": 2}],
                           "microbatches": 2, "source": {"kind": "estimated", "method": "test"}})


def hetero(p: int, m: int, full_backward: bool = False) -> Profile:
    """bench/results_hetero.py's profile: first stage 1.2x, last 1.5x, comm 5."""
    stages = []
    for r in range(p):
        k = 1.2 if r == 0 else 1.5 if r == p - 1 else 1.0
        stage = {"F": 100 * k, "B": 100 * k, "W": 80 * k, "mem_B": k, "mem_W": 0.5 * k}
        if full_backward:
            stage["full_backward"] = 170 * k
        stages.append(stage)
    return Profile.from_dict({"name": f"hetero p={p}", "stages": stages, "microbatches": m, "comm": 5.0,
                              "source": {"kind": "estimated", "method": "test"}})


def test_imbalance_of_a_three_rank_profile_by_hand():
    # GPipe, m = 2: works 6, 8, 12 (mean 26/3). Forwards end at 1, 2 and 6 on ranks 0..2; the fused
    # backwards (2, 3, 4 long) run 6-10 and 10-14 on rank 2, 10-13 and 14-17 on rank 1, 13-15 and 17-19
    # on rank 0: T = 19 for makespan and span alike.
    summary = summarize(simulate(generate("gpipe", 3, 2), THREE))
    assert summary.work_per_rank == [6.0, 8.0, 12.0]
    assert summary.makespan == summary.span == 19.0
    assert summary.bubble_rate_makespan == pytest.approx(31 / 57, abs=1e-15)   # 1 - 26 / (3 x 19)
    assert summary.imbalance == pytest.approx(5 / 18, abs=1e-15)                # 1 - (26/3) / 12
    assert summary.schedule_share_makespan == pytest.approx(91 / 342, abs=1e-15)  # 31/57 - 5/18
    assert summary.schedule_share_span == summary.schedule_share("span") == summary.schedule_share_makespan
    assert bubble_split(summary) == ("bubble 54.39% of makespan = 27.78% imbalance (the stage split) + 26.61% "
                                     "schedule; 54.39% of span = 27.78% + 26.61% schedule")
    assert bubble_split(summary, ("span",)) == "bubble 54.39% of span = 27.78% imbalance (the stage split) + 26.61% schedule"
    assert imbalance([4.0, 4.0]) == 0.0 and imbalance([]) == 0.0 and imbalance([0.0, 0.0]) == 0.0


@pytest.mark.parametrize("full_backward", [False, True])
def test_schedule_share_is_never_negative_on_unequal_stages(full_backward):
    prof = hetero(4, 8, full_backward)
    for name, record in REGISTRY.items():
        assert not record.ranks_rule(4) and not record.problem(4, 8, 2), name
        summary = summarize(simulate(generate(name, 4, 8, 2 if record.takes_chunks else None), prof))
        heaviest = max(summary.work_per_rank)
        assert heaviest <= min(summary.makespan, summary.span) + 1e-9, name  # why the share cannot be negative
        for objective in ("makespan", "span"):
            share = summary.schedule_share(objective)
            assert share >= 0.0, (name, objective)
            assert summary.imbalance + share == pytest.approx(summary.bubble_rate(objective), abs=1e-12), name
        if not full_backward:  # every rank works m (F + B + W): 336, 280, 280, 420 per microbatch
            assert summary.imbalance == pytest.approx(1 - 329 / 420, abs=1e-12), name
    # DualPipe keeps the busiest rank busy from start to end: its whole bubble is the imbalance.
    dualpipe = summarize(simulate(generate("dualpipe", 4, 8), hetero(4, 8)))
    assert dualpipe.schedule_share_makespan == pytest.approx(0.0, abs=1e-12)


PLAN_NOTE = ("the bubble fraction never goes below 0.2167, the imbalance between stages (1 - mean rank work / the "
             "busiest rank's): no schedule and no microbatch count removes it, only a different split of the "
             "layers into stages")


def test_a_target_below_the_stage_imbalance_is_never_met_and_says_why():
    found = microbatches_for_target("zb-h1", 4, 0.2, profile=hetero(4, 8))
    assert found.m is None and found.imbalance_floor == pytest.approx(1 - 329 / 420, abs=1e-12)
    assert found.note == PLAN_NOTE
    result = plan(hetero(4, 8), 8, target=0.2)
    assert result.imbalance == pytest.approx(1 - 329 / 420, abs=1e-12)
    assert len(result.imbalance_bound_rows) == len(result.rows) == len(REGISTRY)
    assert result.to_dict()["schedules"][0]["target_imbalance_floor"] == found.imbalance_floor
    # Above the floor the answer is an m again.
    assert plan(hetero(4, 8), 8, target=0.3).imbalance_bound_rows == ()


def test_cli_plan_points_at_a_different_layer_split(tmp_path: Path):
    path = tmp_path / "hetero.json"
    path.write_text(json.dumps(hetero(4, 8).to_dict()))
    result = CliRunner().invoke(app, ["plan", "--profile", str(path), "--target-bubble", "0.2"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert ("never below 20% (any schedule): the floor is the imbalance between stages, 21.67% (1 - mean rank work / "
            "the busiest rank's), which no schedule or m removes; only a different layer split does: try zbsearch "
            "solve --partition auto") in lines
    assert not any(" target: " in line for line in lines)  # one line for all, not one per schedule
    assert lines[-1].startswith("recommend: dualpipe: smallest bubble (21.67% of the iteration = 21.67% imbalance + "
                                "0.00% schedule, makespan)")


def test_cli_solve_shows_the_split(tmp_path: Path):
    path = tmp_path / "three.json"
    path.write_text(json.dumps(THREE.to_dict()))
    args = ["solve", "--profile", str(path), "--mem-limit", "none", "--time-limit", "5"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    data = json.loads(CliRunner().invoke(app, args + ["--json"]).stdout)
    assert data["imbalance"] == pytest.approx(5 / 18, abs=1e-15)
    assert data["schedule_share"] == data["schedule_share_makespan"] >= 0.0
    split = (f"bubble {100 * data['bubble_rate_makespan']:.2f}% of makespan = 27.78% imbalance (the stage split) + "
             f"{100 * data['schedule_share_makespan']:.2f}% schedule; {100 * data['bubble_rate_span']:.2f}% of span = "
             f"27.78% + {100 * data['schedule_share_span']:.2f}% schedule")
    assert split in result.stdout.splitlines()
