"""`zbsearch configure --html RUN.html`: the whole-run plan as one self-contained HTML page
(report/configure_html.py): the ranked shapes, throughput against memory, the pruned, refused and failed
shapes, the certificate, and the chosen plan's timeline, memory, quality and split.

The path is checked when the flag is read (before the search: a folder that does not exist or a folder
given as the file is one line, not a lost search), and the page is written atomically, whole, only after
the search has ended and the chosen plan has validated again on its shape's profile at its limit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..core.fileio import write_atomic
from ..core.ir import Schedule
from ..core.memory import parse_mem_limit
from ..core.objective import Objective
from ..core.planned_profile import for_plan
from ..plan.wholerun.cluster import Cluster
from ..plan.wholerun.cost import PlanChoices, shape_costs
from ..plan.wholerun.outcome import Outcome
from ..plan.wholerun.shape_result import ShapeResult
from ..plan.wholerun.workload import Workload
from ..report.configure_data import RunFacts
from ..report.configure_html import ChosenPlan, run_page
from ..report.quality import quality_of
from ..sim.validate import check
from .options import OUTPUT_PANEL
from .report import DEFAULT_TIME_LIMIT, check_output


def _checked(path: Optional[Path]) -> Optional[Path]:
    if path is not None:
        check_output(path)
    return path


HtmlRunOpt = Annotated[Optional[Path], typer.Option(
    "--html", metavar="RUN.html", rich_help_panel=OUTPUT_PANEL, callback=_checked,
    help="Also write the whole run as one self-contained HTML page (ranked shapes, throughput against memory, "
         "pruned, refused and failed shapes, the certificate, the chosen plan's timeline), after the search.",
)]


def run_facts(workload: Workload, cluster: Cluster) -> RunFacts:
    model = workload.model
    name = workload.preset or model.model
    return RunFacts(f"{name}, {model.layers} layers, hidden {model.hidden}", workload.global_batch, workload.seq,
                    cluster.gpus, cluster.gpu)


def chosen_plan(outcome: Outcome[ShapeResult], workload: Workload, cluster: Cluster, choices: PlanChoices,
                time_limit: float = DEFAULT_TIME_LIMIT) -> ChosenPlan | None:
    """The chosen plan validated again on its shape's profile (as planned: its split and recompute) at the
    limit it records, with its quality figures (quality_of's two short searches); None without a pipeline
    or a plan."""
    chosen = outcome.chosen
    if chosen is None or chosen.plan is None or chosen.shape.p == 1:
        return None
    schedule = Schedule.from_dict(chosen.plan)
    costs = shape_costs(workload, cluster, chosen.shape, choices)
    profile = for_plan(costs.profile, schedule)
    limit = parse_mem_limit(schedule.plan.mem_limit, profile, schedule.placement)
    report = check(schedule, profile, limit)
    if not report.ok or report.timeline is None:  # a bug, not a user error: never draw a plan that fails
        print(f"internal error: the chosen plan failed validation: {report.problems[0]}", file=sys.stderr)
        raise SystemExit(3)
    quality = quality_of(report.timeline, limit, Objective.parse(costs.request.objective), time_limit)
    return ChosenPlan(report.timeline, limit, quality)


def write_run_html(path: Optional[Path], outcome: Outcome[ShapeResult], workload: Workload, cluster: Cluster,
                   choices: PlanChoices) -> None:
    """The page of a finished search at `path` (nothing where None), written atomically once whole."""
    if path is None:
        return
    check_output(path)
    page = run_page(run_facts(workload, cluster), outcome.table(), chosen_plan(outcome, workload, cluster, choices))
    write_atomic(path, page)
