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
the same inputs: rows are built from report.summarize and SolveResult.report. Bubble rate is the one
of the chosen objective (makespan: from time 0; span: each rank's own first to last pass). Peak memory
is per rank in multiples of that rank's stage M_B. Every schedule here has passed the validator
(structure, completeness, deadlock); "within limit" is the validator's memory check.

Writers: `write(comparison, prefix)` makes PREFIX.md, PREFIX.csv and, when matplotlib is installed,
figures (a grid of Gantt charts on one time axis and a memory-bubble Pareto plot per microbatch count).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..core.errors import InfeasibleError, PreconditionError, ScheduleError, ZbsearchError
from ..core.fileio import write_atomic
from ..core.ir import Schedule
from ..core.memory import parse_mem_limit
from ..core.problem import OBJECTIVES, make_problems
from ..core.profile import Profile
from ..report.render import fmt_number
from ..sim.summary import Summary, summarize
from ..schedules import REGISTRY, generate
from ..sim.simulate import Timeline
from ..sim.validate import check, memory_problems

TORCH_BUILTINS = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
SOURCES = ("handcrafted", "torch", "zbsearch")

# progress(done, total, what is running now)
ProgressFn = Callable[[int, int, str], None]


@dataclass
class Row:
    """One schedule at one memory limit. Times are in the profile's time unit; memory in multiples of
    each rank's stage M_B."""

    schedule: str
    source: str  # handcrafted | torch | zbsearch
    microbatches: int
    mem_limit: str
    objective: str
    bubble_rate: float
    bubble_rate_makespan: float
    bubble_rate_span: float
    makespan: float
    span: float
    peak_memory_per_rank: list[float]
    within_limit: bool
    placement: str
    solve_seconds: float | None = None
    gap: float | None = None
    status: str | None = None
    bubble_rate_lower_bound: float | None = None
    note: str = ""
    timeline: Timeline | None = field(default=None, repr=False, compare=False)

    @property
    def peak_memory(self) -> float:
        return max(self.peak_memory_per_rank)

    def to_dict(self) -> dict[str, Any]:
        """The CSV's columns, in order (per-rank peaks joined by spaces)."""
        return {
            "m": self.microbatches, "mem_limit": self.mem_limit, "schedule": self.schedule, "source": self.source,
            "placement": self.placement, "objective": self.objective, "bubble_rate": self.bubble_rate,
            "bubble_rate_makespan": self.bubble_rate_makespan, "bubble_rate_span": self.bubble_rate_span,
            "makespan": self.makespan, "span": self.span, "peak_memory": self.peak_memory,
            "peak_memory_per_rank": " ".join(f"{x:.6g}" for x in self.peak_memory_per_rank),
            "within_limit": self.within_limit, "solve_seconds": self.solve_seconds, "gap": self.gap,
            "status": self.status, "bubble_rate_lower_bound": self.bubble_rate_lower_bound, "note": self.note,
        }


@dataclass
class Comparison:
    """All rows of one comparison plus what produced them."""

    profile: Profile
    objective: str
    limits: tuple[str, ...]
    microbatches: tuple[int, ...]
    rows: list[Row]
    skipped: list[tuple[int, str, str]]  # (m, schedule, why it is not in the table)
    time_limit: float
    placement: str = "linear"  # zbsearch's, as given (linear, interleaved:V, v, auto)
    command: str | None = None

    def rows_for(self, m: int, limit: str | None = None) -> list[Row]:
        return [r for r in self.rows if r.microbatches == m and (limit is None or r.mem_limit == limit)]


# -- building rows ------------------------------------------------------------------------------

def _row(summary: Summary, timeline: Timeline, *, name: str, source: str, limit: str, objective: str,
         within: bool, note: str = "", extra: dict[str, Any] | None = None) -> Row:
    extra = extra or {}
    return Row(
        schedule=name, source=source, microbatches=summary.microbatches, mem_limit=limit, objective=objective,
        bubble_rate=summary.bubble_rate(objective), bubble_rate_makespan=summary.bubble_rate_makespan,
        bubble_rate_span=summary.bubble_rate_span, makespan=summary.makespan, span=summary.span,
        peak_memory_per_rank=list(summary.peak_memory_per_rank), within_limit=within,
        placement=summary.placement, note=note, timeline=timeline, **extra,
    )


def fixed_rows(schedule: Schedule, profile: Profile, limits: Sequence[str], objective: str, *, name: str,
               source: str) -> list[Row]:
    """One row per limit for a given schedule, simulated once on `profile` and checked against each
    limit. Raises ScheduleError when the schedule is malformed or deadlocks."""
    report = check(schedule, profile)
    report.raise_if_invalid(name)
    assert report.timeline is not None
    rows = []
    for text in limits:
        limit = parse_mem_limit(text, profile)
        over = memory_problems(report.timeline, limit)
        summary = summarize(report.timeline, limit, valid=not over)
        rows.append(_row(summary, report.timeline, name=name, source=source, limit=text, objective=objective,
                         within=not over))
    return rows


def handcrafted_schedule(name: str, profile: Profile, chunks: int | None = None) -> Schedule:
    """The registry's schedule for the profile's p and m (`chunks` applies to interleaved-1f1b only).
    Raises PreconditionError when it is not defined for them."""
    gen = REGISTRY[name]
    return generate(name, profile.num_stages, profile.microbatches, chunks if gen.takes_chunks else None)


def display_name(name: str, chunks: int | None = None) -> str:
    gen = REGISTRY.get(name)
    if gen is not None and gen.takes_chunks:
        return f"{name} (v={chunks if chunks is not None else gen.default_chunks})"
    return name


def torch_available() -> bool:
    """True when torch and zbsearch's torch importer are both there (nothing is imported)."""
    return (importlib.util.find_spec("torch") is not None
            and importlib.util.find_spec(f"zbsearch.interop.torch_import") is not None)


def torch_schedule(name: str, profile: Profile) -> Schedule:
    """torch's built-in order `name` for the profile's p and m, as a zbsearch Schedule."""
    from ..interop.torch_import import torch_builtin

    return torch_builtin(name, profile.num_stages, profile.microbatches)


def solved_row(profile: Profile, limit: str, objective: str, *, placement: str = "linear",
               time_limit: float = 30.0, workers: int = 2, seed: int = 0) -> Row:
    """zbsearch's best schedule at `limit`: exactly what `zbsearch solve --json` reports for the same
    inputs. Raises InfeasibleError when no schedule fits the limit."""
    from ..search import solve as search

    problems = make_problems(profile, limit, objective, placement, search.AUTO_PLACEMENTS)
    result = search.solve_placements(problems, time_limit=time_limit, workers=workers, seed=seed)
    rep = result.report()
    start = rep.start_heuristic
    note = f"improved on {start}" if result.schedule.name == "zbsearch" else f"same as {start}"
    return _row(rep.summary, result.timeline, name="zbsearch", source="zbsearch", limit=limit, objective=objective,
                within=True, note=note, extra={
                    "solve_seconds": rep.solve_seconds, "gap": rep.gap, "status": rep.status,
                    "bubble_rate_lower_bound": rep.bubble_rate_lower_bound})


def _select(schedules: str | Sequence[str], with_torch: bool | None) -> tuple[list[str], list[str]]:
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
        if key == "all":
            hand += list(REGISTRY)
            if with_torch is not False and torch_available():
                torch += list(TORCH_BUILTINS)
        elif key == "handcrafted":
            hand += list(REGISTRY)
        elif key == "none":
            continue
        elif key == "torch" or bare in torch_by_key:
            torch += list(TORCH_BUILTINS) if key == "torch" else [torch_by_key[bare]]
            named_torch = True
        elif key in REGISTRY:
            hand.append(key)
        else:
            raise ZbsearchError(
                f"--schedules: unknown schedule {item!r}: use all, handcrafted, torch, none, or names from "
                f"{', '.join(REGISTRY)}, {', '.join(TORCH_BUILTINS)}")
    if (named_torch or with_torch) and not torch_available():
        raise ZbsearchError("torch's built-in schedules need torch, which is not installed: "
                            "pip install 'zbsearch[torch]' (torch==2.13.0; the CPU wheel is enough)")
    return list(dict.fromkeys(hand)), list(dict.fromkeys(torch))


def compare(
    profile: Profile,
    *,
    microbatches: Iterable[int] | None = None,
    limits: Sequence[str] = ("1p", "2p"),
    schedules: str | Sequence[str] = "all",
    objective: str = "makespan",
    time_limit: float = 30.0,
    placement: str = "linear",
    chunks: int | None = None,
    with_torch: bool | None = None,
    solve: bool = True,
    workers: int = 2,
    seed: int = 0,
    progress: ProgressFn | None = None,
) -> Comparison:
    """Compare schedules on `profile` at each memory limit.

    Parameters
    ----------
    profile
        The costs; its `microbatches` is used unless `microbatches` lists other counts.
    microbatches
        Microbatch counts to compare at (default: the profile's).
    limits
        Memory limits as users type them (`1p`, `2p`, `40GiB`, `none`); zbsearch is solved at each.
    schedules
        `all` (every handcrafted schedule and, when torch is installed, torch's built-ins),
        `handcrafted`, `torch`, `none`, or a list of names (registry names, torch names).
    objective
        `makespan` or `span`: which bubble rate the rows show, and what zbsearch minimizes.
    time_limit
        Seconds for each zbsearch solve (one per microbatch count and limit).
    placement
        zbsearch's placement: linear, interleaved:V, v or auto (as `zbsearch solve --placement`).
    chunks
        Chunks per rank for interleaved-1f1b (default 2).
    with_torch
        None: include torch's built-ins when torch is installed; False: never; True: required.
    solve
        False leaves zbsearch out (only the fixed schedules).
    progress
        Called with (done, total, label) before each step.

    Returns
    -------
    Comparison
        Rows in order of microbatch count, limit, then source (handcrafted, torch, zbsearch).

    Raises
    ------
    ZbsearchError
        An unknown objective or schedule name, an unparsable limit, or torch asked for but missing.
    """
    if objective not in OBJECTIVES:
        raise ZbsearchError(f"--objective {objective!r}: use one of {', '.join(OBJECTIVES)}")
    limits = tuple(limits)
    if not limits:
        raise ZbsearchError("--mem-limits is empty: give at least one limit, e.g. 1p,2p")
    for text in limits:
        parse_mem_limit(text, profile)  # fail before any work on a bad limit
    ms = tuple(dict.fromkeys(microbatches)) if microbatches is not None else (profile.microbatches,)
    hand, torch = _select(schedules, with_torch)
    total = len(ms) * (len(hand) + len(torch) + (len(limits) if solve else 0))
    done = 0

    def step(label: str) -> None:
        nonlocal done
        if progress:
            progress(done, total, label)
        done += 1

    rows: list[Row] = []
    skipped: list[tuple[int, str, str]] = []
    for m in ms:
        prof = profile.with_microbatches(m)
        fixed: list[Row] = []
        for name in hand:
            step(f"m={m} {name}")
            try:
                sched = handcrafted_schedule(name, prof, chunks)
            except PreconditionError as exc:
                skipped.append((m, display_name(name, chunks), str(exc)))
                continue
            fixed += fixed_rows(sched, prof, limits, objective, name=display_name(name, chunks), source="handcrafted")
        for name in torch:
            step(f"m={m} torch:{name}")
            try:
                sched = torch_schedule(name, prof)
                fixed += fixed_rows(sched, prof, limits, objective, name=f"torch:{name}", source="torch")
            except ScheduleError as exc:
                skipped.append((m, f"torch:{name}", str(exc)))
        solved: list[Row] = []
        if solve:
            for text in limits:
                step(f"m={m} zbsearch at {text}")
                try:
                    solved.append(solved_row(prof, text, objective, placement=placement, time_limit=time_limit,
                                             workers=workers, seed=seed))
                except InfeasibleError as exc:
                    skipped.append((m, f"zbsearch at {text}", str(exc)))
        for text in limits:
            here = [r for r in fixed if r.mem_limit == text]
            for z in (r for r in solved if r.mem_limit == text):
                _flag_if_beaten(z, here)
            rows += here + [r for r in solved if r.mem_limit == text]
    if progress:
        progress(total, total, "done")
    return Comparison(profile, objective, limits, ms, rows, skipped, time_limit, placement)


def _flag_if_beaten(solved: Row, fixed: Sequence[Row]) -> None:
    """Note on a zbsearch row when a fixed schedule on the same placement fits the same limit and does
    better: zbsearch never should (its search starts from those schedules), so this is worth a report."""
    def cost(r: Row) -> float:
        return r.makespan if r.objective == "makespan" else r.span

    better = [r for r in fixed if r.within_limit and r.placement == solved.placement
              and cost(r) < cost(solved) * (1 - 1e-9)]
    if better:
        best = min(better, key=cost)
        solved.note += f"; WORSE than {best.schedule} on the same placement (please report)"


# -- tables ---------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def format_peaks(peaks: Sequence[float], max_listed: int = 16) -> str:
    """'4 3.5 3 2.5' for up to 16 ranks; beyond, the largest and the smallest with their ranks."""
    if len(peaks) <= max_listed:
        return " ".join(f"{x:.3g}" for x in peaks)
    hi = max(range(len(peaks)), key=lambda r: peaks[r])
    lo = min(range(len(peaks)), key=lambda r: peaks[r])
    return f"max {peaks[hi]:.3g} (rank {hi}), min {peaks[lo]:.3g} (rank {lo})"


def sorted_rows(rows: Sequence[Row]) -> list[Row]:
    """Within-limit rows by bubble rate (then peak memory), then the rows over the limit."""
    return sorted(rows, key=lambda r: (not r.within_limit, round(r.bubble_rate, 12), r.peak_memory))


def markdown_table(rows: Sequence[Row], time_unit: str) -> list[str]:
    out = [f"| schedule | memory limit | bubble rate | makespan ({time_unit}) | peak memory per rank (x M_B) "
           "| solve time | gap |",
           "|---|---|---:|---:|---|---:|---:|"]
    for r in sorted_rows(rows):
        if r.source == "zbsearch":
            name = f"**zbsearch** ({r.placement} placement; {r.note})"
        else:
            name = r.schedule + (" (torch built-in)" if r.source == "torch" else "")
        limit = r.mem_limit if r.within_limit else f"{r.mem_limit}: **over** (peak {r.peak_memory:.3g})"
        solve_s = "-" if r.solve_seconds is None else f"{r.solve_seconds:.1f} s"
        gap = "-" if r.gap is None else f"{_pct(r.gap)} ({r.status})"
        out.append(f"| {name} | {limit} | {_pct(r.bubble_rate)} | {fmt_number(r.makespan)} "
                   f"| {format_peaks(r.peak_memory_per_rank)} | {solve_s} | {gap} |")
    return out


def to_markdown(comp: Comparison) -> str:
    """The comparison as a Markdown document: one table per microbatch count and limit."""
    prof = comp.profile
    lines = [f"# Schedule comparison: {prof.name}", ""]
    if comp.command:
        lines += [f"Regenerate: `{comp.command}`", ""]
    src = prof.source
    where = src.get("citation") or src.get("method") or src.get("device") or ""
    lines += [
        f"p = {prof.num_stages} ranks; m = {', '.join(map(str, comp.microbatches))}; times in {prof.time_unit}; "
        f"profile source: {src.get('kind')}{': ' + where if where else ''}.",
        "",
        f"Bubble rate = 1 - sum(work) / (p x {comp.objective}) ({_objective_words(comp.objective)}). Peak memory: "
        "activations on each rank, in multiples of that rank's stage M_B (a limit of Np allows N x p of them). "
        f"zbsearch: solved at each limit with a {comp.time_limit:g} s time limit; gap = (found - proven lower "
        "bound) / found, 'optimal' when the bound is met (no schedule on that placement does better at that "
        "limit); the note says which heuristic it started from. Handcrafted and torch rows over the limit are kept "
        "and marked **over**. Each table: rows within the limit by bubble rate, then the rows over it.",
        "",
    ]
    for m in comp.microbatches:
        for limit in comp.limits:
            rows = comp.rows_for(m, limit)
            if not rows:
                continue
            lines += [f"## m = {m}, memory limit {limit}", ""] + markdown_table(rows, prof.time_unit) + [""]
    if comp.skipped:
        lines += ["## Not in the tables", ""]
        lines += [f"- m = {m}, {name}: {why}" for m, name, why in comp.skipped] + [""]
    return "\n".join(lines)


def _objective_words(objective: str) -> str:
    return ("makespan: time 0 to the last pass, the cost when the optimizer step synchronizes ranks"
            if objective == "makespan" else
            "span: each rank's own first to last pass, the cost without a synchronizing optimizer step")


CSV_COLUMNS = ("profile", "p", "m", "mem_limit", "schedule", "source", "placement", "objective", "bubble_rate",
               "bubble_rate_makespan", "bubble_rate_span", "makespan", "span", "time_unit", "peak_memory",
               "peak_memory_per_rank", "within_limit", "solve_seconds", "gap", "status", "bubble_rate_lower_bound",
               "note")


def csv_rows(comp: Comparison) -> list[dict[str, Any]]:
    """The rows as CSV records, in the Markdown tables' order."""
    out = []
    for m in comp.microbatches:
        for limit in comp.limits:
            for r in sorted_rows(comp.rows_for(m, limit)):
                out.append({"profile": comp.profile.name, "p": comp.profile.num_stages,
                            "time_unit": comp.profile.time_unit, **r.to_dict()})
    return out


def to_csv(comp: Comparison, records: Sequence[dict[str, Any]] | None = None,
           columns: Sequence[str] = CSV_COLUMNS) -> str:
    """CSV text with a header row; floats at full precision, None as an empty cell."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for rec in (records if records is not None else csv_rows(comp)):
        writer.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in rec.items()})
    return buf.getvalue()


# -- figures --------------------------------------------------------------------------------------

def chart_title(row: Row) -> str:
    """'zb-h1: bubble 15.85% (makespan), peak 8 x M_B' plus the limit for solved rows."""
    what = f"zbsearch at {row.mem_limit}" if row.source == "zbsearch" else row.schedule
    over = "" if row.within_limit else f", over {row.mem_limit}"
    extra = f", {row.status}, {row.note}" if row.source == "zbsearch" else ""
    return (f"{what}: bubble {_pct(row.bubble_rate)} ({row.objective}), {row.objective} "
            f"{fmt_number(row.makespan if row.objective == 'makespan' else row.span)}, "
            f"peak {row.peak_memory:.3g} x M_B{over}{extra}")


def gantt_charts(comp: Comparison, m: int) -> list[tuple[str, Timeline]]:
    """(title, timeline) of every distinct schedule at m: each fixed schedule once, zbsearch per limit."""
    charts: list[tuple[str, Timeline]] = []
    seen: set[str] = set()
    for r in comp.rows_for(m):
        if r.timeline is None or (r.source != "zbsearch" and r.schedule in seen):
            continue
        seen.add(r.schedule)
        row = r if r.source == "zbsearch" else _best_limit_row(comp, m, r.schedule)
        charts.append((chart_title(row), r.timeline))
    return charts


def _best_limit_row(comp: Comparison, m: int, name: str) -> Row:
    """A fixed schedule's row at the smallest limit it fits (else the last), for its chart title."""
    rows = [r for r in comp.rows_for(m) if r.schedule == name]
    return next((r for r in rows if r.within_limit), rows[-1])


def pareto_points(rows: Sequence[Row], series: str = "zbsearch") -> list[Any]:
    """Points for plot.pareto_figure: each fixed schedule once, each solved row with its limit, in
    the frontier `series`."""
    from ..report.plot import ParetoPoint

    points, seen = [], set()
    for r in rows:
        if r.source == "zbsearch":
            tl = r.timeline
            limit = parse_mem_limit(r.mem_limit, tl.profile).in_stage_units(tl.profile) if tl is not None else None
            lim = max(limit) if limit is not None and all(math.isfinite(x) for x in limit) else None
            points.append(ParetoPoint(f"zbsearch at {r.mem_limit}", r.peak_memory, r.bubble_rate, "zbsearch", lim,
                                      r.bubble_rate_lower_bound, series))
        elif r.schedule not in seen:
            seen.add(r.schedule)
            points.append(ParetoPoint(r.schedule, r.peak_memory, r.bubble_rate, r.source))
    return points


def figure_paths(prefix: str | Path, comp: Comparison, fmt: str) -> dict[tuple[str, int], Path]:
    """Where write() puts each figure: PREFIX_gantt.FMT and PREFIX_pareto.FMT, with _mM before the
    kind when several microbatch counts are compared."""
    prefix = Path(prefix)
    out = {}
    for m in comp.microbatches:
        tag = f"_m{m}" if len(comp.microbatches) > 1 else ""
        out[("gantt", m)] = prefix.with_name(f"{prefix.name}{tag}_gantt.{fmt}")
        out[("pareto", m)] = prefix.with_name(f"{prefix.name}{tag}_pareto.{fmt}")
    return out


def write_figures(comp: Comparison, prefix: str | Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """The Gantt grid and the Pareto plot of each microbatch count, in each format."""
    from ..report import plot

    written: list[Path] = []
    prof = comp.profile
    setup = prof.name if f"p={prof.num_stages}" in prof.name else f"{prof.name}, p={prof.num_stages}"
    series = f"zbsearch ({comp.placement} placement)"
    footer = f"regenerate: {comp.command}" if comp.command else None
    for fmt in formats:
        paths = figure_paths(prefix, comp, fmt)
        for m in comp.microbatches:
            charts = gantt_charts(comp, m)
            if charts:
                title = f"{setup}, m={m}: every compared schedule on one time axis"
                written.append(plot.plot_gantt_grid(charts, paths[("gantt", m)], suptitle=title, footer=footer))
            points = pareto_points(comp.rows_for(m), series)
            if points:
                title = f"{setup}, m={m}: bubble rate ({comp.objective}) against peak activation memory"
                written.append(plot.plot_pareto(points, paths[("pareto", m)], title=title, objective=comp.objective,
                                                p=prof.num_stages, footer=footer))
    return written


def write(comp: Comparison, prefix: str | Path, figures: Sequence[str] = ("png",)) -> list[Path]:
    """Write PREFIX.md, PREFIX.csv and the figures (each atomically); return the paths written.
    Creates PREFIX's folder. Figures need matplotlib (a ZbsearchError says how to install it)."""
    prefix = Path(prefix)
    for fmt in figures:
        if fmt not in ("png", "svg"):
            raise ZbsearchError(f"figure format {fmt!r}: use png, svg, or none")
    if figures:
        from ..report.plot import _matplotlib

        _matplotlib()  # fail before writing anything when matplotlib is missing
    prefix.parent.mkdir(parents=True, exist_ok=True)
    md, cs = prefix.with_name(prefix.name + ".md"), prefix.with_name(prefix.name + ".csv")
    write_atomic(md, to_markdown(comp))
    write_atomic(cs, to_csv(comp))
    return [md, cs] + write_figures(comp, prefix, figures)
