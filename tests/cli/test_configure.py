"""`zbsearch configure` through typer's CliRunner: the ranked table, the certificate, the chosen plan's file,
the results file reused on a rerun, and bad input as one line naming the flag."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from zbsearch.cli import configure as configure_cli
from zbsearch.cli import configure_page, configure_table
from zbsearch.cli.app import app
from zbsearch.core.errors import ScheduleError
from zbsearch.core.ir import Schedule
from zbsearch.core.planned_profile import for_plan
from zbsearch.plan.wholerun import chosen as chosen_module
from zbsearch.plan.wholerun import exports
from zbsearch.plan.wholerun.cluster import make_cluster
from zbsearch.plan.wholerun.cost import shape_costs
from zbsearch.plan.wholerun.shape import RunShape
from zbsearch.plan.wholerun.workload import Workload
from zbsearch.profiling.request import LlamaShape
from zbsearch.sim import validate
from zbsearch.sim.validate import check

runner = CliRunner()
TINY = ["--model", "llama", "--layers", "4", "--hidden", "256", "--heads", "4", "--seq", "128", "--vocab", "1024",
        "--global-batch", "8", "--gpus", "4", "--gpus-per-node", "4", "--micro-batch", "1,2", "--time-limit", "0.5"]


def invoke(*args: object):
    return runner.invoke(app, ["configure", *[str(a) for a in args]], env={"COLUMNS": "300"})


def one_line_error(result) -> str:
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_configure_chooses_the_fastest_shape_certifies_it_and_reuses_its_results(tmp_path: Path) -> None:
    results, plan = tmp_path / "shapes.jsonl", tmp_path / "plan.json"
    first = invoke(*TINY, "--results", results, "-o", plan, "--json")
    assert first.exit_code == 0, first.stderr
    table = json.loads(first.stdout)
    chosen, ranked = table["chosen"], table["ranked"]
    steps = [r["timing"]["step_us"] for r in ranked]
    assert chosen["timing"]["step_us"] == min(steps) and steps == sorted(steps)
    assert all(p["bound"] >= chosen["timing"]["step_us"] for p in table["pruned"])
    cert = table["certificate"]
    assert 0 <= cert["gap"] and math.isclose(cert["step"] / cert["bound"] - 1, cert["gap"])
    assert cert["bound"] <= chosen["timing"]["step_us"]
    # the plan file is the chosen shape's schedule, valid on that shape's own profile
    shape = RunShape.from_dict(chosen["shape"])
    workload = Workload(LlamaShape(layers=4, hidden=256, heads=4, seq=128, vocab=1024), 8)
    schedule = Schedule.load(plan)
    profile = shape_costs(workload, make_cluster("h100", 4, 4), shape).profile
    assert schedule.num_ranks == shape.p and check(schedule, for_plan(profile, schedule)).ok
    lines = results.read_text().splitlines()
    again = invoke(*TINY, "--results", results, "--json")
    assert again.exit_code == 0 and json.loads(again.stdout) == table
    assert results.read_text().splitlines() == lines  # nothing solved again


def test_configure_prints_the_table_the_users_configuration_and_the_certificate() -> None:
    result = invoke(*TINY, "--current", "tp2 pp2 ddp b1")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    assert "shapes solved, fastest first" in out and "chosen: tp" in out
    assert "your configuration tp2 pp2 dp1 ddp b1 m8" in out or "now" in out
    assert "certificate: under this cost model no shape in the space" in out


@pytest.mark.parametrize("args, flag", [
    (["--gpus", "12", "--gpus-per-node", "8"], "--gpus"),
    (["--inter-gbps", "-3"], "--inter-gbps"),
    (["--link-efficiency", "1.5"], "--link-efficiency"),
    (["--current", "tp3 pp2"], "--current"),
    (["--current", "tp1 pp2 shiny"], "--current"),
    (["--gpu-memory", "lots"], "--gpu-memory"),
    (["--sharding", "zero9"], "--sharding"),
    (["--mfu", "1.5"], "--mfu"),
    (["--global-batch", "3", "--micro-batch", "2"], "--micro-batch"),
    (["--tp", "3"], "--tp"),
    (["--schedules", "zb-only"], "--schedules"),
    (["--schedules", "1f1b-family", "--placement", "v"], "--placement"),
])
def test_bad_input_is_one_line_naming_the_flag(args: list[str], flag: str) -> None:
    message = one_line_error(invoke(*TINY, *args))
    assert flag in message


def test_a_results_file_of_other_arguments_is_refused(tmp_path: Path) -> None:
    results = tmp_path / "shapes.jsonl"
    assert invoke(*TINY, "--pp", "1", "--results", results).exit_code == 0
    before = results.read_text()
    message = one_line_error(invoke(*TINY, "--pp", "2", "--results", results))
    assert "--results" in message and "other arguments" in message
    assert results.read_text() == before


def test_a_gpt_model_is_refused_with_the_models_that_work() -> None:
    message = one_line_error(invoke("--model", "gpt3-2.7b", "--global-batch", "8", "--gpus", "8"))
    assert "--model llama" in message


def test_export_dir_writes_the_chosen_plan_for_both_trainers_and_an_unwritable_one_nothing(tmp_path: Path) -> None:
    result = invoke(*TINY, "--export-dir", tmp_path / "run", "--torchtitan", "main", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["chosen"] is not None  # stdout stays the JSON; the export's lines are on stderr
    written = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert written == ["megatron_args.txt", "plan.json", "schedule.csv", "schedule.json", "torchtitan_config.py"]
    first = result.stderr.splitlines()[0]
    assert first.startswith("wrote ") and "torchtitan_config.py" in first and "megatron_args.txt" in first
    (tmp_path / "a-file").write_text("")
    message = one_line_error(invoke(*TINY, "--pp", "1", "--export-dir", tmp_path / "a-file" / "run"))
    assert "--export-dir" in message and "cannot write the exports" in message
    assert one_line_error(invoke(*TINY, "--torchtitan", "0.9", "--export-dir", tmp_path)).startswith("error: --torchtitan")


def test_one_run_validates_the_chosen_plan_once_for_all_the_files_it_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-o, --html and --export-dir together rebuild and validate the chosen plan once (chosen_plan), not once
    per file: the validator is counted in every module on the way from the search's end to the files (set
    even where a module does not import it now, so that a writer that checks again is counted too). A chosen
    plan that does not validate is an internal error (exit 3), and no file is written."""
    calls: list[str] = []

    def counted(schedule: Schedule, *args: Any, **kwargs: Any) -> validate.ValidationReport:
        calls.append(schedule.name)
        return validate.check(schedule, *args, **kwargs)

    for module in (configure_cli, configure_table, configure_page, chosen_module, exports):
        monkeypatch.setattr(module, "check", counted, raising=False)
    monkeypatch.setattr(configure_page, "quality_of", lambda *args, **kwargs: None)  # its searches: not the test's
    plan, page, run, results = tmp_path / "plan.json", tmp_path / "run.html", tmp_path / "run", tmp_path / "r.jsonl"
    args = [*TINY, "--pp", "2", "--results", results, "--json"]
    result = invoke(*args, "-o", plan, "--html", page, "--export-dir", run)
    assert result.exit_code == 0, result.stderr
    assert Schedule.load(plan).to_dict() == json.loads(result.stdout)["chosen"]["plan"]
    assert 'id="timeline"' in page.read_text() and (run / "schedule.json").read_text() == plan.read_text()
    assert len(calls) == 1, calls

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ScheduleError("the chosen plan does not validate", subject="chosen")

    monkeypatch.setattr(configure_cli, "chosen_plan", broken)
    again = [tmp_path / "again.json", tmp_path / "again.html", tmp_path / "again"]
    failed = invoke(*args, "-o", again[0], "--html", again[1], "--export-dir", again[2])  # the results reused
    assert failed.exit_code == 3 and failed.stderr.startswith("internal error: the chosen plan"), failed.stderr
    assert not any(path.exists() for path in again)


def test_the_1f1b_family_baseline_plans_every_shape_with_1f1b_or_interleaved_1f1b() -> None:
    result = invoke(*TINY, "--pp", "2", "--schedules", "1f1b-family", "--json")
    assert result.exit_code == 0, result.stderr
    table = json.loads(result.stdout)
    assert table["ranked"] and table["certificate"] is not None
    assert {r["schedule_name"] for r in table["ranked"]} <= {"1f1b", "interleaved-1f1b"}
    assert all(r["step_bound_us"] == r["timing"]["step_us"] for r in table["ranked"])  # the family enumerated whole


def test_plan_refuses_a_micro_batch_its_profile_was_not_made_for(tmp_path: Path) -> None:
    profile = tmp_path / "llama.json"
    made = runner.invoke(app, ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "4",
                               "--hidden", "256", "--heads", "4", "--seq", "128", "-p", "2", "-o", str(profile)])
    assert made.exit_code == 0, made.stderr
    result = runner.invoke(app, ["plan", "--profile", str(profile), "--global-batch", "16", "--dp", "2",
                                 "--micro-batch", "2", "--mem-limit", "none"])
    message = one_line_error(result)
    assert "--micro-batch 2" in message and "made for microbatches of 1" in message
    ok = runner.invoke(app, ["plan", "--profile", str(profile), "--global-batch", "16", "--dp", "2",
                             "--micro-batch", "1", "--mem-limit", "none"])
    assert ok.exit_code == 0, ok.stderr
