"""The torch commands: `export`, `import` and `run`, added to the main app by `register(app)`.

They only parse, call export / torch_import / runtime, and render; errors are ZbsearchErrors that the
main app prints on one line. Nothing here imports torch: the library functions do, when they need it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from ..core.errors import ZbsearchError
from ..core.profile import load_profile
from ..interop.export import FORMATS, NEEDS_PROFILE, NEEDS_SPLIT, export_files
from .console import stdout_console
from .options import (
    OUTPUT_PANEL, PROBLEM_PANEL, JsonOpt, ProfileOpt, StagesOpt, UniformMemoryOpt, UniformOpt, naming_subjects,
    problem_for_schedule,
)
from .params import parse_chunks, parse_microbatches
from ..core.ir import Kind, Schedule
from ..sim.validate import validate

if TYPE_CHECKING:
    from ..interop.runtime import RunResult

TORCH_PANEL = "torch"

FormatOpt = Annotated[str, typer.Option(
    "--format", "-f", metavar="|".join(FORMATS), rich_help_panel=OUTPUT_PANEL,
    help="What to write: " + "; ".join(f"{k}: {v}" for k, v in FORMATS.items()) + ".",
)]
ExportOutputOpt = Annotated[Path, typer.Option(
    "-o", "--output", metavar="FILE", rich_help_panel=OUTPUT_PANEL,
    help="File to write (atomically), only once the schedule has passed validation.",
)]
ImportOutputOpt = Annotated[Path, typer.Option(
    "-o", "--output", metavar="SCHEDULE.json", rich_help_panel=OUTPUT_PANEL,
    help="Write the imported schedule JSON here (atomically), only once it has passed validation.",
)]
ImportMicrobatchesOpt = Annotated[Optional[int], typer.Option(
    "-m", "--microbatches", metavar="M", rich_help_panel=PROBLEM_PANEL, parser=parse_microbatches,
    help="Microbatches per iteration. Default: the largest microbatch in the file, plus one.",
)]
TorchScheduleOpt = Annotated[Optional[str], typer.Option(
    "--torch-schedule", metavar="NAME", rich_help_panel=TORCH_PANEL,
    help="Import one of torch's built-in orders instead of a file: ZBVZeroBubble, InterleavedZeroBubble, "
         "DualPipeV, Interleaved1F1B, LoopedBFS, GPipe (needs -p and -m; needs torch).",
)]
StagesPerRankOpt = Annotated[Optional[int], typer.Option(
    "--stages-per-rank", metavar="V", rich_help_panel=TORCH_PANEL, parser=parse_chunks,
    help="With --torch-schedule: stages per rank (default 2 for multi-stage schedules).",
)]
NprocOpt = Annotated[Optional[int], typer.Option(
    "--nproc", metavar="N", rich_help_panel=TORCH_PANEL,
    help="Processes, one per rank. Default (and the only value allowed): the schedule's rank count.",
)]
BackendOpt = Annotated[str, typer.Option(
    "--backend", metavar="gloo|nccl", rich_help_panel=TORCH_PANEL,
    help="torch.distributed backend: gloo runs on CPU; nccl needs one GPU per rank.",
)]
ModelOpt = Annotated[str, typer.Option(
    "--model", metavar="mlp|gpt-tiny", rich_help_panel=TORCH_PANEL,
    help="Model cut into one chunk per stage: a Linear+Tanh MLP, or a tiny causal transformer.",
)]
StepsOpt = Annotated[int, typer.Option(
    "--steps", metavar="K", rich_help_panel=TORCH_PANEL,
    help="Iterations to run; each is checked against the reference, all but the first are timed.",
)]
CommsOpt = Annotated[bool, typer.Option(
    "--comms", rich_help_panel=TORCH_PANEL,
    help="Run the torch-csv-comms export (lowered by torch, loaded with format=\"compute_comms\") "
         "instead of the compute-only CSV.",
)]
RunSeedOpt = Annotated[int, typer.Option(
    "--seed", metavar="K", rich_help_panel=TORCH_PANEL, help="Seed of the model weights and the batch.",
)]


def export_command(
    schedule_file: Annotated[Path, typer.Argument(metavar="SCHEDULE.json", help="Schedule JSON to export.")],
    fmt: FormatOpt,
    output: ExportOutputOpt,
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
) -> None:
    """Write a schedule for torch.distributed.pipelining (CSV), its layer split for a trainer, or a plan /
    trace of its timeline.

    torch-csv loads unchanged with _PipelineScheduleRuntime._load_csv(FILE, format="compute_only"), i.e.
    torchtitan's --parallelism.pipeline_parallel_schedule_csv FILE. torchtitan writes that CSV to FILE and
    torchtitan's \\[parallelism] keys (module_fqns_per_model_part, ...) to FILE with the suffix .toml.
    megatron-layout writes Megatron-LM's --pipeline-model-parallel-layout and companion arguments. Both take
    the layer split from the schedule (solved on a layer profile) or from --profile. json and chrome-trace
    need --profile or --uniform (with --uniform, -p defaults to the schedule's rank count).
    """
    schedule = Schedule.load(schedule_file)
    if fmt in NEEDS_SPLIT:
        if uniform is not None:
            raise ZbsearchError(f"--format {fmt} needs a layer split, which --uniform does not have: give the split's "
                                "--profile PROFILE.json, or a schedule solved on a layer profile")
        problem = None if profile is None else load_profile(profile)
    else:
        problem = problem_for_schedule(schedule, schedule_file, profile, uniform, p, uniform_memory, optional=True)
    if fmt in NEEDS_PROFILE and problem is None:
        raise ZbsearchError(f"--format {fmt} needs costs for the timeline: add --profile PROFILE.json or "
                            "--uniform F,B,W")
    paths = export_files(schedule, fmt, output, problem)
    out = stdout_console()
    out.print(f"wrote {paths[0]} ({'torch-csv' if fmt == 'torchtitan' else fmt}: {schedule.num_ranks} ranks, "
              f"{schedule.placement.num_chunks} stages, {schedule.num_microbatches} microbatches, "
              f"{schedule.count()} actions)", soft_wrap=True, markup=False)
    if fmt == "torchtitan":
        out.print(f"wrote {paths[1]} (torchtitan [parallelism]: module_fqns_per_model_part for "
                  f"{schedule.placement.num_chunks} stages, the CSV's path, degree and stage layout)",
                  soft_wrap=True, markup=False)
    elif fmt == "megatron-layout":
        vpp = schedule.placement.num_chunks // schedule.num_ranks
        out.print(f"Megatron-LM arguments: {paths[0].read_text().strip()}\nMegatron derives {vpp} virtual stage(s) per "
                  "rank from the layout (leave --num-virtual-stages-per-pipeline-rank out) and runs its own 1F1B "
                  "order: only the split comes from this schedule.", soft_wrap=True, markup=False)


def import_command(
    output: ImportOutputOpt,
    csv_file: Annotated[Optional[Path], typer.Argument(
        metavar="FILE.csv", help="torch schedule CSV: compute-only or with comms (comm actions are dropped).")] = None,
    microbatches: ImportMicrobatchesOpt = None,
    torch_schedule: TorchScheduleOpt = None,
    p: StagesOpt = None,
    stages_per_rank: StagesPerRankOpt = None,
) -> None:
    """Turn a torch pipeline schedule CSV (or one of torch's built-in orders) into a zbsearch schedule.

    Reads ours, torchtitan's, or one dumped from torch's schedules, compute-only or with comms (comm
    actions are dropped); the placement is inferred from which row mentions each stage. The schedule is
    validated (structure, completeness, deadlock) before it is written.
    """
    from ..interop.torch_import import import_torch_csv, torch_builtin

    if (csv_file is None) == (torch_schedule is None):
        raise ZbsearchError("give either a CSV file or --torch-schedule NAME (with -p and -m), not both or neither")
    if torch_schedule is not None:
        if p is None or microbatches is None:
            raise ZbsearchError(f"--torch-schedule {torch_schedule} needs -p P and -m M, e.g. -p 4 -m 8")
        schedule = torch_builtin(torch_schedule, p, microbatches, stages_per_rank)
    else:
        if p is not None or stages_per_rank is not None:
            raise ZbsearchError("-p and --stages-per-rank go with --torch-schedule; a CSV has one row per rank")
        with naming_subjects({"--microbatches": "microbatch count"}):
            schedule = import_torch_csv(csv_file, microbatches)  # type: ignore[arg-type]
    validate(schedule)
    schedule.save(output)
    pl = schedule.placement
    stdout_console().print(f"imported {schedule.name!r}: placement {pl.name}, {schedule.num_ranks} ranks, {pl.num_chunks} "
                    f"stages, {schedule.num_microbatches} microbatches, {schedule.count()} actions; wrote {output}")


def run_command(
    schedule_file: Annotated[Path, typer.Argument(metavar="SCHEDULE.json", help="Schedule JSON to run.")],
    nproc: NprocOpt = None,
    backend: BackendOpt = "gloo",
    model: ModelOpt = "mlp",
    steps: StepsOpt = 3,
    seed: RunSeedOpt = 0,
    comms: CommsOpt = False,
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Run a schedule on torch.distributed (one process per rank) and check it against a plain model.

    Exports the schedule as a compute-only CSV, runs it through torch's _PipelineScheduleRuntime on a
    small model, and compares the loss and every parameter gradient with a single-process reference.
    Prints the measured time of each pass kind per rank (next to the plan with --profile/--uniform) and
    exits 1 when anything differs. Needs torch: pip install 'zbsearch\\[torch]'.
    """
    from ..interop.runtime import run

    schedule = Schedule.load(schedule_file)
    problem = problem_for_schedule(schedule, schedule_file, profile, uniform, p, uniform_memory, optional=True)
    subjects = {"--nproc": "process count", "--backend": "backend", "--model": "model", "--steps": "step count"}
    with naming_subjects(subjects):
        result = run(schedule, nproc, backend, model, steps, profile=problem, seed=seed, comms=comms)
    if json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
    else:
        out = stdout_console()
        out.print(_timing_table(result))
        out.print(_headline(result))
    if not result.ok:
        listed = "; ".join(result.problems[:3]) + (f"; and {len(result.problems) - 3} more" if len(result.problems) > 3 else "")
        raise ZbsearchError(f"{schedule.name!r} on torch does not match the reference: {listed}")


def _timing_table(result: RunResult) -> Table:

    planned = result.planned is not None
    table = Table(title=f"{result.schedule} on torch ({result.backend}, {result.model}): time per pass",
                  title_justify="left")
    for col in ("rank", "stages", "pass", "count", "measured ms"):
        table.add_column(col, justify="right" if col not in ("pass",) else "left")
    if planned:
        table.add_column(f"plan ({result.time_unit})", justify="right")
        table.add_column("plan, scaled ms", justify="right")
    stages = result.details.get("stages_per_rank", [])
    for r, kinds in enumerate(result.measured):
        for k, v in kinds.items():
            row = [str(r), ",".join(map(str, stages[r])) if r < len(stages) else "", f"{k} ({Kind(k).label})",
                   str(v["count"]), f"{v['mean_s'] * 1e3:.3f}"]
            if planned:
                plan = result.planned[r].get(k)
                scale = result.plan_seconds_per_unit
                row += ["" if plan is None else f"{plan:.4g}",
                        "" if plan is None or scale is None else f"{plan * scale * 1e3:.3f}"]
            table.add_row(*row)
    return table


def _headline(result: RunResult) -> str:
    verdict = "match" if result.ok else "DO NOT match"
    return (
        f"loss {result.loss:.6g} (reference {result.reference_loss:.6g}); gradients of "
        f"{result.parameters_checked} parameters {verdict} the single-process reference "
        f"(max |diff| {result.max_grad_diff:.2g}).\n"
        f"step time: measured {result.measured_step_seconds * 1e3:.2f} ms (median, slowest rank); the plan "
        f"with the measured pass times predicts {result.predicted_step_seconds * 1e3:.2f} ms "
        "(it leaves out communication and launch overheads)."
    )


def register(app: typer.Typer) -> None:
    """Add `export`, `import` and `run` to the zbsearch app."""
    app.command("export")(export_command)
    app.command("import")(import_command)
    app.command("run")(run_command)
