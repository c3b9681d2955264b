"""Reports name the memory accounting they count in, solve can switch it, and a plan for torch's runtime
made with the paper's accounting says so (issue 28, deliverable 1)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.ir import Schedule
from zbsearch.core.partition import counts_of, partition_profile
from zbsearch.core.planned_profile import for_plan
from zbsearch.core.profile import load_profile
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate
from zbsearch.sim.summary import summarize

runner = CliRunner()


@pytest.fixture(scope="module")
def paper_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("acct") / "llama.json"
    result = runner.invoke(app, ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "4",
                                 "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "2",
                                 "-m", "4", "--memory-model", "paper", "-o", str(path)])
    assert result.exit_code == 0, result.stderr
    assert load_profile(path).memory_model == "paper"
    return path


def test_solve_reports_and_switches_the_accounting(paper_profile: Path) -> None:
    args = ["solve", "--profile", str(paper_profile), "--mem-limit", "2p", "--time-limit", "2"]
    paper = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    torch = json.loads(runner.invoke(app, [*args, "--json", "--memory-model", "torch-runtime"]).stdout)
    assert (paper["memory_model"], torch["memory_model"]) == ("paper", "torch-runtime")
    text = runner.invoke(app, [*args, "--dp-shard", "4"], env={"COLUMNS": "400"}).stdout
    assert ("memory: activations under the Zero Bubble paper's accounting; static bytes sharded over 4 "
            "data-parallel ranks (FSDP / ZeRO-3: parameters, gradients and optimizer state)") in text


def test_estimates_plan_with_what_torchs_runtime_holds(paper_profile: Path) -> None:
    """The same schedule peaks higher under torch's accounting: its I keeps the graph and the gradients for W."""
    paper = load_profile(paper_profile)
    torch = replace(paper, memory_model="torch-runtime")
    schedule = generate("zb-h1", 2, 4)
    assert all(simulate(schedule, torch).peak_memory(r) > simulate(schedule, paper).peak_memory(r) for r in (0, 1))
    block = paper.layers[1]
    assert block.mem_W_torch > block.mem_B == block.mem_B_torch  # held from I until W: more than from F until I


def test_a_torch_export_planned_with_the_papers_accounting_warns(paper_profile: Path, tmp_path: Path) -> None:
    args = ["solve", "--profile", str(paper_profile), "--mem-limit", "2p", "--time-limit", "2",
            "--export-torch", str(tmp_path / "s.csv")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"warning: profile {str(paper_profile)!r} plans with the Zero Bubble paper's memory accounting, but "
        "--export-torch's CSV runs on torch's runtime, which holds more (its split backward keeps the graph from I "
        "until W): plan with --memory-model torch-runtime"]
    result = runner.invoke(app, [*args, "--memory-model", "torch-runtime"])
    assert result.exit_code == 0 and result.stderr == ""


def test_a_plan_with_recompute_is_costed_with_it_and_exported_where_it_can_be(tmp_path: Path) -> None:
    estimate = ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "4", "--hidden", "256",
                "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "2", "-m", "4", "-o", str(tmp_path / "p.json")]
    assert runner.invoke(app, estimate).exit_code == 0
    plan = tmp_path / "plan.json"
    result = runner.invoke(app, ["solve", "--profile", str(tmp_path / "p.json"), "--mem-limit", "2p", "--time-limit", "2",
                                 "--recompute", "fixed:layers.1", "--placement", "linear", "-o", str(plan)])
    assert result.exit_code == 0, result.stderr
    assert json.loads(plan.read_text())["plan"]["recompute"] == {"layers.1": "full"}
    solved = runner.invoke(app, ["validate", str(plan), "--profile", str(tmp_path / "p.json")], env={"COLUMNS": "300"})
    assert solved.exit_code == 0, solved.stderr
    # The plan is costed with its recompute: layer 1's I takes its forward again.
    makespan = float(re.search(r"makespan ([\d,.]+) us", solved.stdout).group(1).replace(",", ""))
    schedule = Schedule.load(plan)
    profile = load_profile(tmp_path / "p.json")
    counts = counts_of(schedule.plan.split.chunks, profile.layers, schedule.placement)
    plain = simulate(schedule, partition_profile(profile, schedule.placement, counts))
    assert makespan > plain.makespan * (1 + 1e-6)
    result = runner.invoke(app, ["export", str(plan), "-f", "torchtitan", "--profile", str(tmp_path / "p.json"),
                                 "-o", str(tmp_path / "plan.csv")])
    assert result.exit_code == 0 and result.stderr == ""  # torchtitan gets the blocks to recompute
    assert "RECOMPUTE_FQNS_PER_MODEL_PART" in (tmp_path / "plan.py").read_text()
    result = runner.invoke(app, ["export", str(plan), "-f", "megatron-layout", "--profile", str(tmp_path / "p.json"),
                                 "-o", str(tmp_path / "plan.args")])
    assert result.exit_code == 0  # Megatron recomputes the first N layers of every stage, not layers.1 alone
    assert result.stderr.startswith("warning: Megatron-LM cannot express this plan's recompute: stage 0 recomputes "
                                    "'layers.1' but not 'layers.0' before it")
    assert "--recompute" not in (tmp_path / "plan.args").read_text()


def test_devices_are_checked_against_the_stages_and_the_shard_degree(paper_profile: Path, tmp_path: Path) -> None:
    args = ["solve", "--profile", str(paper_profile), "--mem-limit", "2p", "--time-limit", "1", "--dp-shard", "4"]
    bad = runner.invoke(app, [*args, "--devices", "12", "-o", str(tmp_path / "s.json")])
    assert bad.exit_code != 0 and not (tmp_path / "s.json").exists()
    assert bad.stderr.strip().splitlines() == [
        "error: --devices: device count 12 does not allow 2 pipeline stages x 4 data-parallel shards (8 GPUs per copy "
        "does not divide 12): use a data-parallel shard degree that divides 6 (1, 2, 3, 6)"]
    assert runner.invoke(app, [*args, "--devices", "16"]).exit_code == 0
    early = runner.invoke(app, ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "4",
                                "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "2",
                                "--devices", "3", "-o", str(tmp_path / "p.json")])
    assert early.exit_code != 0 and "device count 3 does not allow 2 pipeline stages" in early.stderr
    assert not (tmp_path / "p.json").exists()


def test_a_plan_file_is_shown_with_the_memory_solve_printed_for_it(tmp_path: Path) -> None:
    # issue 38: the plan file did not record the sharding and accounting it was solved under, so `show`
    # printed 65.7 GiB of static bytes per rank where `solve --dp-shard 8` had said 4.6.
    h100 = Path(__file__).resolve().parents[2] / "profiles" / "h100.json"
    plan = tmp_path / "plan.json"
    solved = runner.invoke(app, ["solve", "--profile", str(h100), "--mem-limit", "auto", "--dp-shard", "8",
                                 "--memory-model", "torch-runtime", "--time-limit", "1", "-o", str(plan), "--json"])
    assert solved.exit_code == 0, solved.stderr
    said = json.loads(solved.stdout)
    schedule = Schedule.load(plan)
    assert (schedule.plan.sharding.degree, schedule.plan.memory_model) == (8, "torch-runtime")
    again = summarize(simulate(schedule, for_plan(load_profile(h100), schedule))).to_dict()
    for key in ("static_bytes_per_rank", "peak_memory_bytes_per_rank", "makespan"):
        assert again[key] == pytest.approx(said[key]), key
    shown = runner.invoke(app, ["show", str(plan), "--profile", str(h100)])
    assert shown.exit_code == 0, shown.stderr
    gib = [f"{x / 2 ** 30:.3f}" for x in said["static_bytes_per_rank"] + said["peak_memory_bytes_per_rank"]]
    assert all(g in shown.stdout for g in gib)
