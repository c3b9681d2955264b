"""Terminal views of a schedule: a per-rank table and a Gantt chart, as rich renderables or plain text.

Pure functions: they read a `Timeline` (simulate.py) or a `Summary` (sim/summary.py) and return
strings or rich objects; printing is the caller's business. The chart scales time so that the
makespan fills the given width; each pass shows its kind letter (the Zero Bubble paper's: F forward,
B backward for inputs, W backward for weights, BW the fused full backward) followed by its microbatch
when that fits in the cells the pass covers, its kind alone when only that fits, else colour only; a
label is never cut. A pass too short for one cell may be hidden by its neighbour. On a rank that holds
two or more chunks, passes of its second (fourth, ...) chunk are written in lower case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..core.ir import Action, Kind
from ..core.objective import Status
from ..sim.simulate import Timeline

if TYPE_CHECKING:
    from ..search.solve.report import Progress, SolveReport
    from ..sim.summary import Summary

IDLE = "."
LABEL_WIDTH = 4  # "r12 "
MIN_CELLS = 10

# Style per kind: (even local chunk, odd local chunk). Named ANSI colours, so kinds stay apart on
# 8- and 16-colour terminals too.
KIND_STYLES: dict[Kind, tuple[str, str]] = {
    Kind.F: ("white on blue", "white on bright_blue"),
    Kind.B: ("black on green", "black on bright_green"),
    Kind.W: ("black on yellow", "black on bright_yellow"),
    Kind.FULL_B: ("black on cyan", "black on bright_cyan"),
    Kind.OVERLAP: ("white on magenta", "white on bright_magenta"),
}
KIND_NAMES: dict[Kind, str] = {
    Kind.F: "F forward",
    Kind.B: "B backward for inputs (torch I)",
    Kind.W: "W backward for weights",
    Kind.FULL_B: "BW full backward (torch B)",
    Kind.OVERLAP: "F&B overlapped forward/backward pair",
}


def kind_style(kind: Kind, odd_chunk: bool = False) -> str:
    """The rich style of a cell of this kind."""
    return KIND_STYLES[kind][1 if odd_chunk else 0]


def _local_index(timeline: Timeline, rank: int, chunk: int) -> int:
    chunks = timeline.schedule.placement.chunks_on(rank)
    return chunks.index(chunk) if chunk in chunks else 0


def pass_label(action: Action, odd_chunk: bool = False) -> str:
    """Kind letter(s) and microbatch: 'F3', 'B3', 'W3', 'BW3', or 'F3&B1' for an overlapped pair."""
    if action.kind is Kind.OVERLAP:
        text = "&".join(pass_label(a) for a in action.pair)
    else:
        text = f"{action.kind.label}{action.microbatch}"
    return text.lower() if odd_chunk else text


def kind_label(action: Action, odd_chunk: bool = False) -> str:
    """The label without microbatch numbers: 'F', 'BW', 'F&B'."""
    if action.kind is Kind.OVERLAP:
        text = "&".join(a.kind.label for a in action.pair)
    else:
        text = action.kind.label
    return text.lower() if odd_chunk else text


def fitted_label(action: Action, odd_chunk: bool, width: int, next_text: str = "") -> str:
    """What a pass drawn `width` cells wide shows: its whole label when that fits, else its kind alone,
    else nothing (colour only). A cut label would lie ('F1' for F12). `next_text` is what the chart
    shows right after the pass; a bare B running into a W there would read as BW, so then it is left out.
    """
    full = pass_label(action, odd_chunk)
    if len(full) <= width:
        return full
    short = kind_label(action, odd_chunk)
    if len(short) < width or (len(short) == width and (short[-1:] + next_text[:1]).upper() != "BW"):
        return short
    return ""


def _odd(timeline: Timeline, rank: int, action: Action) -> bool:
    chunk = action.pair[0].chunk if action.kind is Kind.OVERLAP else action.chunk
    return _local_index(timeline, rank, chunk) % 2 == 1


def gantt_cells(timeline: Timeline, cells: int) -> list[list[tuple[str, str]]]:
    """Per rank, `cells` (character, style) pairs: time 0..makespan scaled to the cells.

    A pass covers the cells from round(start * scale) to round(end * scale), at least one; a cell
    already taken by an earlier pass of the rank keeps it. A pass that takes no time covers none. Each
    pass shows `fitted_label` in its cells. Idle cells are ('.', 'dim').
    """
    cells = max(1, cells)
    total = timeline.makespan
    scale = cells / total if total > 0 else 0.0
    rows: list[list[tuple[str, str]]] = []
    for r, slots in enumerate(timeline.slots):
        row: list[tuple[str, str] | None] = [None] * cells
        drawn: list[tuple[list[int], Action, bool]] = []
        for slot in slots:
            if slot.end <= slot.start:  # nothing to draw; drawn, a zero-length I would abut its W as "BW"
                continue
            c0 = min(cells - 1, int(round(slot.start * scale)))
            c1 = min(cells, max(c0 + 1, int(round(slot.end * scale))))
            odd = _odd(timeline, r, slot.action)
            free = [c for c in range(c0, c1) if row[c] is None]
            for c in free:
                row[c] = (" ", kind_style(slot.action.kind, odd))
            if free:
                drawn.append((free, slot.action, odd))
        # Labels last to first, once every pass has its cells, so each knows what the chart shows after it.
        for free, action, odd in reversed(drawn):
            after = free[-1] + 1
            next_cell = row[after] if after < cells else None
            label = fitted_label(action, odd, len(free), next_cell[0] if next_cell is not None else "")
            for c, ch in zip(free, label):
                row[c] = (ch, row[c][1])  # type: ignore[index]  # every cell in `free` was filled above
        rows.append([cell if cell is not None else (IDLE, "dim") for cell in row])
    return rows


def _styled(cells: list[tuple[str, str]]) -> Text:
    """Join cells into one Text, one span per run of equal style."""
    text = Text()
    run, run_style = "", None
    for ch, style in cells:
        if style != run_style and run:
            text.append(run, style=run_style)
            run = ""
        run, run_style = run + ch, style
    if run:
        text.append(run, style=run_style)
    return text


def gantt(timeline: Timeline, width: int = 80) -> Group:
    """A Gantt chart `width` characters wide: a time ruler, one row per rank, a legend."""
    p = timeline.num_ranks
    label_width = max(LABEL_WIDTH, len(f"r{p - 1} "))
    cells = max(MIN_CELLS, width - label_width)
    rows = gantt_cells(timeline, cells)
    unit = timeline.profile.time_unit
    end = f"{fmt_number(timeline.makespan)} {unit}"
    ruler = Text()
    ruler.append(" " * label_width + "0" + end.rjust(cells - 1), style="bold")
    lines: list[Text] = [ruler]
    for r, row in enumerate(rows):
        line = Text()
        line.append(f"r{r}".ljust(label_width), style="bold")
        line.append_text(_styled(row))
        lines.append(line)
    kinds = {slot.action.kind for slot in timeline.iter_slots()}
    legend = Text()
    for kind in KIND_NAMES:
        if kind in kinds:
            letter, _, name = KIND_NAMES[kind].partition(" ")
            legend.append(f" {letter} ", style=kind_style(kind))
            legend.append(f" {name}  ")
    legend.append(f"{IDLE} idle  ", style="dim")
    if timeline.schedule.placement.chunks_per_rank > 1:
        legend.append("lower case: the rank's 2nd chunk  ")
    per_cell = timeline.makespan / cells if cells else 0.0
    legend.append(f"1 column = {fmt_number(per_cell)} {unit}")
    lines.append(legend)
    return Group(*lines)


def gantt_text(timeline: Timeline, width: int = 80) -> str:
    """The chart as plain text (no colour), one line per row."""
    # type: ignore: gantt's Group holds Text lines only (rich types its renderables as any renderable)
    return "\n".join(line.plain for line in gantt(timeline, width).renderables)  # type: ignore[union-attr]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def fmt_number(x: float) -> str:
    """Readable figures: thousands separators from 1000 up (1,310,400), else 4 significant digits."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


_num = fmt_number


def fmt_bytes(x: float) -> str:
    """Sizes in GiB with 3 significant digits (the unit users write limits in): 61.2 GiB."""
    return f"{x / 2**30:.3g} GiB"


def _copies(summary: Summary) -> str:
    """'; 2 parameter copies per rank' where a rank holds more than one model replica, else ''."""
    return f"; {summary.param_copies} parameter copies per rank" if summary.param_copies > 1 else ""


def headline(summary: Summary) -> str:
    """One line: schedule, sizes, makespan, span and both bubble rates, validity."""
    unit = summary.time_unit
    status = "valid" if summary.valid else "INVALID"
    limit = f" mem-limit {summary.mem_limit}" if summary.mem_limit else ""
    return (
        f"{summary.schedule} ({summary.placement}) on {summary.profile}: "
        f"p={summary.ranks} stages={summary.stages} m={summary.microbatches}; "
        f"makespan {_num(summary.makespan)} {unit}, span {_num(summary.span)} {unit}; "
        f"bubble {_pct(summary.bubble_rate_makespan)} (makespan), "
        f"{_pct(summary.bubble_rate_span)} (span){_copies(summary)};{limit} {status}"
    )


def bubble_split(summary: Summary, objectives: tuple[str, ...] = ("makespan", "span")) -> str:
    """Where the bubble comes from, one short line: 'bubble 32.55% of makespan = 27.50% imbalance (the
    stage split) + 5.05% schedule; 31.87% of span = 27.50% + 4.37% schedule'."""
    parts = []
    for i, objective in enumerate(objectives):
        share = _pct(summary.schedule_share(objective))
        imbalance = _pct(summary.imbalance) + (" imbalance (the stage split)" if i == 0 else "")
        parts.append(f"{_pct(summary.bubble_rate(objective))} of {objective} = {imbalance} + {share} schedule")
    return "bubble " + "; ".join(parts)


def summary_table(summary: Summary) -> Table:
    """Per-rank work, idle time, span and peak activation memory; the caption says where the bubble
    comes from (`bubble_split`)."""
    unit = summary.time_unit
    table = Table(title=f"{summary.schedule} on {summary.profile}", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column(f"work ({unit})", justify="right")
    table.add_column(f"idle ({unit})", justify="right")
    table.add_column(f"span ({unit})", justify="right")
    table.add_column("peak mem (x M_B)", justify="right")
    by_bytes, static = summary.peak_memory_bytes_per_rank, summary.static_bytes_per_rank
    if by_bytes is not None:
        table.add_column("peak mem (GiB)", justify="right")
    if static is not None:
        copies = f", {summary.param_copies} copies" if summary.param_copies > 1 else ""
        table.add_column(f"static (GiB{copies})", justify="right")
    for r in range(summary.ranks):
        row = [
            str(r), _num(summary.work_per_rank[r]), _num(summary.idle_per_rank[r]),
            _num(summary.span_per_rank[r]), f"{summary.peak_memory_per_rank[r]:.4g}",
        ]
        if by_bytes is not None:
            row.append(f"{by_bytes[r] / 2**30:.3f}")
        if static is not None:
            row.append(f"{static[r] / 2**30:.3f}")
        table.add_row(*row)
    table.caption = bubble_split(summary) + _copies(summary) + "\n" + accounting(summary)
    table.caption_justify = "left"
    return table


MEMORY_WORDS = {"paper": "the Zero Bubble paper's accounting",
                "torch-runtime": "torch's runtime accounting (what its pipelining runtime holds)"}


def accounting(summary: Summary) -> str:
    """Which memory the peaks count: the activation accounting, and the static bytes' sharding."""
    static = f"; static bytes {summary.static_sharding}" if summary.static_sharding else ""
    return f"memory: activations under {MEMORY_WORDS.get(summary.memory_model, summary.memory_model)}{static}"


def search_status(event: Progress) -> str:
    """One line on a running search (a search.solve.Progress event): phase, incumbent, bound and gap."""
    gap = 0.0 if event.incumbent <= 0 else max(0.0, (event.incumbent - event.bound) / event.incumbent)
    return (f"{event.phase}: incumbent {fmt_number(event.incumbent)}  bound {fmt_number(event.bound)}  "
            f"gap {gap:.2%}")


# Below this share of the plan, the distance to the uncapped bound is not worth a line.
CAP_NOTE_SHARE = 0.01


def cap_line(report: SolveReport) -> str | None:
    """Where the plan stands above what its pipeline needs without the memory limit, one line saying how
    far and which levers buy it back; None without a limit or when the plan is within CAP_NOTE_SHARE."""
    free = report.details.uncapped_bound
    value = report.objective_value
    if free is None or value <= 0 or (value - free) / value <= CAP_NOTE_SHARE:
        return None
    return (f"without the memory limit this split and placement need at least {fmt_number(free)} (a bound), "
            f"{(value - free) / value:.1%} less than the plan; more memory, --recompute auto, a larger -p or "
            "another --placement can buy part of it back")


def solve_headline(report: SolveReport) -> Text:
    """One line on what the search proved: status, bound, gap, time and where it started from."""
    return Text.assemble(
        ("search: ", "bold"), (report.status, "green" if report.status is Status.OPTIMAL else "yellow"),
        f"  {report.objective} {fmt_number(report.objective_value)}",
        f"  lower bound {fmt_number(report.lower_bound)} (bubble >= {report.bubble_rate_lower_bound:.4f})",
        f"  gap {report.gap:.2%}  in {report.solve_seconds:.1f}s",
        f"  from {report.start_heuristic} ({fmt_number(report.heuristic_objective)})",
    )
