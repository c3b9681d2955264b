"""make_results.py --only pareto: bubble rate against peak memory on the paper's 1.5B, m=24 setup
(results/pareto_1.5b_m24.{md,csv,png,svg})."""

from __future__ import annotations

import argparse

from results_common import CITATION, PROFILES, RESULTS, anomalies, command, figures, log, pct, write_csv, write_text
from zbsearch.core.profile import Profile, load_profile
from zbsearch.studies import compare as cmp
from zbsearch.report.plot import plot_pareto

PARETO_LIMITS = ("0.25p", "0.375p", "0.5p", "0.75p", "1p", "1.25p", "1.5p", "2p", "3p")


def pareto_section(args: argparse.Namespace) -> None:
    cmd = command("pareto", args)
    prof = load_profile(PROFILES / "zb-paper-1.5b-m24.json")
    v = prof.details["v"]
    linear = cmp.compare(prof, limits=PARETO_LIMITS, schedules="all", objective="makespan", chunks=v,
                         time_limit=args.time_limit, placement="linear")
    log("pareto linear done")
    vshape = cmp.compare(prof, limits=PARETO_LIMITS, schedules="none", objective="makespan",
                         time_limit=args.time_limit, placement="v")
    log("pareto v done")
    points = (cmp.pareto_points(linear.rows, "zbsearch, linear placement", "linear")
              + cmp.pareto_points(vshape.rows, "zbsearch, V-shape placement", "v"))
    title = "Zero Bubble paper 1.5B, p=8, m=24: bubble rate (makespan) against peak activation memory"
    figures(RESULTS / "pareto_1.5b_m24", lambda path: plot_pareto(
        points, path, title=title, objective="makespan", p=prof.num_stages, footer=f"regenerate: {cmd}"))
    lines = _header(prof, cmd, args) + _limits_table(prof, linear, vshape) + _fixed_table(linear)
    skipped = linear.skipped + vshape.skipped
    if skipped:
        lines += ["", "Not shown: " + "; ".join(f"{s.schedule}: {s.reason}" for s in skipped)]
    lines += [""] + anomalies([r for r in linear.rows + vshape.rows if r.source == "zbsearch"])
    write_text(RESULTS / "pareto_1.5b_m24.md", "\n".join(lines) + "\n")
    records = cmp.csv_rows(linear) + [dict(r, schedule="zbsearch (v)") if r["source"] == "zbsearch" else r
                                      for r in cmp.csv_rows(vshape)]
    write_csv(RESULTS / "pareto_1.5b_m24.csv", cmd, records, cmp.CSV_COLUMNS)


def _header(prof: Profile, cmd: str, args: argparse.Namespace) -> list[str]:
    return [
        "# Memory against bubble: the paper's 1.5B setup, p = 8, m = 24",
        "",
        f"Regenerate: `{cmd}`",
        "",
        f"Profile `profiles/zb-paper-1.5b-m24.json` ({CITATION}; M_W / M_B = {prof.stages[0].mem_W:.3f}). Bubble rate "
        "by makespan (the optimizer step synchronizes ranks). zbsearch solved at each limit on the linear and the "
        f"V-shape placement, {args.time_limit:g} s each; 'bound' is the bubble rate no schedule on that placement "
        "can beat under that limit. Peak memory: the busiest rank, in multiples of its stage M_B (1p = 8).",
        "",
        "![Pareto](pareto_1.5b_m24.png)",
        "",
    ]


def _limits_table(prof: Profile, linear: cmp.Comparison, vshape: cmp.Comparison) -> list[str]:
    """zbsearch on both placements at each limit, next to the best fixed schedule within it."""
    lines = [
        "## zbsearch at each limit",
        "",
        "| limit | linear: bubble | peak | bound | status | V-shape: bubble | peak | bound | status | best handcrafted within the limit |",
        "|---|---:|---:|---:|---|---:|---:|---:|---|---|",
    ]
    m = prof.microbatches
    for limit in PARETO_LIMITS:
        cells = []
        for comp in (linear, vshape):
            z = next((r for r in comp.rows_for(m, limit) if r.source == "zbsearch"), None)
            cells += ([pct(z.bubble_rate), f"{z.peak_memory:.3g}", pct(z.bubble_rate_lower_bound), z.status] if z
                      else ["infeasible", "-", "-", "-"])
        fits = [r for r in linear.rows_for(m, limit) if r.source != "zbsearch" and r.within_limit]
        best = min(fits, key=lambda r: r.bubble_rate) if fits else None
        cells.append(f"{best.schedule} {pct(best.bubble_rate)}" if best else "none")
        lines.append(f"| {limit} | " + " | ".join(cells) + " |")
    return lines


def _fixed_table(linear: cmp.Comparison) -> list[str]:
    """Each fixed schedule once, by peak memory, with the smallest limit it fits."""
    lines = ["", "## The fixed schedules", "",
             "| schedule | bubble (makespan) | peak memory (x M_B) | smallest limit it fits |", "|---|---:|---:|---|"]
    seen: set[str] = set()
    for r in sorted((r for r in linear.rows if r.source != "zbsearch"), key=lambda r: r.peak_memory):
        if r.schedule in seen:
            continue
        seen.add(r.schedule)
        fit = next((x.mem_limit for x in linear.rows if x.schedule == r.schedule and x.within_limit), "above 3p")
        lines.append(f"| {r.schedule} | {pct(r.bubble_rate)} | {r.peak_memory:.3g} | {fit} |")
    return lines
