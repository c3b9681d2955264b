"""make_results.py --only unit: every schedule at p=4, m=8, F=B=W=1 (results/unit_time_p4_m8.*)."""

from __future__ import annotations

import argparse
from typing import Any

from results_common import RESULTS, command, figures, pct, write_csv, write_text
from zbsearch.search.options import SearchOptions
from zbsearch.core.profile import uniform_profile
from zbsearch.studies import compare as cmp
from zbsearch.report.plot import plot_gantt_grid
from zbsearch.report.render import fmt_number

UNIT_CSV = ("schedule", "source", "placement", "makespan", "bubble_rate_makespan", "span", "bubble_rate_span",
            "idle_per_rank", "peak_memory_per_rank", "peak_memory", "fits", "note")


def unit_section(args: argparse.Namespace) -> None:
    cmd = command("unit", args)
    prof = uniform_profile(1, 1, 1, p=4, m=8)
    comp = cmp.compare(prof, limits=["1p", "2p"], schedules="all", objective="makespan",
                       options=SearchOptions(time_limit=args.time_limit),
                       placement="auto")
    charts, rows_md, records = [], [], []
    seen: set[str] = set()
    for r in comp.rows:
        if r.source != "zbsearch" and r.schedule in seen:
            continue
        seen.add(r.schedule)
        chart, line, record = _unit_row(comp, r)
        charts.append(chart)
        rows_md.append((r.bubble_rate_makespan, line))
        records.append(record)
    lines = _unit_header(cmd, args) + [line for _, line in sorted(rows_md, key=lambda x: x[0])]
    if comp.skipped:
        lines += ["", "Not shown: " + "; ".join(f"{s.schedule}: {s.reason}" for s in comp.skipped)]
    write_text(RESULTS / "unit_time_p4_m8.md", "\n".join(lines) + "\n")
    write_csv(RESULTS / "unit_time_p4_m8.csv", cmd, records, UNIT_CSV)
    figures(RESULTS / "unit_time_p4_m8", lambda path: plot_gantt_grid(
        charts, path, suptitle="Every schedule at p=4, m=8, F=B=W=1 (unit times), on one time axis",
        footer=f"regenerate: {cmd}"))


def _unit_row(comp: cmp.Comparison, r: cmp.Row) -> tuple[tuple[str, Any], str, dict[str, Any]]:
    """One schedule's chart (title, timeline), Markdown line and CSV record."""
    tl = r.timeline
    assert tl is not None
    idle = [tl.makespan - tl.work(q) for q in range(tl.num_ranks)]
    if r.source == "zbsearch":
        fit_txt = r.mem_limit
    else:
        fit_txt = ", ".join(x.mem_limit for x in comp.rows if x.schedule == r.schedule and x.within_limit) or "-"
    name = (f"zbsearch at {r.mem_limit} ({r.note}; {r.status}, bound {pct(r.bubble_rate_lower_bound)})"
            if r.source == "zbsearch" else r.schedule)
    label = f"zbsearch at {r.mem_limit}" if r.source == "zbsearch" else r.schedule
    chart = (f"{label}: bubble {pct(r.bubble_rate_makespan)} (makespan {fmt_number(r.makespan)}), "
             f"{pct(r.bubble_rate_span)} (span {fmt_number(r.span)}), peak {r.peak_memory:.3g} x M_B", tl)
    line = (f"| {name} | {r.placement} | {fmt_number(r.makespan)} | "
            f"{pct(r.bubble_rate_makespan)} | {fmt_number(r.span)} | {pct(r.bubble_rate_span)} | "
            f"{' '.join(fmt_number(x) for x in idle)} | {cmp.format_peaks(r.peak_memory_per_rank)} | "
            f"{fit_txt} |")
    record = {"schedule": label, "source": r.source, "placement": r.placement, "makespan": r.makespan,
              "bubble_rate_makespan": r.bubble_rate_makespan, "span": r.span,
              "bubble_rate_span": r.bubble_rate_span, "idle_per_rank": " ".join(f"{x:g}" for x in idle),
              "peak_memory_per_rank": " ".join(f"{x:g}" for x in r.peak_memory_per_rank),
              "peak_memory": r.peak_memory, "fits": fit_txt, "note": r.note}
    return chart, line, record


def _unit_header(cmd: str, args: argparse.Namespace) -> list[str]:
    return [
        "# Every schedule at unit times: p = 4, m = 8, F = B = W = 1, comm 0",
        "",
        f"Regenerate: `{cmd}`",
        "",
        "Memory: M_B = 1 per stage, M_W = 0.5 (B frees half, W the rest); a chunk of a 2-chunk schedule holds half. "
        "Idle per rank = makespan minus the rank's work (12 units). Peak: activations on each rank in multiples of "
        "its stage M_B; 1p = 4. zbsearch: solved at 1p and 2p for makespan on the linear and V-shape placements "
        f"(`--placement auto`), {args.time_limit:g} s each. torch rows: torch.distributed.pipelining's own orders, "
        "simulated on the same profile. Sorted by bubble rate (makespan).",
        "",
        "![every schedule at p=4, m=8](unit_time_p4_m8.png)",
        "",
        "| schedule | placement | makespan | bubble (makespan) | span | bubble (span) | idle per rank | peak memory per rank (x M_B) | fits |",
        "|---|---|---:|---:|---:|---:|---|---|---|",
    ]
