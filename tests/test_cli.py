"""The command line, driven through typer's CliRunner: exit codes, --json, files, and one-line errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import ProfileError
from zbsearch.cli.options import load_problem
from zbsearch.schedules import REGISTRY

runner = CliRunner()

UNIFORM = ["--uniform", "1,2,1,0.1", "-p", "4", "-m", "8"]
SUMMARY_KEYS = {
    "schedule", "ranks", "stages", "microbatches", "makespan", "span", "bubble_rate_makespan",
    "bubble_rate_span", "idle_per_rank", "peak_memory_per_rank", "peak_memory_bytes_per_rank", "valid",
}


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, exit_code: int = 1) -> str:
    assert result.exit_code == exit_code, (result.stdout, result.stderr)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture()
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({
        "name": "cli-test", "num_stages": 4, "microbatches": 6, "time_unit": "ms",
        "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": 1, "mem_W": 0.5}] * 4,
        "comm": 0.0, "source": {"kind": "estimated", "method": "test numbers"},
    }))
    return path


@pytest.fixture()
def schedule_file(tmp_path: Path) -> Path:
    path = tmp_path / "sched.json"
    result = invoke("baseline", "1f1b", *UNIFORM, "-o", path)
    assert result.exit_code == 0, result.output
    return path


# -- baseline ---------------------------------------------------------------------------------

def test_baseline_json_is_one_object_with_the_keys():
    result = invoke("baseline", "1f1b", *UNIFORM, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert SUMMARY_KEYS <= set(summary)
    assert summary["schedule"] == "1f1b" and summary["ranks"] == 4 and summary["microbatches"] == 8
    assert summary["valid"] is True
    # 1F1B, uniform F=1 B=2 W=1 (full backward 3), comm 0.1: rank 0 works 8 * 4 = 32.
    assert summary["makespan"] > 32
    assert summary["bubble_rate_makespan"] == pytest.approx(1 - 4 * 32 / (4 * summary["makespan"]))


def test_baseline_table():
    result = invoke("baseline", "gpipe", *UNIFORM)
    assert result.exit_code == 0, result.output
    assert "makespan" in result.stdout and "bubble" in result.stdout and "valid" in result.stdout


def test_baseline_m_defaults_to_the_profile(profile_file):
    summary = json.loads(invoke("baseline", "1f1b", "--profile", profile_file, "--json").stdout)
    assert summary["microbatches"] == 6 and summary["profile"] == "cli-test"
    summary = json.loads(invoke("baseline", "1f1b", "--profile", profile_file, "-m", 10, "-p", 4, "--json").stdout)
    assert summary["microbatches"] == 10


def test_baseline_over_the_memory_limit_reports_and_exits_1(tmp_path):
    out = tmp_path / "s.json"
    result = invoke("baseline", "gpipe", *UNIFORM, "--mem-limit", "1p", "--json", "-o", out)
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["valid"] is False and "rank 0" in summary["reason"]
    line = assert_one_line_error(result)
    assert "limit" in line
    assert not out.exists()


def test_baseline_within_the_memory_limit():
    result = invoke("baseline", "1f1b", *UNIFORM, "--mem-limit", "1p", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["mem_limit"] == "1p"


def test_output_is_accepted_by_validate(schedule_file):
    data = json.loads(schedule_file.read_text())
    assert data["name"] == "1f1b" and len(data["actions"]) == 4
    for extra in ([], ["--uniform", "1,1,1"], ["--uniform", "1,1,1", "-p", "4", "--mem-limit", "1p"]):
        result = invoke("validate", schedule_file, *extra)
        assert result.exit_code == 0, result.output
        assert "valid" in result.stdout


def test_validate_with_a_profile_file(schedule_file, profile_file):
    result = invoke("validate", schedule_file, "--profile", profile_file, "--mem-limit", "none")
    assert result.exit_code == 0, result.output
    result = invoke("validate", schedule_file, "--profile", profile_file, "--mem-limit", "0.5p")
    assert "limit" in assert_one_line_error(result)


# -- show -------------------------------------------------------------------------------------

def test_show_prints_table_and_gantt(schedule_file):
    result = invoke("show", schedule_file, "--uniform", "1,2,1,0.1", "--width", 100)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    rows = [line for line in lines if line.startswith(("r0 ", "r1 ", "r2 ", "r3 "))]
    assert len(rows) == 4
    assert all(len(row) == 100 for row in rows)
    assert rows[0].startswith("r0  F0")          # rank 0 starts with microbatch 0's forward
    assert rows[3][4] == "."                     # rank 3 waits for its first input
    assert "BW" in rows[0] and "idle" in result.stdout
    assert "makespan" in result.stdout


def test_show_gantt_marks_second_chunk_in_lower_case(tmp_path):
    path = tmp_path / "v.json"
    assert invoke("baseline", "zb-v", "--uniform", "1,1,1", "-p", 4, "-o", path).exit_code == 0
    result = invoke("show", path, "--uniform", "1,1,1", "--width", 120)
    assert result.exit_code == 0, result.output
    assert "f0" in result.stdout and "F0" in result.stdout


# -- validate on broken schedules -------------------------------------------------------------

def _mutated(schedule_file: Path, tmp_path: Path, how) -> Path:
    data = json.loads(schedule_file.read_text())
    data = copy.deepcopy(data)
    how(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("how,expect", [
    (lambda d: d["actions"][1].pop(), "microbatch 7"),
    (lambda d: d["actions"][0].reverse(), "rank 0"),
    (lambda d: d["actions"][0].__setitem__(0, "0Q0"), "cannot parse action"),
    (lambda d: d["actions"][0].__setitem__(0, "9F0"), "chunk 9"),
    (lambda d: d["actions"].pop(), "actions"),
    (lambda d: d.pop("placement"), "placement"),
    (lambda d: d.__setitem__("num_microbatches", 0), "num_microbatches"),
])
def test_validate_rejects_a_broken_schedule_on_one_line(schedule_file, tmp_path, how, expect):
    broken = _mutated(schedule_file, tmp_path, how)
    for extra in ([], ["--uniform", "1,1,1"]):
        line = assert_one_line_error(invoke("validate", broken, *extra))
        assert expect in line


def test_validate_rank_mismatch(schedule_file):
    line = assert_one_line_error(invoke("validate", schedule_file, "--uniform", "1,1,1", "-p", 3))
    assert "4 ranks" in line


# -- list and schema --------------------------------------------------------------------------

def test_list_names_every_schedule():
    result = invoke("list")
    assert result.exit_code == 0
    for name in REGISTRY:
        assert name in result.stdout


def test_schema_is_json():
    result = invoke("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["$schema"].endswith("2020-12/schema")
    assert "stages" in schema["required"]


# -- bad input: one line, exit 1, no traceback ------------------------------------------------

@pytest.fixture()
def bad_files(tmp_path: Path) -> dict[str, Path]:
    good = {"stages": [{"F": 1, "B": 1, "W": 1}] * 2, "source": {"kind": "estimated", "method": "x"}}
    files = {
        "malformed": "{ not json",
        "nan_token": json.dumps(good).replace('"W": 1', '"W": NaN', 1),
        "nan_string": json.dumps(dict(good, stages=[{"F": 1, "B": 1, "W": "NaN"}] * 2)),
        "negative": json.dumps(dict(good, stages=[{"F": 1, "B": -1, "W": 1}] * 2)),
        "missing_time": json.dumps(dict(good, stages=[{"F": 1, "B": 1}] * 2)),
        "no_source": json.dumps({"stages": good["stages"]}),
        "measured_no_date": json.dumps(dict(good, source={"kind": "measured", "device": "H100"})),
        "good": json.dumps(good),
    }
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / f"{name}.json"
        out[name].write_text(text)
    out["missing"] = tmp_path / "missing.json"
    return out


BAD_ARGS = [
    (["baseline", "1f1b", "--profile", "{malformed}"], "not valid JSON"),
    (["baseline", "1f1b", "--profile", "{nan_token}"], "NaN"),
    (["baseline", "1f1b", "--profile", "{nan_string}"], "stages[0].W"),
    (["baseline", "1f1b", "--profile", "{negative}"], "stages[0].B"),
    (["baseline", "1f1b", "--profile", "{missing_time}"], "stages[0].W"),
    (["baseline", "1f1b", "--profile", "{no_source}"], "source"),
    (["baseline", "1f1b", "--profile", "{measured_no_date}"], "source.date"),
    (["baseline", "1f1b", "--profile", "{missing}"], "does not exist"),
    (["baseline", "1f1b", "--profile", "{good}", "-p", "3"], "-p 3"),
    (["baseline", "1f1b", "--profile", "{good}", "-m", "0"], "microbatches"),
    (["baseline", "1f1b", "--profile", "{good}", "--mem-limit", "48GiB"], "relative units"),
    (["baseline", "1f1b", "--profile", "{good}", "--mem-limit", "auto"], "device_capacity_bytes"),
    (["baseline", "1f1b", "--profile", "{good}", "--uniform", "1,1,1"], "not both"),
    (["baseline", "1f1b"], "--profile"),
    (["baseline", "1f1b", "--uniform", "1,1,1"], "-p"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "0"], "stages p"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "-2"], "stages p"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "-m", "0"], "microbatches m"),
    (["baseline", "1f1b", "--uniform", "1,1", "-p", "4"], "--uniform"),
    (["baseline", "1f1b", "--uniform", "1,nan,1", "-p", "4"], "--uniform"),
    (["baseline", "1f1b", "--uniform", "1,-1,1", "-p", "4"], "stages[0].B"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "--uniform-memory", "1"], "--uniform-memory"),
    (["baseline", "1f1b", "--profile", "{good}", "--uniform-memory", "1,0.5"], "--uniform-memory"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "--mem-limit", "lots"], "not a limit"),
    (["baseline", "no-such-schedule", "--uniform", "1,1,1", "-p", "4"], "unknown schedule"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "--chunks", "0"], "--chunks"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "--chunks", "3"], "interleaved"),
    (["baseline", "dualpipe", "--uniform", "1,1,1", "-p", "3"], "dualpipe needs"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "-o", "{missing}/x/s.json"], "does not exist"),
    (["validate", "{missing}"], "does not exist"),
    (["validate", "{malformed}"], "not valid JSON"),
    (["validate", "{good}"], "schedule field"),
    (["show", "{missing}", "--uniform", "1,1,1"], "does not exist"),
    (["validate", "{missing}", "--mem-limit", "1p"], "does not exist"),
]


@pytest.mark.parametrize("args,expect", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_input_is_one_line_error(bad_files, args, expect):
    argv = [a.format(**bad_files) for a in args]
    line = assert_one_line_error(invoke(*argv))
    assert expect in line


def test_validate_mem_limit_needs_a_profile(schedule_file):
    assert "--mem-limit" in assert_one_line_error(invoke("validate", schedule_file, "--mem-limit", "1p"))


def test_show_needs_a_profile(schedule_file):
    assert "--profile" in assert_one_line_error(invoke("show", schedule_file))


def test_usage_errors_exit_2():
    result = invoke("baseline", "1f1b", "--uniform", "1,1,1", "-p", "four")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


# -- load_problem, the helper other commands reuse -------------------------------------------

def test_load_problem_uniform_defaults():
    prof = load_problem(None, "1,1,1", 4, None)
    assert prof.num_stages == 4 and prof.microbatches == 8
    prof = load_problem(None, "1,1,1", None, None, default_p=3, default_m=5)
    assert prof.num_stages == 3 and prof.microbatches == 5


def test_load_problem_profile(profile_file):
    assert load_problem(profile_file, None, None, None).microbatches == 6
    assert load_problem(profile_file, None, 4, 12).microbatches == 12
    with pytest.raises(ProfileError, match="-p 2"):
        load_problem(profile_file, None, 2, None)
