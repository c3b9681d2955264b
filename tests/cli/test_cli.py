"""The command line, driven through typer's CliRunner: exit codes, --json, files, and one-line errors.

Assertions are exact: whole output lines, whole error messages, JSON values and exit codes (a substring
such as "valid" would also match "INVALID").
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.cli.console import progress_bar, stdout_console
from zbsearch.cli.options import flags_for, load_cli_profile, name_subject, parse_limit
from zbsearch.cli.params import (count_list_parser, parse_figure_formats, parse_microbatch_list, parse_stages,
    parse_uniform_times)
from zbsearch.core.errors import InfeasibleError, MemoryLimitError, ProfileError, RunError, ScheduleError, ZbsearchError
from zbsearch.core.ir import Action, Kind
from zbsearch.core.profile import profile_schema, uniform_profile
from zbsearch.report.render import fitted_label, gantt_cells, search_status
from zbsearch.schedules import REGISTRY, generate
from zbsearch.search.solve.driver import Progress
from zbsearch.sim.simulate import simulate

runner = CliRunner()

UNIFORM = ["--uniform", "1,2,1,0.1", "-p", "4", "-m", "8"]
UNIFORM_NAME = "uniform F=1 B=2 W=1 comm=0.1 p=4"
SUMMARY_KEYS = {
    "schedule", "placement", "ranks", "stages", "microbatches", "profile", "time_unit", "makespan", "span",
    "bubble_rate_makespan", "bubble_rate_span", "work_per_rank", "idle_per_rank", "span_per_rank",
    "peak_memory_per_rank", "peak_memory_bytes_per_rank", "param_copies", "static_bytes_per_rank", "mem_limit",
    "valid", "imbalance", "schedule_share_makespan", "schedule_share_span", "memory_model",
}
GPIPE_1P_REASON = "; ".join(
    f"rank {r} holds 5 x its stage M_B at time {t} after {r}F4, over the limit 1p = 4 x M_B (peak 8): raise the "
    "limit or pick a schedule that holds fewer microbatches" for r, t in enumerate(("4", "5.1", "6.2", "7.3")))


def invoke(*args: object):
    # Wide enough that typer's usage-error box keeps each message on one line.
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def error_message(result, exit_code: int = 1) -> str:
    """The message of a one-line 'error: ...' on stderr, checking the exit code and that nothing else
    (no traceback, nothing on stdout unless --json) came with it."""
    assert result.exit_code == exit_code, (result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0].removeprefix("error: ")


def usage_error(result) -> str:
    """The message in typer's usage-error box (exit code 2)."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.stdout == ""
    boxed = [line.strip("│ ") for line in result.stderr.splitlines() if line.startswith("│")]
    assert len(boxed) == 1, result.stderr
    return boxed[0]


def stdout_lines(result) -> list[str]:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stderr == ""
    return result.stdout.splitlines()


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
    summary = json.loads("\n".join(stdout_lines(invoke("baseline", "1f1b", *UNIFORM, "--json"))))
    assert set(summary) == SUMMARY_KEYS
    # 1F1B, uniform F=1 B=2 W=1 (full backward 3), comm 0.1: each rank works 8 * 4 = 32.
    assert summary == {
        "schedule": "1f1b", "placement": "linear", "ranks": 4, "stages": 4, "microbatches": 8,
        "profile": UNIFORM_NAME, "time_unit": "unit",
        "makespan": 45.600000000000016, "span": 45.600000000000016,
        "bubble_rate_makespan": 0.298245614035088, "bubble_rate_span": 0.298245614035088,
        "work_per_rank": [32.0] * 4, "idle_per_rank": [13.600000000000016] * 4,
        "span_per_rank": [45.600000000000016, 41.40000000000001, 37.20000000000001, 33.000000000000014],
        "peak_memory_per_rank": [4.0, 3.0, 2.0, 1.0], "peak_memory_bytes_per_rank": None,
        "param_copies": 1, "static_bytes_per_rank": None, "mem_limit": None, "valid": True, "memory_model": "paper",
        # Equal stages: no imbalance, the whole bubble is the schedule's.
        "imbalance": 0.0, "schedule_share_makespan": 0.298245614035088, "schedule_share_span": 0.298245614035088,
    }


def test_baseline_table():
    lines = stdout_lines(invoke("baseline", "gpipe", *UNIFORM))
    assert lines[0] == f"gpipe on {UNIFORM_NAME}"
    assert lines[4] == "│    0 │          32 │        12.6 │        44.6 │                8 │"
    assert lines[-3] == ("bubble 28.25% of makespan = 0.00% imbalance (the stage split) + 28.25% schedule; "
                         "28.25% of span = 0.00% + 28.25% schedule")
    assert lines[-2] == "memory: activations under the Zero Bubble paper's accounting"
    assert lines[-1] == (f"gpipe (linear) on {UNIFORM_NAME}: p=4 stages=4 m=8; makespan 44.6 unit, span 44.6 unit; "
                         "bubble 28.25% (makespan), 28.25% (span); valid")


def test_baseline_m_defaults_to_the_profile(profile_file):
    summary = json.loads(invoke("baseline", "1f1b", "--profile", profile_file, "--json").stdout)
    assert (summary["microbatches"], summary["profile"], summary["makespan"]) == (6, "cli-test", 27.0)
    summary = json.loads(invoke("baseline", "1f1b", "--profile", profile_file, "-m", 10, "-p", 4, "--json").stdout)
    assert summary["microbatches"] == 10


def test_baseline_over_the_memory_limit_reports_and_exits_1(tmp_path):
    out = tmp_path / "s.json"
    result = invoke("baseline", "gpipe", *UNIFORM, "--mem-limit", "1p", "--json", "-o", out)
    summary = json.loads(result.stdout)
    assert (summary["valid"], summary["mem_limit"]) == (False, "1p")
    assert summary["reason"] == f"schedule 'gpipe' is invalid: {GPIPE_1P_REASON}"
    assert error_message(result) == summary["reason"]
    assert not out.exists()


def test_baseline_within_the_memory_limit():
    summary = json.loads("\n".join(stdout_lines(invoke("baseline", "1f1b", *UNIFORM, "--mem-limit", "1p", "--json"))))
    assert (summary["mem_limit"], summary["valid"]) == ("1p", True)
    assert "reason" not in summary


def test_output_is_accepted_by_validate(schedule_file):
    data = json.loads(schedule_file.read_text())
    assert data["name"] == "1f1b" and len(data["actions"]) == 4
    head = "'1f1b' is valid: 4 ranks, 8 microbatches, 64 actions"
    for extra, tail in (
        ([], " (structure and deadlock only: give --profile or --uniform for timing and memory)"),
        (["--uniform", "1,1,1"], "; makespan 33 unit"),
        (["--uniform", "1,1,1", "-p", "4", "--mem-limit", "1p"], "; makespan 33 unit; within --mem-limit 1p"),
    ):
        assert stdout_lines(invoke("validate", schedule_file, *extra)) == [head + tail]


def test_validate_with_a_profile_file(schedule_file, profile_file):
    lines = stdout_lines(invoke("validate", schedule_file, "--profile", profile_file, "--mem-limit", "none"))
    assert lines == ["'1f1b' is valid: 4 ranks, 8 microbatches, 64 actions; makespan 33 ms; within --mem-limit none"]
    message = error_message(invoke("validate", schedule_file, "--profile", profile_file, "--mem-limit", "0.5p"))
    assert message == "schedule '1f1b' is invalid: " + "; ".join(
        f"rank {r} holds 3 x its stage M_B at time {t} after {r}F2, over the limit 0.5p = 2 x M_B (peak {peak}): raise "
        "the limit or pick a schedule that holds fewer microbatches" for r, t, peak in ((0, "2", 4), (1, "3", 3)))


def test_messages_print_brackets_literally(schedule_file, tmp_path):
    data = json.loads(schedule_file.read_text())
    data["name"] = "zb[bold]x[/bold]"
    path = tmp_path / "brackets.json"
    path.write_text(json.dumps(data))
    assert stdout_lines(invoke("validate", path)) == [
        "'zb[bold]x[/bold]' is valid: 4 ranks, 8 microbatches, 64 actions (structure and deadlock only: give "
        "--profile or --uniform for timing and memory)"]


# -- show and the Gantt chart ------------------------------------------------------------------

def _rows(stdout: str, ranks: int) -> list[str]:
    return [line for line in stdout.splitlines() if re.match(r"r\d+ ", line)][:ranks]


def test_show_prints_table_and_gantt(schedule_file):
    result = invoke("show", schedule_file, "--uniform", "1,2,1,0.1", "--width", 100)
    lines = stdout_lines(result)
    rows = _rows(result.stdout, 4)
    assert [len(row) for row in rows] == [100] * 4
    assert rows[0].startswith("r0  F0")           # rank 0 starts with microbatch 0's forward
    assert rows[3][:5] == "r3  ."                # rank 3 waits for its first input
    assert lines[-1] == " F  forward   BW  full backward (torch B)  . idle  1 column = 0.475 unit"
    assert lines[11] == f"1f1b (linear) on {UNIFORM_NAME}: p=4 stages=4 m=8; makespan 45.6 unit, span 45.6 unit; " \
                       "bubble 29.82% (makespan), 29.82% (span); valid"
    assert _tokens(rows[0])[:5] == [("F", "0"), ("F", "1"), ("F", "2"), ("F", "3"), ("BW", "0")]


def test_show_gantt_marks_second_chunk_in_lower_case(tmp_path):
    path = tmp_path / "v.json"
    assert invoke("baseline", "zb-v", "--uniform", "1,1,1", "-p", 4, "-o", path).exit_code == 0
    result = invoke("show", path, "--uniform", "1,1,1", "--width", 120)
    rows = _rows(result.stdout, 4)
    tokens = _tokens(rows[0])
    assert tokens[0] == ("F", "0")
    assert next(t for t in tokens if t[0].islower()) == ("f", "0")
    assert stdout_lines(result)[-1].startswith(" F  forward ")


LABEL = re.compile(r"(F&B|f&b|BW|bw|[FBWfbw])(\d*)")


def _tokens(row: str) -> list[tuple[str, str]]:
    """(kind, microbatch or '') for every label in a chart row, left to right."""
    return [(m.group(1), m.group(2)) for m in LABEL.finditer(row[4:])]


def _is_subsequence(part: list, whole: list) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


@pytest.mark.parametrize("name,p,m", [("1f1b", 4, 16), ("zb-h1", 4, 16), ("1f1b", 8, 24), ("zb-h2", 4, 24)])
@pytest.mark.parametrize("width", [30, 60, 100, 140, 200])
def test_gantt_labels_never_show_a_wrong_number(name, p, m, width):
    """Every numbered label in a row is a real pass of that rank, in the rank's order: a label cut to
    fit (F12 shown as F1) would repeat an earlier number and break the order."""
    timeline = simulate(generate(name, p, m), uniform_profile(1, 1, 1, 0.05, p=p, m=m))
    for r, row in enumerate(gantt_cells(timeline, width - 4)):
        text = "    " + "".join(ch for ch, _ in row)
        real = [(s.action.kind.label, str(s.action.microbatch)) for s in timeline.slots[r]]
        numbered = [t for t in _tokens(text) if t[1]]
        assert _is_subsequence(numbered, real), (r, text)
        for kind, _ in _tokens(text):
            assert kind in {k for k, _ in real}, (r, text)


def test_show_at_width_200_never_cuts_a_microbatch_number(tmp_path):
    """ZB-H2 at m=24: F10 to F23 get two cells each, too few for their label; the chart used to show
    each as 'F1' or 'F2'. Now each shows its kind alone."""
    sched = tmp_path / "h2.json"
    assert invoke("baseline", "zb-h2", "--uniform", "1,2,1,0.1", "-p", 4, "-m", 24, "-o", sched).exit_code == 0
    row = _rows(invoke("show", sched, "--uniform", "1,2,1,0.1", "--width", 200).stdout, 4)[0]
    assert re.findall(r"F\d*", row) == [f"F{i}" for i in range(9)] + ["F"] * 15


def test_a_zero_length_input_backward_does_not_read_as_a_full_backward(tmp_path):
    profile = tmp_path / "i0.json"
    profile.write_text(json.dumps({
        "name": "i0", "num_stages": 2, "microbatches": 4, "time_unit": "ms",
        "stages": [{"F": 1, "B": 0, "W": 2}, {"F": 1, "B": 1, "W": 1}], "comm": 0,
        "source": {"kind": "estimated", "method": "x"}}))
    sched = tmp_path / "h1.json"
    assert invoke("baseline", "zb-h1", "--profile", profile, "-o", sched).exit_code == 0
    result = invoke("show", sched, "--profile", profile, "--width", 60)
    rows = _rows(result.stdout, 2)
    assert rows[0] == "r0  F0  F1   ....W0       F2  W1      F3   W2      W3       "
    assert rows[1] == "r1  ....F0   B0  F1  B1   W0  F2  B2  W1   F3  B3  W2   W3  "


@pytest.mark.parametrize("kind,width,next_text,expect", [
    (Kind.F, 3, "", "F12"),
    (Kind.F, 2, "", "F"),
    (Kind.F, 1, "", "F"),
    (Kind.F, 1, "B3", "F"),
    (Kind.B, 2, "W0", "B"),      # a blank follows the B
    (Kind.B, 1, "W0", ""),       # 'B' then 'W0' would read as BW0
    (Kind.B, 1, "w0", ""),
    (Kind.B, 1, "F0", "B"),
    (Kind.B, 1, ".", "B"),
    (Kind.FULL_B, 2, "", "BW"),
    (Kind.FULL_B, 1, "", ""),
    (Kind.W, 1, "", "W"),
])
def test_fitted_label(kind, width, next_text, expect):
    assert fitted_label(Action(0, kind, 12), False, width, next_text) == expect


def test_fitted_label_lower_case_and_pairs():
    assert fitted_label(Action(1, Kind.B, 3), True, 1, "F") == "b"
    assert fitted_label(Action(1, Kind.B, 3), True, 1, "W0") == ""
    assert fitted_label(Action(1, Kind.B, 3), True, 2, "") == "b3"
    pair = Action.parse("(0F3;3I1)OVERLAP_F_B")  # torch's I: our B
    assert fitted_label(pair, False, 5, "") == "F3&B1"
    assert fitted_label(pair, False, 4, "") == "F&B"
    assert fitted_label(pair, False, 3, "W2") == ""     # 'F&B' then 'W2' would read as F&BW2
    assert fitted_label(pair, True, 3, "") == "f&b"
    full = Action.parse("(0F3;3B1)OVERLAP_F_B")  # torch's B: our full backward BW
    assert (fitted_label(full, False, 6, ""), fitted_label(full, False, 5, "F4")) == ("F3&BW1", "F&BW")


# -- validate on broken schedules -------------------------------------------------------------

def _mutated(schedule_file: Path, tmp_path: Path, how) -> Path:
    data = json.loads(schedule_file.read_text())
    data = copy.deepcopy(data)
    how(data)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("how,expect", [
    (lambda d: d["actions"][1].pop(), "schedule '1f1b' is invalid: chunk 1 microbatch 7 has 0 input backwards (I) "
                                      "and 0 weight backwards (W); it needs exactly 1 of each"),
    (lambda d: d["actions"][0].reverse(),
     "schedule '1f1b' is invalid: rank 0 runs a pass before its own input: 0B0 (rank 0, step 11) -> 0F3 (rank 0, "
     "step 12) -> 0F2 (rank 0, step 13) -> 0F1 (rank 0, step 14) -> 0F0 (rank 0, step 15) (reorder that rank's list)"),
    (lambda d: d["actions"][0].__setitem__(0, "0Q0"),
     "cannot parse action '0Q0': expected '<chunk><F|I|W|B><microbatch>' such as '0F1', or '(0F3;3B1)OVERLAP_F_B'"),
    (lambda d: d["actions"][0].__setitem__(0, "9F0"),
     "schedule '1f1b' is invalid: 9F0 (rank 0, step 0) names chunk 9; chunks are 0..3"),
    (lambda d: d["actions"].pop(), "schedule field 'actions' must be a list of 4 per-rank lists"),
    (lambda d: d.pop("placement"), "schedule field 'placement' is missing: write zbsearch's schedule JSON "
                                   "(zbsearch baseline ... -o FILE shows the format)"),
    (lambda d: d.__setitem__("num_microbatches", 0), "schedule field 'num_microbatches' is 0: it must be an integer >= 1"),
])
def test_validate_rejects_a_broken_schedule_on_one_line(schedule_file, tmp_path, how, expect):
    broken = _mutated(schedule_file, tmp_path, how)
    for extra in ([], ["--uniform", "1,1,1"]):
        assert error_message(invoke("validate", broken, *extra)) == expect


def test_a_rank_count_mismatch_names_both_files(schedule_file, tmp_path):
    bad_p = f"-p 3 does not match schedule {str(schedule_file)!r}, which has 4 ranks: drop -p or use -p 4"
    for command in (["validate"], ["show"], ["export", "-f", "json", "-o", tmp_path / "x.json"]):
        result = invoke(*command, schedule_file, "--uniform", "1,1,1", "-p", 3)
        assert error_message(result) == bad_p
    assert not (tmp_path / "x.json").exists()
    three = tmp_path / "three.json"
    three.write_text(json.dumps({
        "name": "same-name-everywhere", "num_stages": 3, "stages": [{"F": 1, "B": 1, "W": 1}] * 3,
        "source": {"kind": "estimated", "method": "x"}}))
    expect = (f"profile {str(three)!r} has 3 stages but schedule {str(schedule_file)!r} has 4 ranks: use a profile "
              "with one stage per rank (or --uniform F,B,W, whose -p defaults to 4)")
    for command in (["validate"], ["show"], ["export", "-f", "chrome-trace", "-o", tmp_path / "t.json"]):
        assert error_message(invoke(*command, schedule_file, "--profile", three)) == expect


# -- list and schema --------------------------------------------------------------------------

def test_list_names_every_schedule():
    lines = stdout_lines(invoke("list"))
    names = [line.split("│")[1].strip() for line in lines if line.startswith("│")]
    assert names == list(REGISTRY)


def test_schema_is_json():
    assert json.loads("\n".join(stdout_lines(invoke("schema")))) == profile_schema()


# -- help texts: rich markup must not eat brackets ----------------------------------------------

def test_run_help_names_the_torch_extra():
    lines = stdout_lines(invoke("run", "--help"))
    assert [line.strip() for line in lines if "pip install" in line] == [
        "exits 1 when anything differs. Needs torch: pip install 'zbsearch[torch]'."]


def _commands() -> list[str]:
    group = typer.main.get_command(app)
    return sorted(group.commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", _commands())
def test_help_keeps_every_bracketed_word(command):
    """Every '[word]' in a command's docstring and option help shows in its --help as written."""
    group = typer.main.get_command(app)
    cmd = group.commands[command]  # type: ignore[attr-defined]
    texts = [cmd.help or ""] + [getattr(param, "help", None) or "" for param in cmd.params]
    shown = " ".join(" ".join(stdout_lines(invoke(command, "--help"))).replace("│", " ").split())
    for text in texts:
        for word in re.findall(r"\\?\[[a-z#/@][^\]\s]*\]", text):
            assert word.lstrip("\\") in shown, (command, word)


# -- bad input: one line, exit 1, no traceback ------------------------------------------------

@pytest.fixture()
def bad_files(tmp_path: Path) -> dict[str, Path]:
    good = {"name": "same-name-everywhere", "stages": [{"F": 1, "B": 1, "W": 1}] * 2,
            "source": {"kind": "estimated", "method": "x"}}
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
    (["baseline", "1f1b", "--profile", "{malformed}"], "profile file {malformed} is not valid JSON: Expecting "
                                                       "property name enclosed in double quotes: line 1 column 3 (char 2)"),
    (["baseline", "1f1b", "--profile", "{missing}"], "profile file {missing} does not exist"),
    (["baseline", "1f1b", "--profile", "{nan_token}"], "profile file {nan_token} is not valid JSON: NaN is not a "
                                                       "number JSON allows"),
    (["baseline", "1f1b", "--profile", "{nan_string}"], "{nan_string}: field stages[0].W is 'NaN'; give a number"),
    (["baseline", "1f1b", "--profile", "{negative}"], "{negative}: field stages[0].B is -1; it must be >= 0"),
    (["baseline", "1f1b", "--profile", "{missing_time}"], "{missing_time}: field stages[0].W is missing; give a number"),
    (["baseline", "1f1b", "--profile", "{no_source}"], "{no_source}: field source is missing; say where the numbers "
     "come from: measured (with device, date), published (with citation) or estimated (with method)"),
    (["baseline", "1f1b", "--profile", "{measured_no_date}"], "{measured_no_date}: field source.date is missing; a "
                                                              "measured profile must state its date"),
    (["baseline", "1f1b", "--profile", "{good}", "-p", "3"],
     "-p 3 does not match profile '{good}', which has 2 stages: drop -p or use -p 2"),
    (["baseline", "1f1b", "--profile", "{good}", "--mem-limit", "48GiB"],
     "--mem-limit: memory limit '48GiB' is an absolute size, but profile '{good}' gives memory in relative units: "
     "use a multiple of p such as 1p or 2p"),
    (["baseline", "1f1b", "--profile", "{good}", "--mem-limit", "auto"],
     "--mem-limit: memory limit auto needs the profile to give device_capacity_bytes and every stage's static_bytes "
     "in bytes; profile '{good}' does not: use e.g. 2p or 48GiB"),
    (["solve", "--profile", "{good}", "--mem-limit", "48GiB"],
     "--mem-limit: memory limit '48GiB' is an absolute size, but profile '{good}' gives memory in relative units: "
     "use a multiple of p such as 1p or 2p"),
    (["baseline", "1f1b", "--profile", "{good}", "--uniform", "1,1,1"], "give either --profile FILE or --uniform "
                                                                        "F,B,W, not both"),
    (["baseline", "1f1b"], "say what to schedule: --profile PROFILE.json, or --uniform F,B,W[,COMM] with -p P"),
    (["baseline", "1f1b", "--uniform", "1,1,1"], "--uniform 1,1,1 needs the number of stages: add -p P, e.g. -p 4"),
    (["baseline", "1f1b", "--uniform", "1,-1,1", "-p", "4"], "--uniform: uniform profile: field stages[0].B is -1.0; "
                                                             "it must be >= 0"),
    (["baseline", "1f1b", "--profile", "{good}", "--uniform-memory", "1,0.5"],
     "--uniform-memory applies to --uniform only; a profile file gives mem_B and mem_W per stage"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "--mem-limit", "lots"],
     "--mem-limit: memory limit 'lots' is not understood: use a multiple of p (1p, 2p, 1.5p), a size (48GiB, 40GB, "
     "1000000000), auto or none"),
    (["baseline", "no-such-schedule", "--uniform", "1,1,1", "-p", "4"],
     "unknown schedule 'no-such-schedule': choose one of " + ", ".join(REGISTRY)),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "--chunks", "3"],
     "--chunks: chunk count 3 does not apply to 1f1b, which has a fixed placement: only interleaved-1f1b takes one"),
    (["baseline", "dualpipe", "--uniform", "1,1,1", "-p", "3"],
     "dualpipe needs p even (half the ranks lead each direction); got p=3, m=6"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "-o", "{missing}/x/s.json"],
     "cannot write {missing}/x/s.json: folder {missing}/x does not exist (create it first)"),
    (["validate", "{missing}"], "schedule file {missing} does not exist"),
    (["validate", "{malformed}"], "schedule file {malformed} is not valid JSON: Expecting property name enclosed in "
                                  "double quotes: line 1 column 3 (char 2)"),
    (["show", "{missing}", "--uniform", "1,1,1"], "schedule file {missing} does not exist"),
    (["validate", "{missing}", "--mem-limit", "1p"], "schedule file {missing} does not exist"),
    (["solve", "--uniform", "1,1,1", "-p", "4"], "solve needs --mem-limit: e.g. --mem-limit 2p (or none for no limit)"),
    (["solve", "--uniform", "1,1,1", "-p", "4", "--mem-limit", "1p", "--objective", "speed"],
     "--objective: objective 'speed' is not known: use one of makespan, span"),
    (["solve", "--uniform", "1,1,1", "-p", "4", "--mem-limit", "1p", "--placement", "zig"],
     "--placement: placement 'zig' is not known: use one of linear, interleaved:V, v, dualpipe, auto"),
]


@pytest.mark.parametrize("args,expect", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_input_is_one_line_error(bad_files, args, expect):
    argv = [a.format(**bad_files) for a in args]
    result = invoke(*argv)
    assert result.stdout == ""
    assert error_message(result) == expect.format(**bad_files)


USAGE_ARGS = [
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "four"], "'-p' / '--stages'",
     "'four' is not a number of stages: use an integer from 1 to 1024"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "0"], "'-p' / '--stages'",
     "'0' is not a number of stages: use an integer from 1 to 1024"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "-2"], "'-p' / '--stages'",
     "'-2' is not a number of stages: use an integer from 1 to 1024"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "-m", "0"], "'-m' / '--microbatches'",
     "'0' is not a number of microbatches: use an integer from 1 to 100000"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "-m", "a,b"], "'-m' / '--microbatches'",
     "'a,b' is not a number of microbatches: use an integer from 1 to 100000"),
    (["baseline", "1f1b", "--uniform", "1,1", "-p", "4"], "'--uniform'",
     "'1,1' is not 3 or 4 comma-separated numbers: write e.g. 1,1,1"),
    (["baseline", "1f1b", "--uniform", "1,nan,1", "-p", "4"], "'--uniform'",
     "'1,nan,1' is not 3 or 4 comma-separated numbers: write e.g. 1,1,1"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "--uniform-memory", "1"], "'--uniform-memory'",
     "'1' is not 2 comma-separated numbers: write e.g. 1,0.5"),
    (["baseline", "1f1b", "--uniform", "1,1,1", "-p", "4", "--chunks", "0"], "'--chunks'",
     "'0' is not a number of chunks per rank: use an integer of 1 or more"),
    (["compare", "--uniform", "1,1,1", "-p", "4", "-m", "8,x", "-o", "{out}"], "'-m' / '--microbatches'",
     "'8,x' is not a list of microbatch counts from 1 to 100000: write e.g. 24 or 24,32,64"),
    (["compare", "--uniform", "1,1,1", "-p", "4", "-m", "x", "-o", "{out}"], "'-m' / '--microbatches'",
     "'x' is not a list of microbatch counts from 1 to 100000: write e.g. 24 or 24,32,64"),
    (["compare", "--uniform", "1,1,1", "-p", "4", "--mem-limits", ",", "-o", "{out}"], "'--mem-limits'",
     "',' is empty: give at least one value, e.g. 1p,2p"),
    (["compare", "--uniform", "1,1,1", "-p", "4", "--figures", "gif", "-o", "{out}"], "'--figures'",
     "'gif' is not a list of figure formats: use png, svg, png,svg or none"),
    (["import", "--torch-schedule", "GPipe", "-p", "2", "-m", "0", "-o", "{out}"], "'-m' / '--microbatches'",
     "'0' is not a number of microbatches: use an integer from 1 to 100000"),
]


@pytest.mark.parametrize("args,option,expect", USAGE_ARGS, ids=[" ".join(a) for a, _, _ in USAGE_ARGS])
def test_malformed_values_are_usage_errors_naming_the_option(tmp_path, args, option, expect):
    result = invoke(*[a.format(out=tmp_path / "x") for a in args])
    assert usage_error(result) == f"Invalid value for {option}: {expect}"
    assert list(tmp_path.iterdir()) == []


def test_validate_mem_limit_needs_a_profile(schedule_file):
    assert error_message(invoke("validate", schedule_file, "--mem-limit", "1p")) == \
        "--mem-limit needs costs: add --profile PROFILE.json or --uniform F,B,W"


@pytest.mark.parametrize("command", ["validate", "export", "run"])
def test_uniform_companions_need_uniform(schedule_file, tmp_path, command):
    extra = ["-f", "json", "-o", tmp_path / "x.json"] if command == "export" else []
    for flags in (["-p", "3"], ["--uniform-memory", "1,0.5"]):
        result = invoke(command, schedule_file, *flags, *extra)
        assert error_message(result) == "-p and --uniform-memory go with --uniform F,B,W"


def test_show_needs_a_profile(schedule_file):
    assert error_message(invoke("show", schedule_file)) == \
        "say what to schedule: --profile PROFILE.json, or --uniform F,B,W[,COMM] with -p P"


# -- the helpers other commands reuse -----------------------------------------------------------

def test_load_cli_profile_uniform_defaults():
    prof = load_cli_profile(None, "1,1,1", 4, None)
    assert (prof.num_stages, prof.microbatches, prof.name) == (4, 8, "uniform F=1 B=1 W=1 comm=0 p=4")
    prof = load_cli_profile(None, parse_uniform_times("1,1,1"), None, None, default_p=3, default_m=5)
    assert (prof.num_stages, prof.microbatches) == (3, 5)
    prof = load_cli_profile(None, "1,2,1,0.5", 2, 4, "2,1")
    assert (prof.stages[0].mem_B, prof.stages[0].mem_W, prof.comm[0]) == (2.0, 1.0, 0.5)


def test_load_cli_profile_profile(profile_file):
    assert load_cli_profile(profile_file, None, None, None).microbatches == 6
    assert load_cli_profile(profile_file, None, 4, 12).microbatches == 12
    with pytest.raises(ProfileError) as info:
        load_cli_profile(profile_file, None, 2, None)
    assert str(info.value) == (f"-p 2 does not match profile {str(profile_file)!r}, which has 4 stages: "
                               "drop -p or use -p 4")


def test_parse_limit_names_the_profile_file(profile_file):
    problem = load_cli_profile(profile_file, None, None, None)
    assert parse_limit(None, problem) is None
    assert parse_limit("2p", problem).per_rank == (8.0,) * 4
    with pytest.raises(MemoryLimitError) as info:
        parse_limit("1GiB", problem)
    assert str(info.value) == (f"--mem-limit: memory limit '1GiB' is an absolute size, but profile "
                               f"{str(profile_file)!r} gives memory in relative units: use a multiple of p such as 1p "
                               "or 2p")


def _named(exc: ZbsearchError, spelled: dict | None = None) -> str:
    """The message the CLI prints for `exc`: a command's `flags_for`, then ZbsearchGroup.invoke's naming."""
    with pytest.raises(type(exc)) as info:
        with flags_for(spelled or {}):
            raise exc
    name_subject(info.value)
    return str(info.value)


def test_the_subject_puts_its_flag_in_front_only_when_missing():
    assert _named(MemoryLimitError("memory limit '1q' is not a limit", subject="mem_limit")) == \
        "--mem-limit: memory limit '1q' is not a limit"
    assert _named(MemoryLimitError("--mem-limit '1q' is not a limit", subject="mem_limit")) == \
        "--mem-limit '1q' is not a limit"
    # compare spells the memory limit --mem-limits
    assert _named(MemoryLimitError("memory limit '2x' is not a limit", subject="mem_limit"),
                  {"mem_limit": "--mem-limits"}) == "--mem-limits: memory limit '2x' is not a limit"
    assert _named(ProfileError("stage 0 has no costs")) == "stage 0 has no costs"
    assert _named(InfeasibleError("memory limit 0.1p is infeasible: the minimum is 0.25p", subject="mem_limit")) == \
        "--mem-limit: memory limit 0.1p is infeasible: the minimum is 0.25p"
    assert _named(InfeasibleError("nothing fits")) == "nothing fits"


def test_run_subjects_name_the_run_flags():
    assert _named(RunError("process count 3 does not match schedule 'x', which has 2 ranks: start 2 processes",
                           subject="nproc")) == ("--nproc: process count 3 does not match schedule 'x', which has 2 "
                                                 "ranks: start 2 processes")
    assert _named(RunError("step count 0 is too small: run at least 1 step", subject="steps")) == \
        "--steps: step count 0 is too small: run at least 1 step"
    assert _named(ScheduleError("rank 3 never runs the step count 3 asks for")) == \
        "rank 3 never runs the step count 3 asks for"
    assert _named(RunError("step count 0 is too small: use --steps 1", subject="steps")) == \
        "step count 0 is too small: use --steps 1"


def test_parsers_return_values():
    assert parse_microbatch_list(" 24, 32,64 ") == (24, 32, 64)
    layers = count_list_parser("layer counts", "3,3,2")
    assert layers("3,3,2") == (3, 3, 2)
    with pytest.raises(typer.BadParameter) as info:
        layers("3,0")
    assert info.value.message == "'3,0' is not a list of layer counts: write e.g. 3,3,2"
    assert parse_figure_formats("svg,png,svg") == ("svg", "png")
    assert parse_figure_formats("none") == ()
    assert parse_stages("7") == 7
    assert parse_uniform_times("1,2,0.5") == (1.0, 2.0, 0.5)
    assert parse_uniform_times("1,2,0.5").text == "1,2,0.5"


def test_progress_bar_is_silent_off_a_terminal(capsys):
    with progress_bar("solve") as progress:
        progress(1, 10, "heuristics: incumbent 5")
        progress(10, 10, "done")
    assert capsys.readouterr() == ("", "")


def test_progress_bar_draws_its_label_literally_on_a_terminal():
    import io

    stream = io.StringIO()
    terminal = Console(file=stream, force_terminal=True, width=120)
    with progress_bar("profile", console=terminal) as progress:
        progress(3, 8, "layer [torch] 3")
        terminal.print("done")  # printed above the live bar, so the bar is drawn at least once
    assert "profile" in stream.getvalue() and "3/8" in stream.getvalue()
    assert "layer [torch] 3" in stream.getvalue()
    quiet = io.StringIO()
    with progress_bar("profile", enabled=False, console=Console(file=quiet, force_terminal=True)) as progress:
        progress(3, 8, "layer 3")
    assert quiet.getvalue() == ""


def test_search_status():
    assert search_status(Progress(2.5, 40.0, 30.0, "cp-sat")) == "cp-sat: incumbent 40  bound 30  gap 25.00%"
    assert search_status(Progress(0.1, 0.0, 0.0, "heuristics")) == "heuristics: incumbent 0  bound 0  gap 0.00%"


def test_stdout_console_prints_markup_literally():
    console = stdout_console()
    with console.capture() as captured:
        console.print("pip install 'zbsearch[torch]' [bold]x[/bold]")
    assert captured.get() == "pip install 'zbsearch[torch]' [bold]x[/bold]\n"
    assert isinstance(console, Console)


def test_tables_written_to_a_pipe_keep_their_layer_names_whole():
    """rich takes 80 columns where stdout is not a terminal and folded the split table's layer names a few
    letters per line; piped output now gets the pipe width, and COLUMNS still wins."""
    args = ["solve", "--profile", "profiles/h100.json", "--mem-limit", "2p", "--partition", "even", "--time-limit", "1"]
    piped = runner.invoke(app, args, env={"COLUMNS": None})
    assert piped.exit_code == 0, piped.output
    assert re.search(r"│ layers\.14\.\.layers\.15 +│", piped.stdout)
    assert "splits scored" not in piped.stdout  # a named split scores none
    narrow = runner.invoke(app, args, env={"COLUMNS": "60"}).stdout
    rows = [[line for line in text.splitlines() if line.startswith("│")] for text in (narrow, piped.stdout)]
    assert max(map(len, rows[0])) <= 60 < max(map(len, rows[1]))


def test_export_help_keeps_the_toml_table_name() -> None:
    # rich reads "[parallelism]" as markup and dropped it from --torchtitan's help (issue 38)
    result = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "TOML [parallelism] table" in result.stdout
