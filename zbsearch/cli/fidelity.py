"""`zbsearch calibrate` and `zbsearch fidelity`: measure what torch's pipelining runtime adds to a profile
(interop/run/calibrate.py), and compare the simulator's predictions with runs on torch (studies/fidelity*.py).
Added to the main app by `register(app)`; nothing here imports torch.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..core.profile import Profile, load_profile
from ..profiling.distributed import reports_here
from .console import stdout_console
from .levers import MemoryModelOpt
from .options import OUTPUT_PANEL, PROBLEM_PANEL, flags_for
from .params import StrList, parse_str_list
from .run import BackendOpt, DeviceOpt, TimeoutOpt, TORCH_PANEL
from ..interop.run.calibrate import calibrate
from ..studies.fidelity import StudyRequest, require_model, run_study
from ..studies.fidelity_analysis import analyse
from ..studies.fidelity_report import write_study

ProfileArg = Annotated[Path, typer.Argument(metavar="PROFILE.json", help="A profile measured by zbsearch profile.")]
CalStepsOpt = Annotated[int, typer.Option(
    "--steps", metavar="N", rich_help_panel=TORCH_PANEL, help="Timed iterations of every run.")]
CalWarmupOpt = Annotated[int, typer.Option(
    "--warmup", metavar="K", rich_help_panel=TORCH_PANEL, help="Untimed iterations before them.")]
CalOutOpt = Annotated[Path, typer.Option(
    "-o", "--output", metavar="CALIBRATED.json", rich_help_panel=OUTPUT_PANEL,
    help="Where to write the calibrated profile (atomically).")]
CalibratedOpt = Annotated[Optional[Path], typer.Option(
    "--calibrated", metavar="CALIBRATED.json", rich_help_panel=PROBLEM_PANEL,
    help="A calibrated profile of the same model (zbsearch calibrate). Default: calibrate first, and write it "
         "to PREFIX-profile.json.")]
NoCalibrateOpt = Annotated[bool, typer.Option(
    "--no-calibrate", rich_help_panel=PROBLEM_PANEL, help="Compare with the raw profile only.")]
LimitsOpt = Annotated[StrList, typer.Option(
    "--mem-limits", metavar="LIMIT[,LIMIT...]", rich_help_panel=PROBLEM_PANEL, parser=parse_str_list,
    help="Memory limits zbsearch solves at (1p, 2p, a size).")]
FixedOpt = Annotated[StrList, typer.Option(
    "--schedules", metavar="NAME[,NAME...]", rich_help_panel=PROBLEM_PANEL, parser=parse_str_list,
    help="Handcrafted schedules to run (names from zbsearch list); none for no handcrafted ones.")]
TorchOrdersOpt = Annotated[StrList, typer.Option(
    "--torch-orders", metavar="NAME[,NAME...]", rich_help_panel=PROBLEM_PANEL, parser=parse_str_list,
    help="torch's built-in orders to run (ZBVZeroBubble, InterleavedZeroBubble, Interleaved1F1B, GPipe, ...); "
         "none for none.")]
RepeatsOpt = Annotated[int, typer.Option(
    "--repeats", metavar="R", rich_help_panel=TORCH_PANEL,
    help="Runs of every schedule, round robin (their medians give the run-to-run spread).")]
SolveSecondsOpt = Annotated[float, typer.Option(
    "--solve-seconds", metavar="S", rich_help_panel=PROBLEM_PANEL, help="Time limit of every solve.")]
PinOpt = Annotated[bool, typer.Option(
    "--pin/--no-pin", rich_help_panel=TORCH_PANEL,
    help="Pin rank r to the r-th CPU this process may use (Linux), besides one torch thread per rank.")]
StudyOutOpt = Annotated[Path, typer.Option(
    "-o", "--output", metavar="PREFIX", rich_help_panel=OUTPUT_PANEL,
    help="Writes PREFIX.md, PREFIX.csv and PREFIX.png (and PREFIX-profile.json when it calibrates); the folder "
         "is created.")]

# The study takes a list of memory limits, so its flag for the limit is --mem-limits (SUBJECT_FLAGS names the rest).
FIDELITY_FLAGS = {"mem_limit": "--mem-limits"}


def _none(values: tuple[str, ...]) -> tuple[str, ...]:
    return () if [v.lower() for v in values] == ["none"] else tuple(values)


def calibrate_command(
    profile: ProfileArg, output: CalOutOpt, steps: CalStepsOpt = 20, warmup: CalWarmupOpt = 3,
    backend: BackendOpt = "gloo", device: DeviceOpt = None, timeout: TimeoutOpt = 300.0,
    memory_model: MemoryModelOpt = None, pin: PinOpt = True,
) -> None:
    """Measure torch's per-action overhead and message times on this machine and add them to a profile.

    Runs the profile's rank count as processes (gloo on the CPU by default): ranks 0 and 1 time messages
    of growing size, then a pipeline of negligible compute runs ZB-H1 and the overhead per action is
    what makes the simulator reproduce its step time. The simulator, heuristics, bounds and solver then
    add the overhead to every pass and read hops off the message table. Needs torch.
    """

    result = calibrate(load_profile(profile), backend=backend, device=device, steps=steps, warmup=warmup,
                       timeout_s=timeout, memory_model=memory_model, pin_cpu=pin)
    if not reports_here():  # torchrun's other ranks: rank 0 writes the same result
        return
    result.save(output)
    out = stdout_console()
    info = result.details["calibration"]
    out.print(f"action overhead: {result.action_overhead:.1f} {result.time_unit} per action "
              f"(ZB-H1 step measured {info['measured_step_s'] * 1e3:.2f} ms)")
    out.print("message times: " + ", ".join(f"{b:.0f} B {t:.1f} {result.time_unit}" for b, t in result.comm_table or ()))
    out.print(f"comm per boundary: {', '.join(f'{c:.1f}' for c in result.comm)} {result.time_unit}; memory model "
              f"{result.memory_model}; wrote {output}")


def fidelity_command(
    profile: ProfileArg, output: StudyOutOpt = Path("results/fidelity"), calibrated: CalibratedOpt = None,
    no_calibrate: NoCalibrateOpt = False,
    mem_limits: LimitsOpt = "1p,2p",  # type: ignore[assignment]  # typer parses defaults too
    schedules: FixedOpt = "1f1b,zb-h1,zb-h2,zb-v,interleaved-1f1b",  # type: ignore[assignment]
    torch_orders: TorchOrdersOpt = "ZBVZeroBubble,InterleavedZeroBubble,Interleaved1F1B",  # type: ignore[assignment]
    steps: CalStepsOpt = 10, warmup: CalWarmupOpt = 2, repeats: RepeatsOpt = 2, solve_seconds: SolveSecondsOpt = 20.0,
    backend: BackendOpt = "gloo", device: DeviceOpt = None, timeout: TimeoutOpt = 600.0, pin: PinOpt = True,
) -> None:
    """Run every schedule on torch and compare the simulator's iteration time and memory with what ran.

    For the profile's model: the handcrafted schedules, torch's built-in orders and zbsearch's solved
    schedule at each memory limit (on the raw and the calibrated profile), each run --repeats times.
    Writes a report with per schedule the predicted and measured iteration time (median, min, max), their
    ratio, whether the orders agree and which term of the model errs, and the predicted against the
    measured peak activation memory per rank; a CSV and a figure. Needs torch and matplotlib.
    """

    raw = load_profile(profile)
    require_model(raw)
    output.parent.mkdir(parents=True, exist_ok=True)
    out = stdout_console()
    cal: Profile | None = None
    with flags_for(FIDELITY_FLAGS):
        if calibrated is not None:
            cal = load_profile(calibrated)
        elif not no_calibrate:
            out.print("calibrating ...")
            cal = calibrate(raw, backend=backend, device=device, timeout_s=timeout, memory_model="torch-runtime",
                            pin_cpu=pin)
            cal.save(Path(f"{output}-profile.json"))
        request = StudyRequest(raw, cal, tuple(mem_limits), _none(schedules), _none(torch_orders), steps, warmup,
                               repeats, solve_seconds, backend, device, timeout, pin)
        study = run_study(request, progress=lambda what: out.print(what))
    rows = analyse(study)
    command = "zbsearch " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    for path in write_study(study, rows, output, command):
        out.print(f"wrote {path}")
    for row in rows:
        out.print(f"{row.label:28s} measured {((row.measured or 0) * 1e3):9.1f} ms  "
                  + "  ".join(f"{v} {row.entry.predicted[v] * 1e3:9.1f} ms" for v in study.variants))


def register(app: typer.Typer) -> None:
    """Add `calibrate` and `fidelity` to the zbsearch app."""
    app.command("calibrate")(calibrate_command)
    app.command("fidelity")(fidelity_command)
