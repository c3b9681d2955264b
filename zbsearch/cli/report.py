"""`zbsearch report PLAN.json --profile PROFILE.json -o plan.html`: a plan as one self-contained HTML page
(report/html.py), and `write_html`, which `solve --html` calls too.

Every plan is validated on its profile at its limit before anything is rendered, and the page is
written atomically once whole: a plan that does not match its profile or fails validation, or a path that
cannot be written, is one line on stderr (ZbsearchGroup) and leaves no file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ..core.errors import FileError
from ..core.fileio import write_atomic
from ..core.ir import Schedule
from ..core.memory import MemoryLimit
from ..core.objective import Objective
from ..report.html import page
from ..report.quality import quality_of
from ..sim.simulate import Timeline
from ..sim.validate import check
from .console import stdout_console
from .options import (OUTPUT_PANEL, SEARCH_PANEL, MemLimitOpt, ObjectiveOpt, ProfileOpt, StagesOpt,
    UniformMemoryOpt, UniformOpt, parse_limit, problem_for_schedule)

if TYPE_CHECKING:
    from ..search.solve.report import SolveReport

# A page's quality figures come from two short searches (a bound at the plan's limit, and the plan
# without it): a few seconds, so that `report` stays quick.
DEFAULT_TIME_LIMIT = 2.0

HtmlOutOpt = Annotated[Path, typer.Option(
    "-o", "--output", metavar="PLAN.html", rich_help_panel=OUTPUT_PANEL,
    help="The HTML page to write (atomically, after validation): one file, no network needed to view it.",
)]
HtmlOpt = Annotated[Optional[Path], typer.Option(
    "--html", metavar="PLAN.html", rich_help_panel=OUTPUT_PANEL,
    help="Also write the plan as one self-contained HTML page (as `zbsearch report`), atomically.",
)]
ReportTimeOpt = Annotated[float, typer.Option(
    "--time-limit", metavar="SECONDS", rich_help_panel=SEARCH_PANEL, min=0.0,
    help="Seconds for the quality figures: half for a bound at the plan's limit, half for the plan without "
         "a memory limit.",
)]


def register(app: typer.Typer) -> None:
    """Add `report` to the zbsearch app."""
    app.command("report")(report_command)


def check_output(path: Path) -> None:
    """Fail before the searches, not after them, where the page cannot be written."""
    if not path.parent.is_dir():
        raise FileError(f"cannot write {path}: folder {path.parent} does not exist (create it first)")
    if path.is_dir():
        raise FileError(f"cannot write {path}: it is a folder; give a file name such as plan.html")


def write_html(path: Path, timeline: Timeline, limit: MemoryLimit | None, objective: Objective,
               time_limit: float, solved: "SolveReport | None" = None) -> None:
    """The page of a validated plan's timeline, written atomically (see quality_of for `solved`)."""
    check_output(path)
    quality = quality_of(timeline, limit, objective, time_limit, solved)
    write_atomic(path, page(timeline, limit, quality))


def report_command(
    schedule_file: Annotated[Path, typer.Argument(metavar="PLAN.json", help="Schedule (plan) JSON to report on.")],
    output: HtmlOutOpt,
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    mem_limit: MemLimitOpt = None,
    objective: ObjectiveOpt = "makespan",
    time_limit: ReportTimeOpt = DEFAULT_TIME_LIMIT,
) -> None:
    """Write a plan as one self-contained HTML page: timeline (zoom, hover, critical path), memory against
    the cap, split and levers, and its quality (bound, gap, the plan without the cap, the handcrafted
    schedules at the same limit).

    The limit is --mem-limit, else the one the plan records; the plan is validated at it first.
    """
    check_output(output)
    schedule = Schedule.load(schedule_file)
    prof = problem_for_schedule(schedule, schedule_file, profile, uniform, p, uniform_memory)
    assert prof is not None  # not optional: a missing --profile is an error there
    limit = parse_limit(mem_limit if mem_limit is not None else schedule.plan.mem_limit, prof,
                        placement=schedule.placement)
    report = check(schedule, prof, limit)
    report.raise_if_invalid(schedule.name)
    assert report.timeline is not None  # a valid schedule is simulated
    write_html(output, report.timeline, limit, Objective.parse(objective), time_limit)
    stdout_console().print(f"wrote {output}")
