"""The library's entry point plans what `zbsearch solve` plans: the same call on the same arguments gives the
same plan, and its errors carry the request field they are about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import zbsearch as zb
from zbsearch.cli.app import app
from zbsearch.core.errors import ZbsearchError
from zbsearch.report import render

ROOT = Path(__file__).resolve().parents[3]
H100 = ROOT / "profiles" / "h100.json"
runner = CliRunner()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small estimated Llama-style profile with layers, recompute options, dtype and optimizer."""
    path = tmp_path_factory.mktemp("find_plan") / "llama.json"
    estimate = ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "6", "--hidden", "256",
                "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "2", "-m", "6", "-o", str(path)]
    assert runner.invoke(app, estimate).exit_code == 0
    return path


def _cli(tmp_path: Path, profile: Path, *flags: str) -> tuple[dict, dict]:
    out = tmp_path / "cli.json"
    result = runner.invoke(app, ["solve", "--profile", str(profile), "--json", "-o", str(out), "--workers", "1",
                                 *flags])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout), json.loads(out.read_text())


# Time limit 0: every timed phase stops at its first check, so both runs take the same path. Under a positive
# limit how many greedy variants run depends on the machine's speed (on h100-2p a 1 s limit leaves 0.1 s for
# 23 variants that take 0.5 s here), and the call and the CLI may then return different plans.
CASES = [  # profile, request fields, the same as flags, time limit
    ("h100", {"mem_limit": "2p"}, ["--mem-limit", "2p"], 0.0),
    ("llama", {"mem_limit": "1.5p", "partition": "auto", "recompute": "auto"},
     ["--mem-limit", "1.5p", "--partition", "auto", "--recompute", "auto"], 0.0),
    ("h100", {"mem_limit": "auto", "dp_shard": 8}, ["--mem-limit", "auto", "--dp-shard", "8"], 0.0),
]


@pytest.mark.parametrize("which, fields, flags, seconds", CASES, ids=["h100-2p", "auto-recompute", "dp-shard"])
def test_the_call_and_the_cli_give_the_same_plan(tmp_path: Path, llama: Path, which: str, fields: dict,
                                                 flags: list[str], seconds: float) -> None:
    path = H100 if which == "h100" else llama
    report, written = _cli(tmp_path, path, *flags, "--time-limit", str(seconds))
    result = zb.find_plan(zb.load_profile(path), zb.PlanRequest(**fields), zb.SearchOptions(seconds, workers=1))
    assert result.report().to_dict()["objective_value"] == report["objective_value"]
    assert result.schedule.to_dict()["actions"] == written["actions"]
    assert result.schedule.plan.to_json() == written["plan"]
    assert result.schedule.name == written["name"] == report["schedule"]


def test_the_plan_records_what_it_was_made_under(tmp_path: Path) -> None:
    result = zb.find_plan(zb.load_profile(H100), zb.PlanRequest("auto", dp_shard=8, sharding="zero1"),
                          zb.SearchOptions(0.5, workers=1))
    plan = result.schedule.plan
    assert (plan.sharding.degree, plan.sharding.how) == (8, "zero1")
    assert plan.mem_limit == "auto" and plan.memory_model == result.problem.profile.memory_model
    assert plan.split is not None and sum(len(c) for c in plan.split.chunks) == len(result.problem.profile.layers)


@pytest.mark.parametrize("fields, subject", [
    ({"mem_limit": None}, "mem_limit"),
    ({"mem_limit": "2p", "dp_shard": 0}, "dp_shard"),
    ({"mem_limit": "2p", "dp_shard": 2, "sharding": "zero9"}, "sharding"),
    ({"mem_limit": "2p", "sharding": "zero1"}, "sharding"),
    ({"mem_limit": "2p", "devices": 12, "dp_shard": 2}, "devices"),
    ({"mem_limit": "2p", "recompute": "fixed:nope"}, "recompute"),
    ({"mem_limit": "2p", "stages": 0, "partition": "auto"}, "stages"),
])
def test_errors_carry_the_request_field_they_are_about(fields: dict, subject: str) -> None:
    with pytest.raises(ZbsearchError) as info:
        zb.find_plan(zb.load_profile(H100), zb.PlanRequest(**fields), zb.SearchOptions(0.1))
    assert info.value.subject == subject and "\n" not in str(info.value)


@pytest.mark.parametrize("flags", [[], ["--partition", "auto"], ["--dp-shard", "8"]], ids=["implied", "auto", "shard"])
def test_solve_reads_and_validates_the_profile_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    flags: list[str]) -> None:
    # issue 38: the profile file was parsed and schema-validated twice on one solve
    from zbsearch.core import profile as profile_module

    seen: list[str] = []
    real = profile_module.check_profile_data
    monkeypatch.setattr(profile_module, "check_profile_data", lambda data, origin: (seen.append(origin),
                                                                                       real(data, origin))[1])
    result = runner.invoke(app, ["solve", "--profile", str(H100), "--mem-limit", "2p", "--time-limit", "0.2",
                                 "--json", *flags])
    assert result.exit_code == 0, result.stderr
    assert len(seen) == 1


def test_the_plan_says_what_its_pipeline_needs_without_the_memory_limit() -> None:
    # issue 39 (deliverable 6): where memory binds, the report says what the same pipeline reaches without
    # the cap, as a bound no uncapped plan beats
    profile = zb.uniform_profile(1.0, 2.0, 1.0, p=4, m=8)
    capped = zb.find_plan(profile, zb.PlanRequest("0.5p"), zb.SearchOptions(2, workers=1))
    free = zb.find_plan(profile, zb.PlanRequest("none"), zb.SearchOptions(2, workers=1))
    bound = capped.details.uncapped_bound
    assert free.details.uncapped_bound is None and bound is not None
    assert bound <= free.objective * (1 + 1e-9) and bound <= capped.objective
    assert capped.report().to_dict()["uncapped_bound"] == bound
    line = render.cap_line(capped.report())
    assert (line is not None) == ((capped.objective - bound) / capped.objective > render.CAP_NOTE_SHARE)
    assert line is not None and "without the memory limit" in line  # 0.5p throttles this pipeline well past 1%
    shown = runner.invoke(app, ["solve", "--uniform", "1,2,1", "-p", "4", "-m", "8", "--mem-limit", "0.5p",
                                "--time-limit", "1"])
    assert shown.exit_code == 0 and "without the memory limit" in shown.stdout
