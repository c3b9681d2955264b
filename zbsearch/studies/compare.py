"""Side-by-side comparisons: every handcrafted schedule, torch's built-in orders and zbsearch, on one
profile, at each memory limit, as rows of a table (Markdown and CSV) and as figures.

A comparison answers "which schedule, at what memory, for my setup?". For each microbatch count and
each memory limit it holds one row per schedule:

- every handcrafted schedule whose preconditions hold for (p, m) (the others are listed with the
  reason), simulated on the profile; a schedule over the limit stays in the table, marked, so the
  reader sees what the limit costs;
- torch.distributed.pipelining's InterleavedZeroBubble, ZBVZeroBubble and DualPipeV orders, when torch
  is installed (torch_import.torch_builtin), simulated on the same profile;
- zbsearch solved at that limit (solve.solve_placements), with its solve time, gap and status.

Every number in a row is what `zbsearch baseline NAME --json` or `zbsearch solve --json` reports for
the same inputs: rows are built from the typed `Summary` and `SolveReport` (rows.py). Bubble rate is
the one of the chosen objective (makespan: from time 0; span: each rank's own first to last pass). Peak
memory is per rank in multiples of that rank's stage M_B. Every schedule here has passed the validator
(structure, completeness, deadlock); "within limit" is the validator's memory check.

Writers: `write(comparison, prefix)` makes PREFIX.md, PREFIX.csv (tables.py) and, when matplotlib is
installed, figures (figures.py: a grid of Gantt charts on one time axis and a memory-bubble Pareto plot
per microbatch count). This module re-exports the names of rows.py, tables.py and figures.py, so
`from zbsearch.plan import compare as cmp` reaches them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..core.errors import DependencyError, InfeasibleError, PlanError, PreconditionError, ScheduleError
from ..core.fileio import write_atomic
from ..core.memory import parse_mem_limit
from ..core.objective import OBJECTIVES
from ..core.profile import Profile
from ..schedules import REGISTRY
from ..search.options import SearchOptions
from .figures import chart_title, figure_paths, gantt_charts, pareto_points, write_figures
from .rows import (SOURCES, TORCH_BUILTINS, Comparison, Row, Skipped, display_name, fixed_rows,
    handcrafted_schedule, solved_row, summary_row, torch_available, torch_schedule)
from .tables import (CSV_COLUMNS, csv_record, csv_rows, format_peaks, markdown_table, pct, records_to_csv,
    sorted_rows, to_csv, to_markdown)
from ..report.plot import require_matplotlib

__all__ = [
    "CSV_COLUMNS", "SOURCES", "TORCH_BUILTINS", "CompareInputError", "Comparison", "ProgressFn", "Row", "Skipped",
    "chart_title", "compare", "csv_record", "csv_rows", "display_name", "figure_paths", "fixed_rows",
    "format_peaks", "gantt_charts", "handcrafted_schedule", "markdown_table", "note_if_beaten", "pareto_points",
    "pct", "records_to_csv", "select_schedules", "solved_row", "sorted_rows", "summary_row", "to_csv",
    "to_markdown", "torch_available", "torch_schedule", "write", "write_figures",
]

# progress(done, total, what is running now)
ProgressFn = Callable[[int, int, str], None]


class CompareInputError(PlanError):
    """A compare() argument that cannot be used. `parameter` names it and `problem` says what is wrong
    and the fix; `subject` is the request field it is about, for the CLI to put its option in front."""

    def __init__(self, parameter: str, problem: str, subject: str):
        super().__init__(f"{parameter}{problem}", subject=subject)
        self.parameter = parameter
        self.problem = problem


def select_schedules(schedules: str | Sequence[str], with_torch: bool | None) -> tuple[list[str], list[str]]:
    """(handcrafted names, torch names) from `all`, `handcrafted`, `torch`, `none` or a list of names.

    `all` includes torch's built-ins only when torch is installed (and with_torch is not False); a
    torch schedule asked for by name, or `torch`, needs torch and says how to install it."""
    items = [s.strip() for s in (schedules.split(",") if isinstance(schedules, str) else schedules) if s.strip()]
    torch_by_key = {t.lower(): t for t in TORCH_BUILTINS}
    hand: list[str] = []
    torch: list[str] = []
    named_torch = False
    for item in items:
        key = item.lower()
        bare = key.removeprefix("torch:")
        if key in ("all", "handcrafted"):
            hand += list(REGISTRY)
            if key == "all" and with_torch is not False and torch_available():
                torch += list(TORCH_BUILTINS)
        elif key == "torch" or bare in torch_by_key:
            torch += list(TORCH_BUILTINS) if key == "torch" else [torch_by_key[bare]]
            named_torch = True
        elif key in REGISTRY:
            hand.append(key)
        elif key != "none":
            raise CompareInputError("schedules", (
                f": unknown schedule {item!r}: use all, handcrafted, torch, none, or names from "
                f"{', '.join(REGISTRY)}, {', '.join(TORCH_BUILTINS)}"), "schedules")
    if (named_torch or with_torch) and not torch_available():
        raise DependencyError("torch's built-in schedules need torch, which is not installed: "
                              "pip install 'zbsearch[torch]' (torch==2.13.0; the CPU wheel is enough)")
    return list(dict.fromkeys(hand)), list(dict.fromkeys(torch))


@dataclass(frozen=True)
class _Plan:
    """What one comparison runs at every microbatch count."""

    limits: tuple[str, ...]
    objective: str
    handcrafted: list[str]
    torch: list[str]
    chunks: int | None
    solve: bool
    placement: str
    options: SearchOptions

    def steps_per_count(self) -> int:
        return len(self.handcrafted) + len(self.torch) + (len(self.limits) if self.solve else 0)


class _Steps:
    """Reports each step of a comparison to the progress callback, before it runs."""

    def __init__(self, progress: ProgressFn | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, label: str) -> None:
        if self.progress:
            self.progress(self.done, self.total, label)
        self.done += 1

    def finish(self) -> None:
        if self.progress:
            self.progress(self.total, self.total, "done")


def compare(
    profile: Profile,
    *,
    microbatches: Iterable[int] | None = None,
    limits: Sequence[str] = ("1p", "2p"),
    schedules: str | Sequence[str] = "all",
    objective: str = "makespan",
    options: SearchOptions = SearchOptions(),
    placement: str = "linear",
    chunks: int | None = None,
    with_torch: bool | None = None,
    solve: bool = True,
    progress: ProgressFn | None = None,
) -> Comparison:
    """Compare schedules on `profile` at each memory limit.

    `microbatches`: counts to compare at (default: the profile's). `limits`: memory limits as users
    type them (`1p`, `2p`, `40GiB`, `none`); zbsearch is solved at each. `schedules`: `all` (every
    handcrafted schedule and, when torch is installed, torch's built-ins), `handcrafted`, `torch`,
    `none`, or a list of registry and torch names. `objective`: `makespan` or `span`, which bubble
    rate the rows show and what zbsearch minimizes. `options`: each zbsearch solve's (one per
    microbatch count and limit; its time limit is each solve's). `placement`: zbsearch's (linear, interleaved:V, v or auto).
    `chunks`: chunks per rank for interleaved-1f1b (default 2). `with_torch`: None includes torch's
    built-ins when torch is installed, False never, True requires them. `solve`: False leaves zbsearch
    out. `progress`: called with (done, total, label) before each step.

    Returns the rows in order of microbatch count, limit, then source (handcrafted, torch, zbsearch).
    Raises CompareInputError (an unknown objective or schedule name, no limits), MemoryLimitError (an
    unparsable limit) or DependencyError (torch asked for but missing), all before any work.
    """
    limits = _checked_limits(profile, limits, objective)
    ms = tuple(dict.fromkeys(microbatches)) if microbatches is not None else (profile.microbatches,)
    hand, torch = select_schedules(schedules, with_torch)
    plan = _Plan(limits, objective, hand, torch, chunks, solve, placement, options)
    steps = _Steps(progress, len(ms) * plan.steps_per_count())
    rows: list[Row] = []
    skipped: list[Skipped] = []
    for m in ms:
        rows += _rows_at(profile.with_microbatches(m), plan, steps, skipped)
    steps.finish()
    return Comparison(profile, objective, limits, ms, rows, skipped, options.time_limit, placement)


def _checked_limits(profile: Profile, limits: Sequence[str], objective: str) -> tuple[str, ...]:
    if objective not in OBJECTIVES:
        raise CompareInputError("objective", f" {objective!r}: use one of {', '.join(OBJECTIVES)}", "objective")
    limits = tuple(limits)
    if not limits:
        raise CompareInputError("limits", " is empty: give at least one memory limit, e.g. 1p,2p", "mem_limit")
    for text in limits:
        parse_mem_limit(text, profile)  # fail before any work on a bad limit
    return limits


def _rows_at(prof: Profile, plan: _Plan, steps: _Steps, skipped: list[Skipped]) -> list[Row]:
    """Every row at the profile's microbatch count, grouped by limit."""
    fixed = _fixed_rows(prof, plan, steps, skipped)
    solved = _solved_rows(prof, plan, steps, skipped) if plan.solve else []
    rows: list[Row] = []
    for text in plan.limits:
        here = [r for r in fixed if r.mem_limit == text]
        mine = [r for r in solved if r.mem_limit == text]
        for z in mine:
            note_if_beaten(z, here)
        rows += here + mine
    return rows


# What leaves a fixed schedule out of the tables (listed, with the reason) rather than stopping the
# comparison: a handcrafted schedule not defined for this p and m; a torch order zbsearch cannot
# import or that fails validation. Anything else wrong with a handcrafted schedule is a bug and stops.
_SKIPPED_WHEN = {"handcrafted": PreconditionError, "torch": ScheduleError}


def _fixed_rows(prof: Profile, plan: _Plan, steps: _Steps, skipped: list[Skipped]) -> list[Row]:
    """The rows of every handcrafted schedule, then of every torch order, at each limit."""
    m = prof.microbatches
    wanted = [(name, display_name(name, plan.chunks), "handcrafted",
               partial(handcrafted_schedule, name, prof, plan.chunks)) for name in plan.handcrafted]
    wanted += [(f"torch:{name}", f"torch:{name}", "torch", partial(torch_schedule, name, prof))
               for name in plan.torch]
    rows: list[Row] = []
    for label, shown, source, make in wanted:
        steps(f"m={m} {label}")
        try:
            rows += fixed_rows(make(), prof, plan.limits, plan.objective, name=shown, source=source)
        except _SKIPPED_WHEN[source] as exc:
            skipped.append(Skipped(m, shown, str(exc)))
    return rows


def _solved_rows(prof: Profile, plan: _Plan, steps: _Steps, skipped: list[Skipped]) -> list[Row]:
    m = prof.microbatches
    rows: list[Row] = []
    for text in plan.limits:
        steps(f"m={m} zbsearch at {text}")
        try:
            rows.append(solved_row(prof, text, plan.objective, placement=plan.placement, options=plan.options))
        except InfeasibleError as exc:
            skipped.append(Skipped(m, f"zbsearch at {text}", str(exc)))
    return rows


def note_if_beaten(solved: Row, fixed: Sequence[Row]) -> None:
    """Record on a zbsearch row the fixed schedule on its placement that fits the same limit at a lower
    cost, if any (`beaten_by`, and a plain note). The solver starts from the handcrafted schedules of
    its placement and returns the best it found, so this should not happen for them; a torch order or
    another chunk count is not among its starts, and a solve cut short by its time limit can miss one."""
    better = [r for r in fixed if r.within_limit and r.placement == solved.placement
              and r.cost < solved.cost * (1 - 1e-9)]
    if better:
        best = min(better, key=lambda r: r.cost)
        solved.beaten_by = best.schedule
        solved.note += f"; {best.schedule} on the same placement does better within this limit"


def write(comp: Comparison, prefix: str | Path, figures: Sequence[str] = ("png",)) -> list[Path]:
    """Write PREFIX.md, PREFIX.csv and the figures (each atomically); return the paths written.
    Creates PREFIX's folder. Figures need matplotlib (a DependencyError says how to install it)."""
    prefix = Path(prefix)
    for fmt in figures:
        if fmt not in ("png", "svg"):
            raise CompareInputError("figure format", f" {fmt!r}: use png, svg, or none", "figures")
    if figures:
        require_matplotlib()  # fail before writing anything when matplotlib is missing
    prefix.parent.mkdir(parents=True, exist_ok=True)
    md, cs = prefix.with_name(prefix.name + ".md"), prefix.with_name(prefix.name + ".csv")
    write_atomic(md, to_markdown(comp))
    write_atomic(cs, to_csv(comp))
    return [md, cs] + write_figures(comp, prefix, figures)
