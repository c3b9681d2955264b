"""The torch commands `export` and `import` (`run` is in run.py), added to the main app by `register(app)`.

They only parse, call export / torch_import / runtime, and render; errors are ZbsearchErrors that the
main app prints on one line. Nothing here imports torch: the library functions do, when they need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..core.errors import ZbsearchError
from ..core.profile import load_profile
from ..interop.formats.export import FORMATS, NEEDS_PROFILE, NEEDS_SPLIT, export_files
from ..interop.formats.layer_split import split_of
from ..interop.formats.megatron_recompute import megatron_recompute
from ..interop.formats.torchtitan import CHECKED, resolve_version
from .console import print_warning, stdout_console
from .options import (OUTPUT_PANEL, PROBLEM_PANEL, ProfileOpt, StagesOpt, UniformMemoryOpt, UniformOpt,
    flags_for, problem_for_schedule)
from .levers import warn_every_microbatch, warn_paper_accounting
from .params import parse_chunks, parse_microbatches
from ..core.ir import Schedule
from ..sim.validate import validate
from ..interop.formats.torch_import import import_torch_csv, torch_builtin

TORCH_PANEL = "torch"

FormatOpt = Annotated[str, typer.Option(
    "--format", "-f", metavar="|".join(FORMATS), rich_help_panel=OUTPUT_PANEL,
    help="What to write: " + "; ".join(f"{k}: {v}" for k, v in FORMATS.items()) + ".",
)]
ExportOutputOpt = Annotated[Path, typer.Option(
    "-o", "--output", metavar="FILE", rich_help_panel=OUTPUT_PANEL,
    help="File to write (atomically), only once the schedule has passed validation.",
)]
TorchtitanOpt = Annotated[Optional[str], typer.Option(
    "--torchtitan", metavar="main|0.3|0.2", rich_help_panel=OUTPUT_PANEL,
    help="With --format torchtitan, the torchtitan to write for: main or 0.3 (a Python config, FILE's name with .py, "
         "head lm_head) or 0.2 (the TOML \\[parallelism] table, \\[training] and \\[activation_checkpoint], FILE's name "
         "with .toml, head output). Default: the torchtitan installed "
         "here, else main.",
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
def export_command(
    schedule_file: Annotated[Path, typer.Argument(metavar="SCHEDULE.json", help="Schedule JSON to export.")],
    fmt: FormatOpt,
    output: ExportOutputOpt,
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    torchtitan: TorchtitanOpt = None,
) -> None:
    """Write a schedule for torch.distributed.pipelining (CSV), its layer split for a trainer, or a plan /
    trace of its timeline.

    torch-csv loads unchanged with _PipelineScheduleRuntime._load_csv(FILE, format="compute_only"), i.e.
    torchtitan's pipeline_parallel_schedule_csv. torchtitan writes that CSV to FILE and beside it the config
    that runs it with the split (module_fqns_per_model_part, ...): for torchtitan main a Python module with
    apply_pipeline(config) (FILE's name with .py), for 0.2 the \\[parallelism] TOML table (.toml).
    megatron-layout writes Megatron-LM's --pipeline-model-parallel-layout and companion arguments. Both take
    the layer split from the schedule (solved on a layer profile) or from --profile. json and chrome-trace
    need --profile or --uniform (with --uniform, -p defaults to the schedule's rank count).
    """
    schedule = Schedule.load(schedule_file)
    if fmt in NEEDS_SPLIT:
        if uniform is not None:
            raise ZbsearchError(f"--format {fmt} needs a layer split, which --uniform does not have: give the split's "
                                "--profile PROFILE.json, or a schedule solved on a layer profile")
        prof = None if profile is None else load_profile(profile)
    else:
        prof = problem_for_schedule(schedule, schedule_file, profile, uniform, p, uniform_memory, optional=True)
    if fmt in NEEDS_PROFILE and prof is None:
        raise ZbsearchError(f"--format {fmt} needs costs for the timeline: add --profile PROFILE.json or "
                            "--uniform F,B,W")
    if fmt in ("torch-csv", "torch-csv-comms", "torchtitan"):
        warn_paper_accounting(prof, f"--format {fmt}")
    if fmt == "torchtitan":
        warn_every_microbatch(schedule, "torchtitan")
    if torchtitan is not None and fmt != "torchtitan":
        raise ZbsearchError(f"--torchtitan {torchtitan} goes with --format torchtitan: drop it, or export that format")
    version, why = resolve_version(torchtitan) if fmt == "torchtitan" else (None, "")  # once: it reads the disk
    paths = export_files(schedule, fmt, output, prof, version)
    out = stdout_console()
    out.print(f"wrote {paths[0]} ({'torch-csv' if fmt == 'torchtitan' else fmt}: {schedule.num_ranks} ranks, "
              f"{schedule.placement.num_chunks} stages, {schedule.num_microbatches} microbatches, "
              f"{schedule.count()} actions)", soft_wrap=True, markup=False)
    if fmt == "torchtitan":
        assert version is not None  # resolved above for torchtitan
        what, sets = (("TOML tables", "the plan's recompute and sharding") if version == "0.2" else
                      ("Python config, apply_pipeline(config)", "CUDA graphs off, the plan's recompute, attention and "
                       "sharding"))
        out.print(f"wrote {paths[1]} (torchtitan {CHECKED[version]}, {why}: {what} with module_fqns_per_model_part "
                  f"for {schedule.placement.num_chunks} stages, the CSV's path, degree, stage layout, microbatch count "
                  f"and size, {sets})",
                  soft_wrap=True, markup=False)
    elif fmt == "megatron-layout":
        vpp = schedule.placement.num_chunks // schedule.num_ranks
        out.print(f"Megatron-LM arguments: {paths[0].read_text().strip()}\nMegatron derives {vpp} virtual stage(s) per "
                  "rank from the layout (leave --num-virtual-stages-per-pipeline-rank out) and runs its own 1F1B "
                  "order: only the split, and the recompute where the plan has one, come from this "
                  "schedule.", soft_wrap=True, markup=False)
        statement = megatron_recompute(schedule, split_of(schedule, prof)).statement
        if statement is not None:  # the plan's memory is not what Megatron will hold
            print_warning(statement)


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

    if (csv_file is None) == (torch_schedule is None):
        raise ZbsearchError("give either a CSV file or --torch-schedule NAME (with -p and -m), not both or neither")
    if torch_schedule is not None:
        if p is None or microbatches is None:
            raise ZbsearchError(f"--torch-schedule {torch_schedule} needs -p P and -m M, e.g. -p 4 -m 8")
        schedule = torch_builtin(torch_schedule, p, microbatches, stages_per_rank)
    else:
        if p is not None or stages_per_rank is not None:
            raise ZbsearchError("-p and --stages-per-rank go with --torch-schedule; a CSV has one row per rank")
        with flags_for({"microbatches": "--microbatches"}):  # import has always named -m by its long name
            schedule = import_torch_csv(csv_file, microbatches)  # type: ignore[arg-type]
    validate(schedule)
    schedule.save(output)
    pl = schedule.placement
    stdout_console().print(f"imported {schedule.name!r}: placement {pl.name}, {schedule.num_ranks} ranks, {pl.num_chunks} "
                    f"stages, {schedule.num_microbatches} microbatches, {schedule.count()} actions; wrote {output}")


def register(app: typer.Typer) -> None:
    """Add `export` and `import` to the zbsearch app (`run` is in run.py)."""
    app.command("export")(export_command)
    app.command("import")(import_command)
