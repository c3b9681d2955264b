"""`zbsearch run`: execute a schedule on torch.distributed (one process per rank), check its gradients and
show the measured times next to the profile's. Added to the main app by `register(app)`.

It only parses, calls interop.runtime.run and renders; errors are ZbsearchErrors that the main app prints
on one line. Nothing here imports torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from ..core.errors import ZbsearchError
from ..core.fileio import write_atomic
from ..core.ir import Kind, Schedule
from ..core.profile import Profile
from .console import print_warning, stdout_console
from .options import (OUTPUT_PANEL, JsonOpt, ProfileOpt, StagesOpt, UniformMemoryOpt, UniformOpt,
    problem_for_schedule)
from ..interop.run.launcher import run, thread_mismatch
from ..profiling.distributed import reports_here

if TYPE_CHECKING:
    from ..interop.run.launcher import RunResult

TORCH_PANEL = "torch"

NprocOpt = Annotated[Optional[int], typer.Option(
    "--nproc", metavar="N", rich_help_panel=TORCH_PANEL,
    help="Processes, one per rank. Default (and the only value allowed): the schedule's rank count.",
)]
BackendOpt = Annotated[str, typer.Option(
    "--backend", metavar="gloo|nccl", rich_help_panel=TORCH_PANEL,
    help="torch.distributed backend: gloo runs on CPU; nccl needs one GPU per rank.",
)]
DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", metavar="cpu|cuda", rich_help_panel=TORCH_PANEL,
    help="Where each rank computes: cpu (gloo) or cuda:<rank> (nccl). Default: the backend's.",
)]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", metavar="profile|mlp|gpt-tiny", rich_help_panel=TORCH_PANEL,
    help="profile: the model --profile was measured or estimated from (its GPT or factory, cut by its "
         "partition or the schedule's meta.partition, in its dtype). mlp, gpt-tiny: a small float64 model, "
         "one chunk per stage. Default: profile when the profile records a model, else mlp.",
)]
StepsOpt = Annotated[int, typer.Option(
    "--steps", metavar="N", rich_help_panel=TORCH_PANEL,
    help="Timed iterations (after the warm-up ones); each is checked against the reference.",
)]
WarmupOpt = Annotated[int, typer.Option(
    "--warmup", metavar="K", rich_help_panel=TORCH_PANEL,
    help="Untimed iterations first (shape inference, allocation); checked too.",
)]
CheckOpt = Annotated[Optional[bool], typer.Option(
    "--check/--no-check", rich_help_panel=TORCH_PANEL, show_default=False,
    help="Compare the profiled model's gradients with a float64 single-process reference. Default: on for "
         "models up to 20M parameters. The small test models are always checked.",
)]
TimeoutOpt = Annotated[float, typer.Option(
    "--timeout", metavar="SECONDS", rich_help_panel=TORCH_PANEL,
    help="Stop every process and fail when the run (start-up included) takes longer.",
)]
CommsOpt = Annotated[bool, typer.Option(
    "--comms", rich_help_panel=TORCH_PANEL,
    help="Run the torch-csv-comms export (lowered by torch, loaded with format=\"compute_comms\") "
         "instead of the compute-only CSV.",
)]
RunSeedOpt = Annotated[int, typer.Option(
    "--seed", metavar="K", rich_help_panel=TORCH_PANEL, help="Seed of the model weights and the batch.",
)]
RunOutputOpt = Annotated[Optional[Path], typer.Option(
    "-o", "--output", metavar="RESULT.json", rich_help_panel=OUTPUT_PANEL,
    help="Also write the result JSON (as --json prints it) here, atomically, once the run has finished.",
)]

def run_command(
    schedule_file: Annotated[Path, typer.Argument(metavar="SCHEDULE.json", help="Schedule JSON to run.")],
    profile: ProfileOpt = None,
    model: ModelOpt = None,
    steps: StepsOpt = 3,
    warmup: WarmupOpt = 1,
    check: CheckOpt = None,
    nproc: NprocOpt = None,
    backend: BackendOpt = "gloo",
    device: DeviceOpt = None,
    timeout: TimeoutOpt = 300.0,
    seed: RunSeedOpt = 0,
    comms: CommsOpt = False,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    json_out: JsonOpt = False,
    output: RunOutputOpt = None,
) -> None:
    """Run a schedule on torch.distributed (one process per rank) and check it against a single process.

    Started by torchrun (`torchrun --nnodes N --nproc-per-node K ... -m zbsearch run ...`, N*K ranks), each
    process runs its own rank, found from torchrun's environment, and rank 0 prints the report.

    With --profile, runs the model the profile was made from, cut into the schedule's chunks, in the
    profile's dtype, and prints per step the measured iteration time and per rank, chunk and pass the
    measured mean next to the profile's time (a profile that records no model runs a small float64
    model). Compares the loss and every parameter gradient with a single-process reference and
    exits 1 when anything differs. Needs torch: pip install 'zbsearch\\[torch]'.
    """

    schedule = Schedule.load(schedule_file)
    prof = problem_for_schedule(schedule, schedule_file, profile, uniform, p, uniform_memory, optional=True)
    if reports_here():
        warn_test_model_recompute(schedule, prof, model)
    mismatch = thread_mismatch(prof)
    if mismatch is not None and reports_here():
        print_warning(mismatch)
    result = run(schedule, nproc, backend, model, steps, profile=prof, seed=seed, comms=comms,
                 warmup=warmup, device=device, check=check, timeout_s=timeout)
    if not reports_here():  # torchrun's other ranks: rank 0 prints and writes the same result
        raise typer.Exit(0 if result.ok else 1)
    text = json.dumps(result.to_dict(), indent=1) + "\n"
    if output is not None:
        write_atomic(output, text)
    if json_out:
        sys.stdout.write(text)
    else:
        out = stdout_console()
        out.print(pass_table(result))
        out.print(step_table(result))
        out.print(headline(result))
    if not result.ok:
        listed = "; ".join(result.problems[:3]) + (f"; and {len(result.problems) - 3} more" if len(result.problems) > 3 else "")
        raise ZbsearchError(f"{schedule.name!r} on torch does not match the reference: {listed}")


def warn_test_model_recompute(schedule: Schedule, prof: Profile | None, model: str | None) -> None:
    """Say when a plan recomputes layers of a profile's model but the run executes a small test model,
    which has none of them (the profile's own model runs the plan's recompute)."""
    levels = schedule.plan.levels
    runs_profile = prof is not None and isinstance(prof.details.get("model"), dict) and model in (None, "profile")
    if levels and not runs_profile:
        print_warning(f"schedule {schedule.name!r} recomputes {len(levels)} layer(s) of its profile's model "
                      "(plan.recompute), but this run executes a small test model, which has none of them, "
                      "so it runs without recompute: run the plan's model with its profile (--profile, --model "
                      "profile)")


def _layers(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"


def _pass(kind: str) -> str:
    label = Kind(kind).label
    return kind if label == kind else f"{kind} ({label})"


def _profile_seconds(result: RunResult) -> bool:
    """Whether the profile's times are comparable as they are: it ran the profile's own model, and the
    profile's unit is a known one (else the plan is shown in its unit and scaled to the measurements)."""
    return result.partition is not None and result.profile_step_seconds is not None


def pass_table(result: RunResult) -> Table:
    """Per rank, chunk and pass kind: the measured mean next to the profile's time."""
    table = Table(title=f"{result.schedule} on torch ({result.backend}, {result.device}, {result.model}, "
                        f"{result.dtype}): time per pass", title_justify="left")
    for col in ("rank", "chunk", "layers", "pass", "n", "measured ms"):
        table.add_column(col, justify="left" if col in ("layers", "pass") else "right")
    planned = result.time_unit is not None
    in_seconds = _profile_seconds(result)
    if in_seconds:
        table.add_column("profile ms", justify="right")
        table.add_column("ratio", justify="right")
    elif planned:
        table.add_column(f"plan ({result.time_unit})", justify="right")
        table.add_column("plan, scaled ms", justify="right")
    for row in result.passes:
        layers = _layers(result.partition[row.chunk]) if result.partition else ""
        cells = [str(row.rank), str(row.chunk), layers, _pass(row.kind), str(row.count), f"{row.mean_s * 1e3:.3f}"]
        if in_seconds and row.profile_s is not None:
            prof = row.profile_s
            cells += [f"{prof * 1e3:.3f}", f"{row.mean_s / prof:.2f}" if prof > 0 else "-"]
        elif planned and row.profile is not None:
            scale = result.plan_seconds_per_unit
            cells += [f"{row.profile:.4g}", "" if scale is None else f"{row.profile * scale * 1e3:.3f}"]
        table.add_row(*cells)
    return table


def step_table(result: RunResult) -> Table:
    """Per timed step: the slowest rank's iteration time, next to the profile's makespan."""
    table = Table(title="iteration time per step (slowest rank)", title_justify="left")
    table.add_column("step", justify="right")
    table.add_column("measured ms", justify="right")
    if _profile_seconds(result):
        table.add_column("profile ms", justify="right")
    for i, seconds in enumerate(result.step_seconds):
        cells = [str(result.warmup + i), f"{seconds * 1e3:.2f}"]
        if _profile_seconds(result) and result.profile_step_seconds is not None:
            cells.append(f"{result.profile_step_seconds * 1e3:.2f}")
        table.add_row(*cells)
    return table


def headline(result: RunResult) -> str:
    if not result.checked:
        check = "gradients not checked (--check compares them with a float64 single-process reference)."
    else:
        verdict = "match" if result.ok else "DO NOT match"
        precision = (f"max |diff| {result.max_grad_diff:.2g}" if result.dtype == "fp64" else
                     f"largest relative error {result.max_grad_rel_error:.2g}, {result.dtype} against float64")
        check = (f"loss {result.loss:.6g} (reference {result.reference_loss:.6g}); gradients of "
                 f"{result.parameters_checked} parameters {verdict} the single-process reference ({precision}).")
    recompute = result.details.get("recompute")
    if recompute:
        levels = recompute["layers"]
        check += (f"\nrecompute: {len(levels)} layer(s) ({', '.join(f'{k} {v}' for k, v in sorted(levels.items()))}), "
                  f"forwards run again per rank {recompute['forwards_run_again']}"
                  + ("" if recompute["microbatches"] is None else ", only the microbatches the plan lists") + ".")
    return (
        f"{check}\nstep time: measured {result.measured_step_seconds * 1e3:.2f} ms (median, slowest rank); the plan "
        f"with the measured pass times predicts {result.predicted_step_seconds * 1e3:.2f} ms "
        "(it leaves out communication and launch overheads)."
    )


def register(app: typer.Typer) -> None:
    """Add `run` to the zbsearch app."""
    app.command("run")(run_command)
