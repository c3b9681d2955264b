"""Write a schedule where other tools read it: torch.distributed.pipelining's CSV, our plan JSON, and a
Chrome / Perfetto trace of the simulated timeline.

Formats (see FORMATS):
- torch-csv: one row per rank, one compute action per cell (`0F1`, `1I0`, `2W3`, `3B0`,
  `(0F3;3B1)OVERLAP_F_B`), global stage indices; what `_PipelineScheduleRuntime._load_csv(path,
  format="compute_only")` (torchtitan's `--parallelism.pipeline_parallel_schedule_csv`) loads. Needs no
  torch.
- torch-csv-comms: the same order lowered by torch itself (UNSHARD/RESHARD, REDUCE_GRAD, SEND/RECV), as
  `_prepare_schedule_with_comms` would lower it at load time; loadable with format="compute_comms".
  Needs torch.
- json: the schedule JSON (so every zbsearch command still reads it) plus, per rank, each instruction
  with its planned start and end on a profile. Needs a profile.
- chrome-trace: the simulated timeline as Trace Event JSON (chrome://tracing, ui.perfetto.dev): one
  track per rank, one complete event per pass, named as torch names the action (`0F3`: stage 0, forward,
  microbatch 3; `1I0`, `2W3`, `3B0` as in the CSV) and coloured by kind, and one memory counter track
  per rank (activations held, in the profile's memory unit). Needs a profile.
- torchtitan: the torch-csv file plus, beside it, the torchtitan config that runs it (pipeline degree,
  the schedule name that builds the placement's stages, the CSV path, `module_fqns_per_model_part` and
  the microbatch count): for torchtitan main a Python module (suffix .py) with `apply_pipeline(config)`,
  for 0.2 the `[parallelism]` TOML table (suffix .toml); see torchtitan.py. Needs the layer split
  (interop/formats/layer_split.py), which must name every module of torchtitan's model once.
- megatron-layout: Megatron-LM's pipeline arguments on one line: pipeline size, the layout string
  (`Et*3|t*4|...|ttL`), the decoder (and MTP) layer counts, and the plan's recompute flags where
  Megatron can express them (megatron_recompute.py). Needs the layer split; linear and interleaved
  placements only.

Every export validates the schedule first (structure, completeness, deadlock; times with a profile)
and renders the whole file in memory before writing it atomically, so a failed export leaves no file.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from ...core.errors import ScheduleError, ZbsearchError
from ...core.fileio import write_atomic
from ...core.ir import Action, Kind, Schedule
from ...core.profile import Profile
from ...sim.simulate import Timeline
from ...sim.validate import validate
from .layer_split import split_of
from .torchtitan import CONFIG_SUFFIX, resolve_version, torchtitan_config
from .trainers import check_megatron_placement, megatron_args
from .torch_import import torch_schedules

FORMATS: dict[str, str] = {
    "torch-csv": "compute-only CSV for torch's _PipelineScheduleRuntime / torchtitan (no torch needed)",
    "torch-csv-comms": "CSV lowered by torch with SEND/RECV, REDUCE_GRAD, UNSHARD/RESHARD (needs torch)",
    "json": "schedule JSON plus per-rank instructions with planned start/end (needs a profile)",
    "chrome-trace": "Trace Event JSON of the simulated timeline for Perfetto / chrome://tracing (needs a profile)",
    "torchtitan": "torch-csv at FILE plus torchtitan's config beside it: FILE's name with .py (main and 0.3: "
                  "apply_pipeline(config)) or .toml (0.2: its tables) (needs the layer split and the profile)",
    "megatron-layout": "Megatron-LM arguments: pipeline size, layout string, layer counts, the plan's recompute "
                       "where Megatron can express it (needs the layer split)",
}
NEEDS_PROFILE = ("json", "chrome-trace")
NEEDS_SPLIT = ("torchtitan", "megatron-layout")

# Trace Event "cname" values (chrome://tracing's reserved palette), one per kind. Perfetto ignores
# cname and colours by event name, so there each action gets its own colour.
TRACE_COLOURS = {
    Kind.F: "rail_response",
    Kind.B: "thread_state_iowait",
    Kind.W: "thread_state_running",
    Kind.FULL_B: "terrible",
}
# Trace Event timestamps are microseconds; profile times in these units are converted.
_TO_MICROSECONDS = {"s": 1e6, "ms": 1e3, "us": 1.0, "ns": 1e-3}


def torch_compatible(schedule: Schedule) -> None:
    """Raise ScheduleError unless torch's runtime can run this placement and the last stage's order.

    torch numbers stages along one chain 0..N-1 (stage s feeds stage s+1); our placements with a single
    route 0..N-1 (linear, interleaved, V-shape) map onto it one to one. The two model copies of DualPipe's
    placement (DualPipe, Chimera) do not.
    """
    pl = schedule.placement
    if pl.routes != (tuple(range(pl.num_chunks)),):
        hint = (" (two model copies, one per direction: torch runs one; dualpipev is DualPipe's V-shape form on one "
                "copy)") if pl.name == "dualpipe" else ""
        raise ScheduleError(
            f"schedule {schedule.name!r} has placement {pl.name!r} with routes {[list(r) for r in pl.routes]}: "
            f"torch's pipelining runtime runs one chain of stages 0..{pl.num_chunks - 1}; export a linear, "
            f"interleaved or V-shape schedule{hint}"
        )
    loss_chunk = pl.routes[0][-1]
    last = [a.microbatch for rank in schedule.ranks for action in rank for a in action.passes()
            if a.kind is Kind.F and a.chunk == loss_chunk]
    k = next((k for k, mb in enumerate(last) if mb != k), None)
    if k is not None:
        # torch keeps the last stage's losses in a list and looks one up by its microbatch's index: the k-th
        # forward there must be microbatch k, or a backward takes another microbatch's loss.
        raise ScheduleError(
            f"schedule {schedule.name!r} runs microbatch {last[k]} as forward number {k + 1} of the last stage "
            f"(chunk {loss_chunk}): torch's runtime looks the last stage's losses up by the order of its "
            "forwards, so they must run in microbatch order; solve it again with this zbsearch")


def torch_rows(schedule: Schedule) -> list[list[str]]:
    """Per rank, the action strings torch parses (`_Action.from_str`)."""
    return [[str(a) for a in rank] for rank in schedule.ranks]


def _csv(rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows(rows)
    return buf.getvalue()


def torch_csv(schedule: Schedule) -> str:
    """The compute-only CSV text: row r is rank r's actions in order (no idle cells)."""
    return _csv(torch_rows(schedule))


def torch_lowered(schedule: Schedule) -> list[list[Any]]:
    """Per rank, torch's `_Action`s after torch's own lowering (the same passes, in the same order, as
    `_PipelineScheduleRuntime._prepare_schedule_with_comms(..., format="compute_only")`).

    Raises DependencyError without torch, ScheduleError when torch refuses the order.
    """

    S = torch_schedules("the torch-csv-comms export")
    p, n, m = schedule.num_ranks, schedule.placement.num_chunks, schedule.num_microbatches
    actions = {r: [S._Action.from_str(a) for a in row] for r, row in enumerate(torch_rows(schedule))}
    try:
        stage_to_rank = S._validate_schedule(actions, p, n, m)
        lowered = {r: S._add_reduce_grad(S._add_unshard_reshard(list(acts)), m) for r, acts in actions.items()}
        lowered = S._add_send_recv(lowered, stage_to_rank=lambda s: stage_to_rank[s], num_stages=n)
    except (AssertionError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ScheduleError(f"torch refuses to lower schedule {schedule.name!r}: {first}") from None
    return [list(lowered[r]) for r in range(p)]


def torch_csv_comms(schedule: Schedule) -> str:
    return _csv([[str(a) for a in row] for row in torch_lowered(schedule)])


def _microseconds_per_unit(time_unit: str) -> float:
    return _TO_MICROSECONDS.get(time_unit.strip().lower(), 1.0)


def _describe(action: Action) -> dict[str, Any]:
    if action.kind is Kind.OVERLAP:
        return {"action": str(action), "kind": action.kind.value, "chunk": None, "microbatch": None,
                "passes": [str(a) for a in action.pair]}
    return {"action": str(action), "kind": action.kind.value, "chunk": action.chunk, "microbatch": action.microbatch}


def plan_json(timeline: Timeline) -> dict[str, Any]:
    """The schedule's own JSON plus `instructions`: per rank, each action with planned start and end
    (in the profile's time unit) from the simulator."""
    schedule, profile = timeline.schedule, timeline.profile
    out = schedule.to_dict()
    out["format"] = "zbsearch-plan/1"
    out["profile"] = profile.name
    out["time_unit"] = profile.time_unit
    out["makespan"] = timeline.makespan
    out["instructions"] = [
        [dict(_describe(s.action), start=s.start, end=s.end) for s in rank] for rank in timeline.slots
    ]
    return out


def chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """Trace Event JSON: pid 0 is the pipeline, tid r is rank r; one "X" event per pass, named like
    torch's action (`0F3`), and one "C" counter track per rank ("memory rank r") with the activations
    held after every allocation and free.

    Times are the simulator's, converted to microseconds when the profile's unit is s, ms, us or ns
    (any other unit is written as if it were microseconds; `otherData.time_unit` says which).
    An overlapped F&B pair gives two events with the pair's start and end.
    """
    schedule, profile = timeline.schedule, timeline.profile
    scale = _microseconds_per_unit(profile.time_unit)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": f"zbsearch: {schedule.name}"}},
    ]
    for r in range(timeline.num_ranks):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": r, "args": {"sort_index": r}})
    events.extend(_pass_events(timeline, scale))
    events.extend(_memory_events(timeline, scale))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schedule": schedule.name, "profile": profile.name, "time_unit": profile.time_unit,
                      "microseconds_per_unit": scale, "makespan": timeline.makespan,
                      "memory_unit": profile.memory_unit},
    }


def _pass_events(timeline: Timeline, scale: float) -> list[dict[str, Any]]:
    events = []
    for slot in timeline.iter_slots():
        for a in slot.action.passes():
            args = {"action": str(a), "kind": a.kind.label, "chunk": a.chunk, "microbatch": a.microbatch,
                    "rank": slot.rank, "step": slot.index, "start": slot.start, "end": slot.end}
            if slot.action.kind is Kind.OVERLAP:
                args["overlap"] = str(slot.action)
            events.append({
                "name": str(a), "cat": a.kind.value, "ph": "X", "pid": 0, "tid": slot.rank,
                "ts": slot.start * scale, "dur": (slot.end - slot.start) * scale,
                "cname": TRACE_COLOURS[a.kind], "args": args,
            })
    return events


def _memory_events(timeline: Timeline, scale: float) -> list[dict[str, Any]]:
    """Per rank, the activation level from 0 at time 0 through every change the simulator recorded
    (several at one instant are all kept; viewers show the last)."""
    events: list[dict[str, Any]] = []
    for r, curve in enumerate(timeline.memory):
        name = f"memory rank {r}"
        points = [(0.0, 0.0)] + [(t, level) for t, level, _ in curve]
        events.extend({"name": name, "cat": "memory", "ph": "C", "pid": 0, "tid": r, "ts": t * scale,
                       "args": {"activations": level}} for t, level in points)
    return events


def render(schedule: Schedule, fmt: str, profile: Profile | None = None) -> str:
    """Validate `schedule` and return the text of `fmt` (see FORMATS; torchtitan writes two files, see
    `render_files`). Writes nothing. For megatron-layout, `profile` is where the split comes from when
    the schedule carries none.

    Raises
    ------
    ZbsearchError
        Unknown format; json / chrome-trace without a profile; torch-csv-comms without torch.
    ScheduleError
        The schedule is invalid (incomplete, deadlocks, or does not fit the profile), or torch's runtime
        (or Megatron-LM's layout) cannot run its placement, or torch's lowering refuses it.
    PartitionError
        megatron-layout without a layer split, or with one that does not fit the schedule.
    """
    if fmt not in FORMATS:
        raise ZbsearchError(f"unknown export format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if fmt == "torchtitan":
        raise ZbsearchError("the torchtitan export writes two files (the CSV and its config): use render_files or "
                            "export")
    if fmt in NEEDS_PROFILE and profile is None:
        raise ZbsearchError(f"the {fmt} export needs costs for the timeline: give a profile")
    timeline = validate(schedule, None if fmt in NEEDS_SPLIT else profile)
    if fmt in ("torch-csv", "torch-csv-comms"):
        torch_compatible(schedule)
    if fmt == "torch-csv":
        return torch_csv(schedule)
    if fmt == "torch-csv-comms":
        return torch_csv_comms(schedule)
    if fmt == "megatron-layout":
        check_megatron_placement(schedule)
        return megatron_args(schedule, split_of(schedule, profile))
    assert timeline is not None  # a profile was given, so validate simulated it
    if fmt == "json":
        return json.dumps(plan_json(timeline), indent=1) + "\n"
    return json.dumps(chrome_trace(timeline)) + "\n"


def config_path(path: str | Path, torchtitan: str) -> Path:
    """Where the torchtitan export puts its config: beside the CSV, with the suffix of the version's
    config (.py for main, .toml for 0.2)."""
    return Path(path).with_suffix(CONFIG_SUFFIX[torchtitan])


def render_files(schedule: Schedule, fmt: str, path: str | Path, profile: Profile | None = None,
                 torchtitan: str | None = None) -> list[tuple[Path, str]]:
    """Every file `fmt` writes for `path`, with its text, all rendered (and checked) before any is
    written: the torchtitan export is the torch-csv at `path` and the config of `torchtitan` (main, 0.3
    or 0.2; None: the installed one, else main) at `config_path(path, version)`, which needs the profile
    the plan was made on (its microbatch)."""
    path = Path(path)
    if fmt != "torchtitan":
        return [(path, render(schedule, fmt, profile))]
    version, _ = resolve_version(torchtitan)
    config = config_path(path, version)
    if config == path:
        raise ZbsearchError(f"the torchtitan export writes the CSV to {str(path)!r} and its config beside it with the "
                            f"suffix {config.suffix}: name the CSV file with another suffix, e.g. schedule.csv")
    text = render(schedule, "torch-csv", profile)
    levels, _ = schedule.plan.levels_for_every_microbatch(schedule.num_microbatches)
    return [(path, text), (config, torchtitan_config(schedule, split_of(schedule, profile), str(path), version,
                                                     levels, profile))]


def export_files(schedule: Schedule, fmt: str, path: str | Path, profile: Profile | None = None,
                 torchtitan: str | None = None) -> list[Path]:
    """As `export`, returning every file written (two for torchtitan: the CSV, then its config)."""
    files = render_files(schedule, fmt, path, profile, torchtitan)
    for target, text in files:
        write_atomic(target, text)
    return [target for target, _ in files]


def export(schedule: Schedule, fmt: str, path: str | Path, profile: Profile | None = None,
           torchtitan: str | None = None) -> Path:
    """Validate `schedule`, render it as `fmt` and write it to `path` whole or not at all.

    Parameters
    ----------
    schedule
        The schedule to write.
    fmt
        One of FORMATS: torch-csv, torch-csv-comms, json, chrome-trace, torchtitan, megatron-layout.
    path
        Where to write; its folder must exist. The torchtitan export also writes `config_path(path, version)`.
    profile
        Costs for the simulated times (needed by json and chrome-trace; with torch-csv it only adds a
        check that the schedule fits the profile). For torchtitan, the microbatch (details.model); for
        torchtitan and megatron-layout, the layer split
        when the schedule carries none (`details.partition.layers_per_stage`; names, module paths and
        kinds from its `layers` when it has them).
    torchtitan
        The torchtitan version the torchtitan export writes for: "main" or "0.3" (a Python config) or "0.2"
        (TOML); None: the one installed here, else main.

    Returns
    -------
    Path
        The file written (for torchtitan, the CSV).

    Raises
    ------
    ZbsearchError, ScheduleError, PartitionError
        As `render`; nothing is written.

    Examples
    --------
    >>> from zbsearch.schedules import generate
    >>> export(generate("zb-h1", 4, 8), "torch-csv", "zbh1.csv")  # doctest: +SKIP
    PosixPath('zbh1.csv')
    """
    return export_files(schedule, fmt, path, profile, torchtitan)[0]
