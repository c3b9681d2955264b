"""`zbsearch compare` and `zbsearch plot`: research tables and figures (see studies/compare.py and
report/plot.py).

Registered on the main app by one line in app.py (`register(app)`); errors are ZbsearchErrors, which
the app prints as one line and exit 1.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from .console import progress_bar, stdout_console
from .report import DEFAULT_TIME_LIMIT, write_html
from .options import (OUTPUT_PANEL, PROBLEM_PANEL, ChunksOpt, ObjectiveOpt, PlacementOpt, ProfileOpt, SeedOpt,
    StagesOpt, TimeLimitOpt, UniformMemoryOpt, UniformOpt, WorkersOpt, flags_for, load_cli_profile,
    parse_limit, problem_for_schedule)
from .params import IntList, StrList, parse_figure_formats, parse_microbatch_list, parse_str_list
from ..core.objective import Objective
from ..search.options import SearchOptions
from ..studies import compare as cmp
from ..report.plot import require_matplotlib
from ..core.ir import Schedule
from ..report.plot import figure_format, plot_gantt
from ..sim.validate import check

# compare takes a list of memory limits, so its flag for the limit is --mem-limits (SUBJECT_FLAGS names the rest).
COMPARE_FLAGS = {"mem_limit": "--mem-limits"}

# Options only these commands take (the shared ones come from options.py).
MicrobatchListOpt = Annotated[Optional[IntList], typer.Option(
    "-m", "--microbatches", metavar="M[,M...]", rich_help_panel=PROBLEM_PANEL, parser=parse_microbatch_list,
    help="Microbatch counts to compare at, e.g. 24,32,64. Default: the profile's; with --uniform, 2p.",
)]
MemLimitsOpt = Annotated[StrList, typer.Option(
    "--mem-limits", metavar="LIMIT[,LIMIT...]", rich_help_panel=PROBLEM_PANEL, parser=parse_str_list,
    help="Memory limits to compare at; zbsearch is solved at each (see --mem-limit in `solve`: 1p, 2p, "
         "1.5p, 40GiB, auto, none).",
)]
SchedulesOpt = Annotated[str, typer.Option(
    "--schedules", metavar="all|handcrafted|torch|NAME,...", rich_help_panel=PROBLEM_PANEL,
    help="Which fixed schedules to compare: all (every handcrafted schedule, plus torch's "
         "InterleavedZeroBubble, ZBVZeroBubble and DualPipeV when torch is installed), handcrafted, torch, "
         "none, or names from `zbsearch list` and those torch names.",
)]
NoTorchOpt = Annotated[bool, typer.Option(
    "--no-torch", rich_help_panel=PROBLEM_PANEL, help="Leave torch's built-in orders out of `all`.",
)]
PrefixOpt = Annotated[Path, typer.Option(
    "-o", "--output", metavar="PREFIX", rich_help_panel=OUTPUT_PANEL,
    help="Where to write: PREFIX.md, PREFIX.csv, PREFIX_gantt.png and PREFIX_pareto.png (with several -m, "
         "PREFIX_mM_gantt.png ...). The folder is created.",
)]
FiguresOpt = Annotated[StrList, typer.Option(
    "--figures", metavar="png|svg|png,svg|none", rich_help_panel=OUTPUT_PANEL, parser=parse_figure_formats,
    help="Figure formats (they need matplotlib, the plot extra of zbsearch).",
)]
FigureOutOpt = Annotated[Path, typer.Option(
    "-o", "--output", metavar="FIGURE.png|FIGURE.svg", rich_help_panel=OUTPUT_PANEL,
    help="Figure file to write; the format follows the suffix.",
)]
HtmlPagesOpt = Annotated[bool, typer.Option(
    "--html", rich_help_panel=OUTPUT_PANEL,
    help="Also write PREFIX_mM_LIMIT.html: zbsearch's plan at each microbatch count and limit as one "
         "self-contained page (as `zbsearch report` writes it).",
)]
TitleOpt = Annotated[Optional[str], typer.Option(
    "--title", metavar="TEXT", rich_help_panel=OUTPUT_PANEL,
    help="Chart title. Default: the schedule's name, bubble rate, makespan and peak memory.",
)]


def register(app: typer.Typer) -> None:
    """Add `compare` and `plot` to the zbsearch app."""
    app.command("compare")(compare_command)
    app.command("plot")(plot_command)


def compare_command(
    output: PrefixOpt,
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    m: MicrobatchListOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    mem_limits: MemLimitsOpt = "1p,2p",  # type: ignore[assignment]  # typer parses defaults too
    schedules: SchedulesOpt = "all",
    no_torch: NoTorchOpt = False,
    chunks: ChunksOpt = None,
    objective: ObjectiveOpt = "makespan",
    placement: PlacementOpt = None,
    time_limit: TimeLimitOpt = 30.0,
    workers: WorkersOpt = 2,
    seed: SeedOpt = 0,
    figures: FiguresOpt = "png",  # type: ignore[assignment]
    html: HtmlPagesOpt = False,
) -> None:
    """Compare every handcrafted schedule, torch's built-in orders and zbsearch at each memory limit.

    Writes PREFIX.md (a table per microbatch count and limit: schedule, memory limit, bubble rate,
    makespan, peak memory per rank, solve time, gap), PREFIX.csv (the same rows) and figures (a grid of
    Gantt charts on one time axis and a memory-bubble Pareto plot). Schedules over a limit stay in the
    table, marked; zbsearch is solved at each limit with --time-limit seconds.
    """
    import sys

    prof = load_cli_profile(profile, uniform, p, m[0] if m else None, uniform_memory)
    # The option's one default (its help): every placement where the layers cost each chunk, else linear.
    placement = placement or ("auto" if prof.layers is not None else "linear")
    for limit in mem_limits:
        # a limit that does not apply is reported naming the profile file
        parse_limit(limit, prof, COMPARE_FLAGS["mem_limit"])
    if figures:
        require_matplotlib()  # say it is missing before the long part
    with progress_bar("compare") as progress, flags_for(COMPARE_FLAGS):
        comp = cmp.compare(
            prof, microbatches=list(m) if m else None, limits=list(mem_limits), schedules=schedules,
            objective=objective, options=SearchOptions(time_limit, workers, seed), placement=placement, chunks=chunks,
            with_torch=False if no_torch else None, progress=progress)
    comp.command = "zbsearch " + " ".join(_quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["compare"] else None
    written = cmp.write(comp, output, list(figures))
    if html:
        written += _write_pages(comp, output, objective)
    out = stdout_console()
    for mm in comp.microbatches:
        for limit in comp.limits:
            rows = cmp.sorted_rows(comp.rows_for(mm, limit))
            fits = [r for r in rows if r.within_limit]
            if fits:
                best = fits[0]
                out.print(f"m={mm} {limit}: best {best.schedule} ({best.placement}) bubble {best.bubble_rate:.2%}; "
                          f"{len(fits)} of {len(rows)} schedules fit")
    for skip in comp.skipped:
        out.print(f"skipped at m={skip.microbatches}: {skip.schedule}: {skip.reason}")
    for path in written:
        out.print(f"wrote {path}")


def _write_pages(comp: cmp.Comparison, prefix: Path, objective: str) -> list[Path]:
    """zbsearch's plan at each microbatch count and limit as an HTML page (cli/report.write_html: its quality
    figures from short searches, as `zbsearch report` gives them); the paths written."""
    written = []
    for mm in comp.microbatches:
        for limit in comp.limits:
            for row in comp.rows_for(mm, limit):
                if row.source != "zbsearch" or row.timeline is None:
                    continue
                path = prefix.parent / f"{prefix.name}_m{mm}_{re.sub(r'[^A-Za-z0-9.]+', '_', limit)}.html"
                schedule = row.timeline.schedule
                cap = parse_limit(limit, row.timeline.profile, COMPARE_FLAGS["mem_limit"], schedule.placement)
                write_html(path, row.timeline, cap, Objective.parse(objective), DEFAULT_TIME_LIMIT)
                written.append(path)
    return written


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def plot_command(
    schedule_file: Annotated[Path, typer.Argument(metavar="SCHEDULE.json", help="Schedule JSON to draw.")],
    output: FigureOutOpt,
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    title: TitleOpt = None,
) -> None:
    """Draw a schedule's Gantt chart: one row per rank, time to the right, one colour per pass kind,
    the microbatch number in each cell, each rank's idle time and peak memory on the right.

    The schedule is validated (structure, completeness, deadlock) and simulated on the profile first.
    With --uniform, -p defaults to the schedule's rank count.
    """

    figure_format(output)
    schedule = Schedule.load(schedule_file)
    prof = problem_for_schedule(schedule, schedule_file, profile, uniform, p, uniform_memory)
    report = check(schedule, prof)
    report.raise_if_invalid(schedule.name)
    assert report.timeline is not None  # a valid schedule is simulated
    plot_gantt(report.timeline, output, title=title)
    typer.echo(f"wrote {output}")

