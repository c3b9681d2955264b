"""The `zbsearch` command: parse the command line, call the library, render the answer.

Every ZbsearchError (and an OS error on a file) is caught in one place, `ZbsearchGroup.invoke`, so each
command, including ones added later, prints a failure as one line `error: ...` on stderr and exits 1.
Usage errors (an unknown flag, a non-integer -p) keep typer's own message and exit code 2.
Shared options are declared once, in options.py.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from typer.core import TyperGroup

from .. import __version__
from ..core.errors import ScheduleError, ZbsearchError
from .report import DEFAULT_TIME_LIMIT, HtmlOpt, check_output, write_html
from .console import print_error, print_warning, progress_bar, stdout_console
from .levers import DevicesOpt, DpShardOpt, MemoryModelOpt, RecomputeOpt, ShardingOpt, warn_paper_accounting
from .options import (AllowParamCopiesOpt, ChunksOpt, ExportTorchOpt, HeadroomOpt, JsonOpt, MemLimitOpt,
    MicrobatchesOpt, ObjectiveOpt, OutputOpt, PartitionOpt, PlacementOpt, ProfileOpt, SeedOpt, StagesOpt,
    TimeLimitOpt, UniformMemoryOpt, UniformOpt, WidthOpt, WorkersOpt, load_cli_profile, name_subject,
    parse_limit, problem_for_schedule)
from ..core.ir import Schedule
from ..core.objective import Objective
from ..core.memory import above_usable
from ..interop.formats.export import export
from ..search.entry.request import PlanRequest, planned_profile
from ..core.profile import profile_schema
from ..report import render
from ..report.render import fmt_number, gantt, headline, summary_table
from ..sim.summary import summarize
from ..schedules import REGISTRY, generate
from ..sim.validate import ValidationReport, check


class ZbsearchGroup(TyperGroup):
    """Runs a subcommand and turns a user-facing error into one line on stderr and exit code 1."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except ZbsearchError as exc:
            name_subject(exc)
            print_error(str(exc))
        except OSError as exc:
            where = f"{exc.filename}: " if exc.filename else ""
            print_error(f"{where}{exc.strerror or exc}")
        raise typer.Exit(1)


app = typer.Typer(
    name="zbsearch",
    cls=ZbsearchGroup,
    help="Pipeline-parallel schedules: generate handcrafted baselines, validate, simulate and show them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"zbsearch {__version__}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Pipeline-parallel schedules: generate handcrafted baselines, validate, simulate and show them."""


# -- helpers shared by commands ---------------------------------------------------------------

def _reason(report: ValidationReport, name: str) -> str:
    try:
        report.raise_if_invalid(name)
    except ScheduleError as exc:
        return str(exc)
    return ""


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=1) + "\n")


# -- commands ---------------------------------------------------------------------------------

@app.command()
def baseline(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Handcrafted schedule to generate (see `zbsearch list`).")],
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    m: MicrobatchesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    chunks: ChunksOpt = None,
    mem_limit: MemLimitOpt = None,
    output: OutputOpt = None,
    json_out: JsonOpt = False,
    memory_curve: Annotated[bool, typer.Option(
        "--memory-curve", rich_help_panel="Output",
        help="With --json: add each rank's activation memory over time (memory_curve_per_rank).")] = False,
) -> None:
    """Generate a handcrafted schedule, validate and simulate it on the profile, and summarize it.

    Exits 1 when the schedule breaks --mem-limit (the summary still prints, with valid false and the
    reason); -o is written only for a valid schedule.
    """
    prof = load_cli_profile(profile, uniform, p, m, uniform_memory)
    schedule = generate(name, prof.num_stages, prof.microbatches, chunks)
    limit = parse_limit(mem_limit, prof, placement=schedule.placement)
    report = check(schedule, prof, limit)
    if report.timeline is None:  # broken structure or a deadlock: nothing to summarize
        report.raise_if_invalid(schedule.name)
    assert report.timeline is not None  # (raise_if_invalid raised)
    summary = summarize(report.timeline, limit, valid=report.ok, memory_curve=memory_curve)
    reason = _reason(report, schedule.name)
    if reason:
        summary = replace(summary, reason=reason)
    elif output is not None:
        schedule.save(output)
    if json_out:
        _print_json(summary.to_dict())
    else:
        out = stdout_console()
        out.print(summary_table(summary))
        out.print(headline(summary))
        if output is not None and not reason:
            out.print(f"wrote {output}")
    if reason:
        raise ScheduleError(reason)


@app.command()
def show(
    schedule_file: Annotated[Path, typer.Argument(metavar="SCHEDULE.json", help="Schedule JSON to show.")],
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    width: WidthOpt = None,
) -> None:
    """Simulate a schedule on a profile: per-rank table and a Gantt chart of the ranks over time.

    With --uniform, -p defaults to the schedule's rank count.
    """
    schedule = Schedule.load(schedule_file)
    prof = problem_for_schedule(schedule, schedule_file, profile, uniform, p, uniform_memory)
    report = check(schedule, prof)
    report.raise_if_invalid(schedule.name)
    assert report.timeline is not None  # a valid schedule is simulated
    summary = summarize(report.timeline)
    out = stdout_console()
    out.print(summary_table(summary))
    out.print(headline(summary))
    out.print()
    out.print(gantt(report.timeline, width if width is not None else out.width))


@app.command()
def validate(
    schedule_file: Annotated[Path, typer.Argument(metavar="SCHEDULE.json", help="Schedule JSON to check.")],
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    mem_limit: MemLimitOpt = None,
) -> None:
    """Check a schedule: structure, completeness, deadlock, and with a profile its memory limit.

    Exits 0 when valid, 1 with the reason on one line otherwise. Without --profile or --uniform only
    structure, completeness and deadlock are checked. With --uniform, -p defaults to the schedule's.
    """
    schedule = Schedule.load(schedule_file)
    if mem_limit is not None and profile is None and uniform is None:
        raise ScheduleError("--mem-limit needs costs: add --profile PROFILE.json or --uniform F,B,W")
    prof = problem_for_schedule(schedule, schedule_file, profile, uniform, p, uniform_memory, optional=True)
    limit = parse_limit(mem_limit, prof, placement=schedule.placement) if prof is not None else None
    report = check(schedule, prof, limit)
    report.raise_if_invalid(schedule.name)
    what = (f"{schedule.name!r} is valid: {schedule.num_ranks} ranks, {schedule.num_microbatches} microbatches, "
            f"{schedule.count()} actions")
    if report.timeline is not None:
        tl = report.timeline
        what += f"; makespan {fmt_number(tl.makespan)} {prof.time_unit}"  # type: ignore[union-attr]
        if limit is not None:
            what += f"; within --mem-limit {limit.text}"
    else:
        what += " (structure and deadlock only: give --profile or --uniform for timing and memory)"
    stdout_console().print(what)


@app.command()
def solve(
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    m: MicrobatchesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    mem_limit: MemLimitOpt = None,
    objective: ObjectiveOpt = "makespan",
    placement: PlacementOpt = None,
    allow_param_copies: AllowParamCopiesOpt = False,
    partition: PartitionOpt = None,
    headroom: HeadroomOpt = 0.08,
    memory_model: MemoryModelOpt = None,
    recompute: RecomputeOpt = None,
    dp_shard: DpShardOpt = None,
    sharding: ShardingOpt = "fsdp",
    devices: DevicesOpt = None,
    time_limit: TimeLimitOpt = 30.0,
    workers: WorkersOpt = 2,
    seed: SeedOpt = 0,
    output: OutputOpt = None,
    export_torch: ExportTorchOpt = None,
    json_out: JsonOpt = False,
    html: HtmlOpt = None,
) -> None:
    """Search for the best schedule under a memory limit: heuristics, then CP-SAT, with a proven bound.

    The result never is worse than the best valid heuristic, has passed the validator with the exact times and
    limit before anything is written, and reports lower_bound, gap, status (optimal when the bound is met) and the
    heuristic it started from. --placement auto tries dualpipe (two parameter copies per rank) only with
    --allow-param-copies."""
    # defers OR-Tools (the solver) until a command solves: `zbsearch --help` and `list` stay quick
    from ..search.entry.find_plan import Progress, SearchOptions, find_plan, problems_for
    # defers OR-Tools, as above (the split search solves)
    from . import split

    if html is not None:
        check_output(html)
    if mem_limit is None:
        raise ZbsearchError("solve needs --mem-limit: e.g. --mem-limit 2p (or none for no limit)")
    if dp_shard is None and sharding != "fsdp":
        raise ZbsearchError(f"--sharding {sharding} goes with --dp-shard N: give the data-parallel degree too")
    prof = split.solve_profile(profile, uniform, p, m, uniform_memory, partition)
    request = PlanRequest(mem_limit, objective, placement, allow_param_copies, partition,
                          p if prof.layers is not None else None, headroom, memory_model, recompute, dp_shard,
                          sharding, devices)
    rule = request.partition_rule(prof)  # chunk costs from the layers where it has them; auto searches the split
    planned = planned_profile(prof, request)
    _warn_about_plan(planned, mem_limit, headroom, export_torch)
    if rule is None:
        _warn_even_chunks(planned, problems_for(planned, request), json_out)
    out = stdout_console()
    with progress_bar("solve", enabled=not json_out) as progress:
        def on_event(event: Progress) -> None:
            progress(int(event.elapsed), math.ceil(time_limit), render.search_status(event))

        result = find_plan(prof, request, SearchOptions(time_limit, workers, seed, progress=on_event))
    report = result.report()
    written = _write_plan(result, report, output, export_torch, html, objective)
    if json_out:
        _print_json(report.to_dict())
        return
    _print_solve(result, report, rule, partition is None)
    for path in written:
        out.print(f"wrote {path}")


def _write_plan(result: Any, report: Any, output: Path | None, export_torch: Path | None, html: Path | None,
                objective: str) -> list[Path]:
    """The plan file, its torch CSV and its HTML report, each where asked; the paths written."""
    if output is not None:
        result.schedule.save(output)
    if export_torch is not None:
        export(result.schedule, "torch-csv", export_torch)
    if html is not None:  # the solve's own bound and status; a short search for the plan without the cap
        write_html(html, result.timeline, result.problem.limit, Objective.parse(objective), DEFAULT_TIME_LIMIT, report)
    return [path for path in (output, export_torch, html) if path is not None]


def _print_solve(result: Any, report: Any, rule: str | None, implied: bool) -> None:
    """The solve's tables and lines on a terminal (or a pipe)."""
    # defers OR-Tools, as solve does (the split search's records)
    from . import split

    out = stdout_console()
    out.print(summary_table(report.summary))
    out.print(headline(report.summary))
    out.print(render.solve_headline(report))
    cap = render.cap_line(report)
    if cap is not None:
        out.print(cap)
    if rule is not None:
        out.print(split.split_table(result))
        out.print(split.bound_line(result))
        if implied:
            out.print("the profile lists its layers, so every chunk is costed from them (--partition balanced); "
                      "--partition auto searches the split too")


def _warn_about_plan(prof: Any, mem_limit: str, headroom: float, export_torch: Path | None) -> None:
    """A size above the device less its headroom is taken as written; say so (it is rarely meant). And a
    plan for torch's runtime made with the paper's memory accounting holds more than planned."""
    why = above_usable(mem_limit, prof, headroom)
    if why is not None:
        print_warning(f"--mem-limit: {why}")
    if export_torch is not None:
        warn_paper_accounting(prof, "--export-torch's CSV")


def _warn_even_chunks(prof: Any, problems: list[Any], quiet: bool) -> None:
    """Chunked placements on a stage-level profile cost each chunk as an even share of its rank's stage,
    which no trainer runs (the embedding and the head are not halves of stages): say so."""
    chunked = [pr.placement.name for pr in problems if pr.placement.num_chunks > pr.placement.num_ranks]
    if not chunked or quiet or (prof.chunks is not None):
        return
    fix = ("add --partition balanced (or auto) to cost every chunk from its layers" if prof.layers is not None
           else "the profile has no layers, so these costs are a guess")
    print_warning(f"on {', '.join(chunked)} each chunk's cost is an even split of its rank's stage; {fix}")


@app.command("list")
def list_schedules() -> None:
    """List the handcrafted schedules `baseline` can generate."""
    table = Table(title="handcrafted schedules", title_justify="left")
    table.add_column("name", style="bold")
    table.add_column("chunks per rank")
    table.add_column("summary")
    for gen in REGISTRY.values():
        chunks = f"--chunks V (default {gen.default_chunks})" if gen.takes_chunks else "fixed"
        table.add_row(gen.name, chunks, gen.summary)
    stdout_console().print(table)


@app.command()
def schema() -> None:
    """Print the JSON Schema (draft 2020-12) of the profile format."""
    _print_json(profile_schema())


# -- more commands register here: one line per module, `from .x import register; register(app)` --
from .profiling import register; register(app)  # noqa: E402,E702
from .compare import register; register(app)  # noqa: E402,E702
from .plan import register; register(app)  # noqa: E402,E702
from .interop import register; register(app)  # noqa: E402,E702
from .run import register; register(app)  # noqa: E402,E702
from .fidelity import register; register(app)  # noqa: E402,E702
from .report import register; register(app)  # noqa: E402,E702
from .configure import register; register(app)  # noqa: E402,E702


def main() -> None:
    """Console-script entry point."""
    app(prog_name="zbsearch")


if __name__ == "__main__":
    main()
