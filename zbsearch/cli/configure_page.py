"""`zbsearch configure --html RUN.html`: the whole-run plan as one self-contained HTML page
(report/configure_html.py): the ranked shapes, throughput against memory, the pruned, refused and failed
shapes, the certificate, and the chosen plan's timeline, memory, quality and split.

The path is checked when the flag is read (before the search: a folder that does not exist or a folder
given as the file is one line, not a lost search), and the page is written atomically, whole, only after
the search has ended and the chosen plan has validated again on its shape's profile at its limit (once for
every file the run writes: plan/wholerun/chosen.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..core.fileio import write_atomic
from ..plan.wholerun.chosen import ChosenPlan
from ..plan.wholerun.cluster import Cluster
from ..plan.wholerun.outcome import Outcome
from ..plan.wholerun.shape_result import ShapeResult
from ..plan.wholerun.workload import Workload
from ..report.configure_data import RunFacts
from ..report.configure_html import ChosenPlan as PagePlan, run_page
from ..report.quality import quality_of
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


def page_plan(plan: ChosenPlan | None, time_limit: float = DEFAULT_TIME_LIMIT) -> PagePlan | None:
    """The page's plan sections: the chosen plan's timeline and limit as validated when it was rebuilt
    (chosen.chosen_plan) with its quality figures (quality_of's two short searches, for the page alone);
    None without a pipeline or a plan."""
    if plan is None or plan.timeline is None:
        return None
    return PagePlan(plan.timeline, plan.limit, quality_of(plan.timeline, plan.limit, plan.objective, time_limit))


def write_run_html(path: Optional[Path], outcome: Outcome[ShapeResult], workload: Workload, cluster: Cluster,
                   plan: ChosenPlan | None) -> None:
    """The page of a finished search at `path` (nothing where None), written atomically once whole;
    `plan`: the chosen plan, rebuilt and validated (None where no shape gave one)."""
    if path is None:
        return
    check_output(path)
    page = run_page(run_facts(workload, cluster), outcome.table(), page_plan(plan))
    write_atomic(path, page)
