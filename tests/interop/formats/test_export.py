"""Export and import: torch CSV golden files and round trips, torch's own validator, lowering and dry run
as a second opinion, built-in torch orders, the Chrome trace, the plan JSON and atomic writes.

No processes are started here. Tests that need torch are marked `torch` and skip without it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from unittest import mock

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import ScheduleError, ZbsearchError
from zbsearch.interop.formats.export import FORMATS, chrome_trace, export, plan_json, render, torch_csv
from zbsearch.core.ir import Action, Schedule, build, interleaved, linear, vshape
from zbsearch.search.options import SearchOptions
from zbsearch.search.problem import make_problem
from zbsearch.core.profile import uniform_profile
from zbsearch.schedules import REGISTRY, generate
from zbsearch.sim.simulate import simulate
from zbsearch.search.solve.driver import solve
from zbsearch.interop.formats.torch_import import from_rows, import_torch_csv, infer_placement, parse_torch_csv
from zbsearch.sim.validate import validate

runner = CliRunner()

# Every handcrafted schedule torch's runtime can run (not the two model copies of DualPipe's placement,
# which DualPipe and Chimera use), on a table of (p, m) where each is defined.
EXPORTABLE = [name for name in REGISTRY if REGISTRY[name].placement != "dualpipe"]
SIZES = [(2, 4), (4, 8), (3, 6)]


def handcrafted() -> list[Schedule]:
    out = []
    for name in EXPORTABLE:
        for p, m in SIZES:
            if name == "dualpipev" and m < 2 * p:
                continue
            try:
                out.append(generate(name, p, m))
            except ZbsearchError:  # not defined for this p, m
                continue
    return out


SCHEDULES = handcrafted()
IDS = [f"{s.name}-p{s.num_ranks}-m{s.num_microbatches}" for s in SCHEDULES]


def deadlocking() -> Schedule:
    """Two ranks, two microbatches: rank 0 waits for microbatch 0's backward before sending
    microbatch 1's forward, while rank 1 wants microbatch 1's forward before running microbatch 0's
    backward. Every per-rank order is fine; together they wait on each other."""
    rows = [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1F1", "1B1", "1B0"]]
    return build("deadlock", linear(2), 2, [[Action.parse(a) for a in row] for row in rows])


@pytest.fixture(autouse=True)
def _skip_torch_tests_without_torch(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("torch"):
        pytest.importorskip("torch")


@pytest.fixture(scope="module")
def solver_schedules() -> list[Schedule]:
    out = []
    for placement in ("linear", "v", "interleaved:2"):
        problem = make_problem(uniform_profile(1, 2, 1, p=4, m=6), "2p", "makespan", placement)
        out.append(solve(problem, SearchOptions(time_limit=5, workers=1)).schedule)
    return out


# -- torch helpers (tests only) ---------------------------------------------------------------------

def torch_runtime(path: Path, schedule: Schedule, format: str = "compute_only"):
    """Load `path` exactly as torchtitan does, `_PipelineScheduleRuntime._load_csv(path, "compute_only")`,
    with stand-in stages (no process group), and return the runtime."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod = 0, schedule.num_ranks, None
    stage.num_stages = schedule.placement.num_chunks
    runtime = _PipelineScheduleRuntime([stage], schedule.num_microbatches)
    runtime._load_csv(str(path), format=format)
    return runtime


def dry_run(lowered: dict, stage_to_rank: dict, num_stages: int) -> None:
    """torch's unit-time dry run of a lowered order, checked: it raises on a deadlock, and a run that
    returns has run every action of each rank in order. It refuses bookkeeping actions and overlap pairs,
    so those are stripped and pairs expanded into their two passes."""
    from torch.distributed.pipelining.schedules import (
        OVERLAP_F_B, REDUCE_GRAD, RESHARD, UNSHARD, _simulate_comms_compute,
    )

    order = {}
    for rank, actions in lowered.items():
        flat = []
        for a in actions:
            if a is None or a.computation_type in (UNSHARD, RESHARD, REDUCE_GRAD):
                continue
            flat.extend(a.sub_actions if a.computation_type == OVERLAP_F_B else (a,))
        order[rank] = flat
    simulated = _simulate_comms_compute(order, lambda s: stage_to_rank[s], num_stages)
    for rank, actions in order.items():
        assert [a for a in simulated[rank] if a is not None] == actions, f"rank {rank} did not run its order"


# -- the compute-only CSV ---------------------------------------------------------------------------

ZB_H1_P3_M4 = """\
0F0,0F1,0F2,0I0,0W0,0F3,0I1,0W1,0I2,0W2,0I3,0W3
1F0,1F1,1I0,1F2,1I1,1W0,1F3,1I2,1W1,1I3,1W2,1W3
2F0,2I0,2F1,2I1,2F2,2I2,2W0,2F3,2I3,2W1,2W2,2W3
"""
DUALPIPEV_P2_M4 = """\
0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,(3F2;0B0)OVERLAP_F_B,3B2,(3F3;0B1)OVERLAP_F_B,3B3,0I2,0W2,0I3,0W3
1F0,2F0,1F1,2F1,1F2,2B0,(2F2;1B0)OVERLAP_F_B,(1F3;2B1)OVERLAP_F_B,(2F3;1B1)OVERLAP_F_B,2B2,1B2,2I3,1I3,2W3,1W3
"""


@pytest.mark.parametrize("schedule, golden", [
    (generate("zb-h1", 3, 4), ZB_H1_P3_M4),
    (generate("dualpipev", 2, 4), DUALPIPEV_P2_M4),
], ids=["zb-h1", "dualpipev"])
def test_torch_csv_golden(schedule: Schedule, golden: str, tmp_path: Path) -> None:
    path = export(schedule, "torch-csv", tmp_path / "s.csv")
    assert path.read_text() == golden


@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_round_trip_gives_back_the_same_orders(schedule: Schedule, tmp_path: Path) -> None:
    path = export(schedule, "torch-csv", tmp_path / "s.csv")
    back = import_torch_csv(path)
    assert back.ranks == schedule.ranks
    assert back.placement == schedule.placement
    assert back.num_microbatches == schedule.num_microbatches
    assert back.name == "s"


def test_import_reads_torchtitan_style_cells() -> None:
    """Idle (empty) cells, spaces, comm actions and a trailing empty cell are all dropped."""
    text = "0F0, ,0SEND_F0,0F1,,0RECV_B0,0B0,0B1,0REDUCE_GRAD,\n1RECV_F0,1F0, 1B0 ,1SEND_B0,1F1,1B1,\n"
    schedule = parse_torch_csv(text)
    assert [[str(a) for a in r] for r in schedule.ranks] == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    assert schedule.placement == linear(2)
    validate(schedule)


@pytest.mark.parametrize("mapping, p, expected", [
    ((0, 1, 2, 3), 4, linear(4)),
    ((0, 1, 0, 1), 2, interleaved(2, 2)),
    ((0, 1, 2, 0, 1, 2, 0, 1, 2), 3, interleaved(3, 3)),
    ((0, 1, 1, 0), 2, vshape(2)),
    ((0, 1, 2, 2, 1, 0), 3, vshape(3)),
])
def test_placement_inferred_from_rows(mapping, p, expected) -> None:
    assert infer_placement(mapping, p) == expected


def test_unusual_placement_imports_as_custom() -> None:
    schedule = parse_torch_csv("0F0,2F0,2B0,0B0\n1F0,1B0\n")
    assert schedule.placement.name == "custom"
    assert schedule.placement.chunk_to_rank == (0, 1, 0)
    validate(schedule)


@pytest.mark.parametrize("text, m, fault", [
    ("0F0,1F0\n1B0,0B0\n", None, "appears on rank 0 and rank 1"),
    ("0F0,0B0\n2F0,2B0\n", None, "never appear"),
    ("0F0,0X0\n", None, "cannot parse action '0X0'"),
    ("0F0,0F1,0B0,0B1\n", 1, "^microbatch count 1 does not cover x.csv, which mentions microbatch 1 \\(counted from "
                            "0\\): give 2 or more, or leave the count out to infer it$"),
    ("0SEND_F0\n", None, "no compute actions"),
])
def test_import_errors_name_the_fault(text: str, m, fault: str) -> None:
    with pytest.raises(ScheduleError, match=fault):
        parse_torch_csv(text, m, origin="x.csv")


def test_cli_import_names_the_microbatch_option(tmp_path: Path) -> None:
    csv = tmp_path / "x.csv"
    csv.write_text("0F0,0F1,0B0,0B1\n")
    result = runner.invoke(app, ["import", str(csv), "-m", "1", "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: --microbatches: microbatch count 1 does not cover {csv}, which mentions microbatch 1 (counted "
        "from 0): give 2 or more, or leave the count out to infer it"]
    assert not (tmp_path / "x.json").exists()


# -- refusals and atomic writes ---------------------------------------------------------------------

def test_deadlocking_order_is_refused_before_writing(tmp_path: Path) -> None:
    target = tmp_path / "d.csv"
    with pytest.raises(ScheduleError, match="deadlock"):
        export(deadlocking(), "torch-csv", target)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_failed_export_leaves_no_file_and_keeps_an_old_one(fmt: str, tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.write_text("old")
    with pytest.raises(ScheduleError):
        export(deadlocking(), fmt, target, uniform_profile(1, 1, 1, p=2, m=2))
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_last_stage_running_forwards_out_of_microbatch_order_is_refused(tmp_path: Path) -> None:
    """torch looks the last stage's losses up by the order of its forwards: a plan whose last stage runs
    microbatch 1 first is valid here, but torch failed on one ('Loss for microbatch 3 is not available');
    other stages may run out of order (torch's LoopedBFS runs backwards in reverse)."""
    rows = [["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"], ["1F1", "1I1", "1W1", "1F0", "1I0", "1W0"]]
    schedule = from_rows(rows, name="swapped")
    validate(schedule, uniform_profile(1, 1, 1, p=2, m=2))
    with pytest.raises(ScheduleError, match=r"runs microbatch 1 as forward number 1 of the last stage \(chunk 1\)"):
        export(schedule, "torch-csv", tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()
    fine = from_rows([["0F1", "0F0", "0I0", "0W0", "0I1", "0W1"], ["1F0", "1I0", "1W0", "1F1", "1I1", "1W1"]], name="ok")
    export(fine, "torch-csv", tmp_path / "y.csv")


def test_dualpipe_two_copies_are_refused_with_the_alternative(tmp_path: Path) -> None:
    with pytest.raises(ScheduleError, match="dualpipev"):
        export(generate("dualpipe", 4, 8), "torch-csv", tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()
    with pytest.raises(ScheduleError, match="two model copies"):
        export(generate("chimera", 4, 8), "torch-csv", tmp_path / "x.csv")


@pytest.mark.parametrize("fmt", ["json", "chrome-trace"])
def test_timeline_formats_need_a_profile(fmt: str, tmp_path: Path) -> None:
    with pytest.raises(ZbsearchError) as info:
        export(generate("zb-h1", 2, 4), fmt, tmp_path / "x")
    assert str(info.value) == f"the {fmt} export needs costs for the timeline: give a profile"
    assert not (tmp_path / "x").exists()
    sched = tmp_path / "s.json"
    generate("zb-h1", 2, 4).save(sched)
    result = runner.invoke(app, ["export", str(sched), "-f", fmt, "-o", str(tmp_path / "x")])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: --format {fmt} needs costs for the timeline: add --profile PROFILE.json or --uniform F,B,W"]
    assert not (tmp_path / "x").exists()


def test_unknown_format_lists_the_formats(tmp_path: Path) -> None:
    with pytest.raises(ZbsearchError, match="torch-csv, torch-csv-comms, json, chrome-trace"):
        export(generate("zb-h1", 2, 4), "csv", tmp_path / "x")


def test_comms_without_torch_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed.pipelining.schedules", None)
    with pytest.raises(ZbsearchError, match=r"pip install 'zbsearch\[torch\]'"):
        export(generate("zb-h1", 2, 4), "torch-csv-comms", tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()


# -- the Chrome trace and the plan JSON ------------------------------------------------------------

@pytest.mark.parametrize("name, p, m, unit, scale", [
    ("zb-h1", 4, 8, "us", 1.0), ("zb-v", 2, 4, "ms", 1e3), ("dualpipev", 2, 4, "unit", 1.0),
])
def test_chrome_trace_has_one_event_per_pass_at_the_simulated_times(name, p, m, unit, scale, tmp_path: Path) -> None:
    schedule = generate(name, p, m)
    profile = replace(uniform_profile(1, 2, 1, 0.1, p=p, m=m), time_unit=unit)
    export(schedule, "chrome-trace", tmp_path / "t.json", profile)
    trace = json.loads((tmp_path / "t.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    tracks = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert tracks == {r: f"rank {r}" for r in range(p)}
    assert len(events) == sum(len(list(schedule.passes(r))) for r in range(p))
    timeline = simulate(schedule, profile)
    expected = sorted((s.rank, str(a), s.start * scale, (s.end - s.start) * scale)
                      for s in timeline.iter_slots() for a in s.action.passes())
    got = sorted((e["tid"], e["args"]["action"], e["ts"], e["dur"]) for e in events)
    assert got == expected
    colours = {}
    for e in events:
        a = Action.parse(e["name"])   # named as torch names the action: 0F3, 1I0, 2W3, 3B0
        assert e["name"] == e["args"]["action"] == str(a)
        assert (e["cat"], e["args"]["kind"], e["args"]["chunk"], e["args"]["microbatch"]) == \
            (a.kind.value, a.kind.label, a.chunk, a.microbatch)
        assert colours.setdefault(e["cat"], e["cname"]) == e["cname"]
    for r in range(p):
        assert [e["name"] for e in events if e["tid"] == r] == [str(a) for a in schedule.passes(r)]


def test_chrome_trace_names_events_like_torch() -> None:
    schedule = generate("1f1b", 2, 2)
    trace = chrome_trace(simulate(schedule, uniform_profile(1, 2, 1, p=2, m=2)))
    names = [[e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == r] for r in range(2)]
    assert names == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]
    assert torch_csv(schedule) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"


@pytest.mark.parametrize("name, p, m", [("zb-h1", 4, 8), ("zb-v", 2, 4), ("dualpipev", 2, 4), ("1f1b", 3, 6)])
def test_chrome_trace_has_a_memory_counter_per_rank(name: str, p: int, m: int) -> None:
    schedule = generate(name, p, m)
    profile = replace(uniform_profile(1, 2, 1, 0.1, p=p, m=m, mem_B=2.0, mem_W=0.5), time_unit="ms")
    timeline = simulate(schedule, profile)
    trace = chrome_trace(timeline)
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {f"memory rank {r}" for r in range(p)}
    assert trace["otherData"]["memory_unit"] == "relative"
    for r in range(p):
        track = [e for e in counters if e["name"] == f"memory rank {r}"]
        assert all(e["tid"] == r and e["pid"] == 0 and e["cat"] == "memory" for e in track)
        points = [(e["ts"], e["args"]["activations"]) for e in track]
        assert points == [(0.0, 0.0)] + [(t * 1e3, level) for t, level, _ in timeline.memory[r]]
        assert [t for t, _ in points] == sorted(t for t, _ in points)
        assert max(v for _, v in points) == pytest.approx(timeline.peak_memory(r)) and timeline.peak_memory(r) > 0
        assert points[-1][1] == pytest.approx(0.0)  # every activation freed by the end


def test_plan_json_is_a_schedule_with_planned_times() -> None:
    schedule = generate("zb-v", 2, 4)
    timeline = simulate(schedule, uniform_profile(1, 1, 1, p=2, m=4))
    plan = json.loads(render(schedule, "json", timeline.profile))
    assert Schedule.from_dict(plan) == schedule
    assert plan == json.loads(json.dumps(plan_json(timeline)))
    for rank, slots in zip(plan["instructions"], timeline.slots):
        assert [(i["action"], i["start"], i["end"]) for i in rank] == [(str(s.action), s.start, s.end) for s in slots]


def test_chrome_trace_is_json_with_one_event_per_pass_for_every_schedule() -> None:
    for schedule in SCHEDULES:
        trace = chrome_trace(simulate(schedule, uniform_profile(1, 1, 1, p=schedule.num_ranks, m=schedule.num_microbatches)))
        assert json.loads(json.dumps(trace)) == trace
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert len(spans) == sum(len(a.passes()) for rank in schedule.ranks for a in rank), schedule.name


# -- the command line -------------------------------------------------------------------------------

def test_cli_export_then_import(tmp_path: Path) -> None:
    sched = tmp_path / "s.json"
    generate("zb-v", 2, 4).save(sched)
    result = runner.invoke(app, ["export", str(sched), "--format", "torch-csv", "-o", str(tmp_path / "s.csv")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["import", str(tmp_path / "s.csv"), "-o", str(tmp_path / "back.json")])
    assert result.exit_code == 0, result.output
    assert "placement v" in result.stdout
    assert Schedule.load(tmp_path / "back.json").ranks == Schedule.load(sched).ranks
    result = runner.invoke(app, ["export", str(sched), "-f", "chrome-trace", "--uniform", "1,1,1", "-o",
                                 str(tmp_path / "t.json")])
    assert result.exit_code == 0, result.output


def test_cli_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sched = tmp_path / "d.json"
    deadlocking().save(sched)
    result = runner.invoke(app, ["export", str(sched), "-f", "torch-csv", "-o", str(tmp_path / "d.csv")])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "deadlock" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "d.csv").exists()
    monkeypatch.setitem(sys.modules, "torch", None)
    generate("zb-h1", 2, 4).save(sched)
    result = runner.invoke(app, ["run", str(sched)])
    assert result.exit_code == 1
    assert "pip install 'zbsearch[torch]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_run_refuses_a_wrong_process_count(tmp_path: Path) -> None:
    sched = tmp_path / "s.json"
    generate("zb-h1", 2, 4).save(sched)
    result = runner.invoke(app, ["run", str(sched), "--nproc", "3"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == ["error: --nproc: process count 3 does not match schedule 'zb-h1', which has "
                                          "2 ranks: start 2 processes, one per rank"]


# -- torch's own checks as a second opinion ---------------------------------------------------------

@pytest.mark.torch
@pytest.mark.parametrize("schedule", SCHEDULES, ids=IDS)
def test_torch_loads_validates_lowers_and_dry_runs_every_export(schedule: Schedule, tmp_path: Path) -> None:
    path = export(schedule, "torch-csv", tmp_path / "s.csv")
    runtime = torch_runtime(path, schedule)  # _load_csv: _validate_schedule, then torch's lowering
    assert runtime.stage_index_to_group_rank == dict(enumerate(schedule.placement.chunk_to_rank))
    # torch-csv-comms is torch's own lowering, so it equals what the runtime executes.
    comms = export(schedule, "torch-csv-comms", tmp_path / "c.csv")
    lowered = runtime.pipeline_order_with_comms
    assert comms.read_text().splitlines() == [",".join(str(a) for a in lowered[r]) for r in range(schedule.num_ranks)]
    dry_run(lowered, runtime.stage_index_to_group_rank, schedule.placement.num_chunks)
    # The lowered file loads as it is, too.
    again = torch_runtime(comms, schedule, format="compute_comms")
    assert again.pipeline_order_with_comms == lowered
    # and the lowered file imports back to the same compute order
    assert import_torch_csv(comms).ranks == schedule.ranks


@pytest.mark.torch
def test_torch_accepts_solver_output(solver_schedules: list[Schedule], tmp_path: Path) -> None:
    for schedule in solver_schedules:
        path = export(schedule, "torch-csv", tmp_path / "s.csv")
        runtime = torch_runtime(path, schedule)
        dry_run(runtime.pipeline_order_with_comms, runtime.stage_index_to_group_rank, schedule.placement.num_chunks)


@pytest.mark.torch
def test_torch_lowering_rejects_the_deadlock_we_refuse(tmp_path: Path) -> None:
    from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule

    schedule = deadlocking()
    actions = {r: [_Action.from_str(str(a)) for a in rank] for r, rank in enumerate(schedule.ranks)}
    stage_to_rank = _validate_schedule(actions, 2, 2, 2)  # counts and per-rank order are fine ...
    with pytest.raises(AssertionError, match="can't schedule sends/recvs"):  # ... the lowering is not
        _add_send_recv({r: list(a) for r, a in actions.items()}, lambda s: stage_to_rank[s], 2)
    path = tmp_path / "d.csv"
    path.write_text(torch_csv(schedule))  # written by hand, bypassing export's refusal
    with pytest.raises(AssertionError):
        torch_runtime(path, schedule)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(schedule)


@pytest.mark.torch
@pytest.mark.parametrize("name, placement", [
    ("ZBVZeroBubble", "v"), ("InterleavedZeroBubble", "interleaved"), ("DualPipeV", "v"),
    ("Interleaved1F1B", "interleaved"), ("LoopedBFS", "interleaved"), ("GPipe", "linear"),
])
@pytest.mark.parametrize("p, m", [(2, 4), (4, 8)])
def test_torch_builtin_orders_import_validate_and_simulate(name: str, placement: str, p: int, m: int, tmp_path: Path) -> None:
    from zbsearch.interop.formats.torch_import import torch_builtin

    schedule = torch_builtin(name, p, m)
    assert schedule.placement.name == placement
    timeline = validate(schedule, uniform_profile(1, 1, 1, p=p, m=m))
    assert timeline is not None and timeline.makespan > 0
    path = export(schedule, "torch-csv", tmp_path / "b.csv")
    torch_runtime(path, schedule)


@pytest.mark.torch
def test_torch_1f1b_dump_bug_is_reported() -> None:
    from zbsearch.interop.formats.torch_import import torch_builtin

    with pytest.raises(ScheduleError, match="microbatch 8"):
        torch_builtin("1F1B", 4, 8)


@pytest.mark.torch
def test_cli_imports_a_torch_builtin(tmp_path: Path) -> None:
    out = tmp_path / "zbv.json"
    result = runner.invoke(app, ["import", "--torch-schedule", "ZBVZeroBubble", "-p", "4", "-m", "8", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert Schedule.load(out).placement == vshape(4)


def test_from_rows_accepts_none_cells() -> None:
    schedule = from_rows([["0F0", None, "0B0"], [None, "1F0", "1B0"]])
    assert schedule.count() == 4


@pytest.mark.torch
def test_our_validator_and_torch_lowering_agree_on_shuffled_orders() -> None:
    """Perturb handcrafted orders at random: every order we accept, torch's check and lowering accept,
    and every order we refuse, one of them refuses (seeded, so the same orders every run)."""
    import random

    from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule

    rng = random.Random(4)
    verdicts = set()
    for _ in range(120):
        p = rng.choice([2, 3])
        base = generate(rng.choice(["zb-h1", "1f1b", "zb-v", "interleaved-1f1b", "dualpipev"]), p, 2 * p)
        ranks = [list(r) for r in base.ranks]
        for _ in range(rng.randint(1, 6)):
            row = ranks[rng.randrange(p)]
            i = rng.randrange(len(row) - 1)
            j = min(len(row) - 1, i + rng.randint(1, 4))
            row[i], row[j] = row[j], row[i]
        schedule = build("shuffled", base.placement, base.num_microbatches, ranks)
        n = schedule.placement.num_chunks
        actions = {r: [_Action.from_str(str(a)) for a in row] for r, row in enumerate(schedule.ranks)}
        try:
            stage_to_rank = _validate_schedule(actions, p, n, schedule.num_microbatches)
            _add_send_recv({r: list(a) for r, a in actions.items()}, lambda s: stage_to_rank[s], n)
            torch_ok = True
        except AssertionError:
            torch_ok = False
        ours = validate_ok(schedule)
        assert ours == torch_ok, [[str(a) for a in r] for r in schedule.ranks]
        verdicts.add(ours)
    assert verdicts == {True, False}


def validate_ok(schedule: Schedule) -> bool:
    try:
        validate(schedule)
    except ScheduleError:
        return False
    return True
