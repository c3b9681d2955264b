"""`zbsearch plan`: every handcrafted schedule's bubble, memory and communication at one (p, m), the
microbatch count a bubble target needs, and a one-line recommendation.

Parses the command line, calls `zbsearch.plan.planner.plan` and renders; errors are ZbsearchError
subclasses that the CLI's group prints on one line, prefixed here with the option they came from.
The options shared with other commands come from options.py; the ones only the planner takes are
declared here, once.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..core.errors import PlanError
from ..core.profile import Profile
from ..plan.closed_forms import (CLOSED_FORM, FRACTION_CONVENTION, MEMORY_CONVENTION, RATIO_CONVENTION,
    check_objective)
from ..plan.microbatches import check_target
from ..plan.planner import Plan, PlanRow, microbatches_from_batch, plan
from .options import (PROBLEM_PANEL, ChunksOpt, JsonOpt, MemLimitOpt, MicrobatchesOpt, ObjectiveOpt,
    ProfileOpt, StagesOpt, UniformMemoryOpt, UniformOpt, load_cli_profile, parse_limit)
from ..schedules import REGISTRY

PLAN_PANEL = "Plan"

GlobalBatchOpt = Annotated[Optional[int], typer.Option(
    "--global-batch", metavar="B", rich_help_panel=PROBLEM_PANEL,
    help="Samples (sequences) per optimizer step over all replicas; with --dp and --micro-batch, "
         "m = B / (dp x micro-batch). Instead of -m. A token count divided by the sequence length.",
)]
DpOpt = Annotated[Optional[int], typer.Option(
    "--dp", metavar="D", rich_help_panel=PROBLEM_PANEL, help="Data-parallel replicas (with --global-batch).",
)]
MicroBatchOpt = Annotated[Optional[int], typer.Option(
    "--micro-batch", metavar="b", rich_help_panel=PROBLEM_PANEL,
    help="Samples per microbatch (with --global-batch).",
)]
TargetBubbleOpt = Annotated[float, typer.Option(
    "--target-bubble", metavar="FRACTION", rich_help_panel=PLAN_PANEL,
    help="Bubble fraction to reach, in (0, 1): the table gives the smallest m each schedule needs for it.",
)]


def _microbatches(m: int | None, global_batch: int | None, dp: int | None, micro_batch: int | None) -> tuple[int | None, str]:
    """(m or None for the default, where it came from)."""
    if global_batch is None:
        if dp is not None or micro_batch is not None:
            raise PlanError("--dp and --micro-batch go with --global-batch B (m = B / (dp x micro-batch)); "
                            "or give -m M")
        return m, "-m" if m is not None else "default"
    if m is not None:
        raise PlanError("give either -m M or --global-batch B --dp D --micro-batch b, not both")
    if dp is None or micro_batch is None:
        raise PlanError(f"--global-batch {global_batch} needs --dp D and --micro-batch b to give "
                        "m = global batch / (dp x micro-batch)")
    derived = microbatches_from_batch(global_batch, dp, micro_batch)
    return derived, f"--global-batch {global_batch} / (dp {dp} x micro-batch {micro_batch})"


def _check_micro_batch(prof: Profile, micro_batch: int | None) -> None:
    """A profile's times and memory are those of the microbatch it was made for: planning another size with
    them would recommend a plan that does not fit (issue 41). Whole-run planning costs each size as itself."""
    made = (prof.details.get("model") or {}).get("micro_batch")
    if micro_batch is not None and isinstance(made, int) and micro_batch != made:
        raise PlanError(f"--micro-batch {micro_batch}: profile {prof.label} was made for microbatches of {made} "
                        f"sequences, and its times and memory are theirs: give --micro-batch {made}, profile the model "
                        f"again with --micro-batch {micro_batch}, or plan every size with zbsearch configure")


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _target_cell(row: PlanRow) -> str:
    target = row.target
    if target.m is None:
        return "never"
    return f"~{target.m}" if target.source.endswith("(extrapolated)") else str(target.m)


# Where to go when the stage split, not the schedule, keeps the bubble above the target.
PARTITION_HINT = "zbsearch solve --partition auto"


def imbalance_lines(result: Plan) -> list[Text]:
    """One line per imbalance floor that puts the target out of reach: the figure, and that only a
    different split of the layers into stages removes it."""
    groups: dict[str, list[str]] = {}
    for row in result.imbalance_bound_rows:
        groups.setdefault(_pct(row.target.imbalance_floor or 0.0), []).append(row.schedule)
    lines = []
    for floor, names in groups.items():
        who = "any schedule" if len(names) == len(result.rows) else ", ".join(names)
        lines.append(Text.assemble(
            (f"never below {100 * result.target:g}%", "bold yellow"),
            f" ({who}): the floor is the imbalance between stages, {floor} (1 - mean rank work / the busiest "
            f"rank's), which no schedule or m removes; only a different layer split does: try {PARTITION_HINT}"))
    return lines


def render(result: Plan) -> list[object]:
    """The table, the legend, the skipped schedules and the recommendation, as rich renderables."""
    limit = f", --mem-limit {result.mem_limit}" if result.mem_limit else ""
    title = (f"plan: p={result.p}, m={result.m} ({result.m_source}), cost = {result.objective}{limit}; "
             f"{result.profile}")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                  collapse_padding=True)
    table.add_column("schedule", style="bold", no_wrap=True)
    table.add_column("bubble", justify="right")
    table.add_column("/ideal", justify="right")
    table.add_column("peak", justify="right")
    table.add_column("P2P", justify="right")
    table.add_column("copies", justify="right")
    table.add_column(f"m<{100 * result.target:g}%", justify="right")
    table.add_column("from")
    for row in result.rows:
        est = row.estimate
        name = ("* " if row.schedule == result.recommendation else "  ") + est.schedule
        memory = Text(f"{est.peak_memory:.4g}")
        if not row.fits:
            memory.append(" OVER", style="bold red")
        table.add_row(name, _pct(est.bubble_fraction), _pct(est.bubble_ratio), memory, f"{est.p2p_relative:.3g}x",
                      str(est.param_copies), _target_cell(row), "formula" if est.source == CLOSED_FORM else "sim")
    out: list[object] = [table]
    v = next((row.estimate.chunks_per_rank for row in result.rows if row.schedule == "interleaved-1f1b"), result.v)
    out.append(Text(
        f"bubble = {FRACTION_CONVENTION}, cost measured as {result.objective}. /ideal = {RATIO_CONVENTION}. "
        f"peak = {MEMORY_CONVENTION}. P2P = cross-rank sends per iteration relative to 1F1B. copies = model "
        f"replicas per rank. m<{100 * result.target:g}% = the smallest m with a bubble below the target "
        f"(~: extrapolated). interleaved-1f1b uses v={v} (--chunks). from: formula = closed form exact "
        "here, sim = the simulator.", style="dim"))
    why: dict[str, list[str]] = {}
    for row in result.rows:
        if row.estimate.source != CLOSED_FORM:
            note = row.estimate.note.removeprefix("closed form not exact: ") or "no closed form"
            why.setdefault(note, []).append(row.schedule)
    for note, names in why.items():
        out.append(Text(f"sim for {', '.join(names)}: {note}", style="dim"))
    for row in result.rows:
        if row.target.imbalance_floor is None and (row.target.m is None or row.target.source.endswith("(extrapolated)")):
            out.append(Text(f"{row.schedule} target: {row.target.note}", style="dim"))
    out += imbalance_lines(result)
    for skip in result.skipped:
        need = "" if skip.target is None or skip.target.m is None else f" (m={skip.target.m} would reach the target)"
        out.append(Text(f"left out: {skip.schedule} {skip.reason}{need}", style="dim"))
    if result.recommendation is None:
        out.append(Text.assemble(("recommend: none", "bold yellow"), f": {result.reason}"))
    else:
        out.append(Text.assemble(("recommend: ", "bold"), (result.recommendation, "bold green"), f": {result.reason}"))
    return out


def plan_command(
    profile: ProfileOpt = None,
    uniform: UniformOpt = None,
    p: StagesOpt = None,
    m: MicrobatchesOpt = None,
    global_batch: GlobalBatchOpt = None,
    dp: DpOpt = None,
    micro_batch: MicroBatchOpt = None,
    uniform_memory: UniformMemoryOpt = None,
    chunks: ChunksOpt = None,
    mem_limit: MemLimitOpt = None,
    target_bubble: TargetBubbleOpt = 0.05,
    objective: ObjectiveOpt = "makespan",
    json_out: JsonOpt = False,
) -> None:
    """Compare every handcrafted schedule at p ranks and m microbatches, before profiling or solving.

    For each schedule: the bubble fraction (bubble / (ideal + bubble), (p-1)/(m+p-1) for 1F1B) and
    Megatron's bubble/ideal, peak activation memory (marked OVER the --mem-limit), P2P volume relative
    to 1F1B, parameter copies, and the smallest m that brings the bubble below --target-bubble. Closed
    forms where they are exact for the profile, the simulator elsewhere; the table says which. Ends
    with one recommendation: never over the limit; the smallest bubble; ties to less memory, then less
    communication. m comes from -m, or from --global-batch / (--dp x --micro-batch).
    """
    check_target(target_bubble)
    check_objective(objective)
    m_value, m_source = _microbatches(m, global_batch, dp, micro_batch)
    if p is not None and p < 2:
        raise PlanError(f"pipelining needs at least 2 ranks, got -p {p}: use -p 2 or more (one rank has no bubble)")
    prof = load_cli_profile(profile, uniform, p, m_value, uniform_memory)
    _check_micro_batch(prof, micro_batch)
    if m_value is None:
        m_source = "the profile's microbatches" if profile is not None else "default 2p"
    limit = parse_limit(mem_limit, prof)
    result = plan(prof, prof.microbatches, limit=limit, target=target_bubble,
                  v=chunks if chunks is not None else REGISTRY["interleaved-1f1b"].default_chunks or 2,
                  objective=objective, m_source=m_source)
    if json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
        return
    console = Console(highlight=False, soft_wrap=True)
    for part in render(result):
        console.print(part)


def register(app: typer.Typer) -> None:
    """Add `zbsearch plan` to the app."""
    app.command("plan")(plan_command)
