"""A comparison as text: Markdown tables (one per microbatch count and limit) and CSV records."""

from __future__ import annotations

import csv
import io
from typing import Any, Sequence

from ..report.render import fmt_number
from ..core.objective import Objective
from .rows import Comparison, Row

CSV_COLUMNS = ("profile", "p", "m", "mem_limit", "schedule", "source", "placement", "objective", "bubble_rate",
               "bubble_rate_makespan", "bubble_rate_span", "makespan", "span", "time_unit", "peak_memory",
               "peak_memory_per_rank", "within_limit", "solve_seconds", "gap", "status", "bubble_rate_lower_bound",
               "note", "imbalance")


def pct(x: float | None, digits: int = 2) -> str:
    """'15.85%', or '-' for no value."""
    return "-" if x is None else f"{100 * x:.{digits}f}%"


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
        gap = "-" if r.gap is None else f"{pct(r.gap)} ({r.status})"
        out.append(f"| {name} | {limit} | {pct(r.bubble_rate)} | {fmt_number(r.makespan)} "
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
    lines += _imbalance_note(comp.rows)
    for m in comp.microbatches:
        for limit in comp.limits:
            rows = comp.rows_for(m, limit)
            if rows:
                lines += [f"## m = {m}, memory limit {limit}", ""] + markdown_table(rows, prof.time_unit) + [""]
    if comp.skipped:
        lines += ["## Not in the tables", ""]
        lines += [f"- m = {s.microbatches}, {s.schedule}: {s.reason}" for s in comp.skipped] + [""]
    return "\n".join(lines)


def _imbalance_note(rows: Sequence[Row]) -> list[str]:
    """A sentence on the stage imbalance when there is one (the CSV's imbalance column has each row's)."""
    figures = sorted({round(r.imbalance, 6) for r in rows if r.imbalance > 0})
    if not figures:
        return []
    shown = pct(figures[0]) if len(figures) == 1 else f"{pct(figures[0])} to {pct(figures[-1])}"
    return [f"Imbalance between stages (1 - mean rank work / the busiest rank's work): {shown}. No schedule's bubble "
            "rate goes below it, only a different split of the layers into stages removes it; the rest of a bubble "
            "rate is what the schedule adds.", ""]


def _objective_words(objective: str) -> str:
    return ("makespan: time 0 to the last pass, the cost when the optimizer step synchronizes ranks"
            if Objective.parse(objective) is Objective.MAKESPAN else
            "span: each rank's own first to last pass, the cost without a synchronizing optimizer step")


def csv_record(comp: Comparison, row: Row) -> dict[str, Any]:
    """One CSV record: the row's columns after the profile's."""
    return {"profile": comp.profile.name, "p": comp.profile.num_stages, "time_unit": comp.profile.time_unit,
            **row.to_dict()}


def csv_rows(comp: Comparison) -> list[dict[str, Any]]:
    """The rows as CSV records, in the Markdown tables' order."""
    return [csv_record(comp, r) for m in comp.microbatches for limit in comp.limits
            for r in sorted_rows(comp.rows_for(m, limit))]


def to_csv(comp: Comparison) -> str:
    """The comparison's rows as CSV text (see records_to_csv)."""
    return records_to_csv(csv_rows(comp))


def records_to_csv(records: Sequence[dict[str, Any]], columns: Sequence[str] = CSV_COLUMNS) -> str:
    """CSV text with a header row; floats at full precision, None as an empty cell."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for rec in records:
        writer.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in rec.items()})
    return buf.getvalue()
