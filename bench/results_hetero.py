"""make_results.py --only hetero: heterogeneous stages, where handcrafted schedules lose the most
(results/hetero_study.* and results/pareto_hetero_p8_m24.*)."""

from __future__ import annotations

import argparse
from typing import Any

from results_common import OBJECTIVES, RESULTS, anomalies, command, figures, log, pct, write_csv, write_text
from zbsearch.core.profile import Profile
from zbsearch.studies import compare as cmp
from zbsearch.report.plot import plot_gantt_grid, plot_pareto

HETERO_LIMITS = ("0.5p", "0.75p", "1p", "1.5p", "2p")
# Placement families: the handcrafted schedules of each, and zbsearch's placement for it.
FAMILIES = (("linear", "linear", ("1f1b", "zb-h1", "zb-h2", "gpipe")),
            ("V-shape", "v", ("zb-v", "v-half", "v-min", "dualpipev", "torch:ZBVZeroBubble", "torch:DualPipeV")))

# objective -> zbsearch's placement ("linear" also holds every fixed schedule) -> its comparison
Comparisons = dict[str, dict[str, cmp.Comparison]]
# (how much longer, objective, limit, family, best fixed row, zbsearch's row)
Loss = tuple[float, str, str, str, cmp.Row, cmp.Row]


def hetero_profile(p: int, m: int) -> Profile:
    """First stage 1.2x (embedding), last 1.5x (output layer and loss), comm 5% of F, M_W = M_B / 2."""
    stages = []
    for r in range(p):
        k = 1.2 if r == 0 else 1.5 if r == p - 1 else 1.0
        stages.append({"F": 100 * k, "B": 100 * k, "W": 80 * k, "mem_B": 1.0 * k, "mem_W": 0.5 * k})
    return Profile.from_dict({
        "name": f"hetero p={p}", "num_stages": p, "microbatches": m, "time_unit": "unit", "stages": stages,
        "comm": 5.0, "source": {"kind": "estimated", "method": "synthetic: F=B=100, W=80 per stage; first stage "
                                "1.2x, last 1.5x (embedding, loss); comm 5% of F; M_W = M_B/2"},
    })


def hetero_section(args: argparse.Namespace) -> None:
    cmd = command("hetero", args)
    prof = hetero_profile(8, 24)
    comps: Comparisons = {}
    for objective in OBJECTIVES:
        comps[objective] = {
            "linear": cmp.compare(prof, limits=HETERO_LIMITS, schedules="all", objective=objective,
                                  time_limit=args.time_limit, placement="linear"),
            "v": cmp.compare(prof, limits=HETERO_LIMITS, schedules="none", objective=objective,
                             time_limit=args.time_limit, placement="v"),
        }
        log(f"hetero {objective} done")
    summary, worst = _summary_table(comps)
    details, records = _every_schedule(prof, comps)
    write_text(RESULTS / "hetero_study.md", "\n".join(_header(prof, cmd, args) + summary + details) + "\n")
    write_csv(RESULTS / "hetero_study.csv", cmd, records, cmp.CSV_COLUMNS)
    if worst is not None:
        _worst_figure(worst, cmd)
    _pareto_figure(prof, comps["makespan"], cmd)


def _family_rows(comps: dict[str, cmp.Comparison], limit: str, family: tuple) -> tuple:
    """(best fixed schedule of the family within the limit, zbsearch on its placement) at one limit."""
    _, placement, names = family
    comp = comps[placement]
    rows = comp.rows_for(comp.microbatches[0], limit)
    fixed = [r for r in comps["linear"].rows_for(comp.microbatches[0], limit)
             if r.source != "zbsearch" and r.within_limit and r.schedule in names]
    best = min(fixed, key=lambda r: r.bubble_rate) if fixed else None
    z = next((r for r in rows if r.source == "zbsearch"), None)
    return best, z


def _header(prof: Profile, cmd: str, args: argparse.Namespace) -> list[str]:
    work = [s.F + s.B + s.W for s in prof.stages]
    floor = 1 - sum(work) / (prof.num_stages * max(work))
    return [
        "# Heterogeneous stages: where handcrafted schedules lose the most",
        "",
        f"Regenerate: `{cmd}`",
        "",
        "p = 8, m = 24. Every stage F = B = 100, W = 80 (units), except the first (embedding: 1.2x) and the last "
        "(output layer and loss: 1.5x), whose activation memory is 1.2x and 1.5x too; comm 5 per hop (5% of F); "
        "M_W = M_B / 2. A limit of Np lets each rank hold N x p of its own stage's M_B. Chunked placements split "
        "a rank's stage evenly over its chunks, so the last rank stays the bottleneck on every placement: no "
        f"schedule's bubble rate can go below {pct(floor)} (1 - mean work / the last rank's work), and what "
        "matters is how far above that floor a schedule stays.",
        "",
        f"zbsearch: `solve` on the linear and on the V-shape placement, {args.time_limit:g} s per instance. Each "
        "family is compared with zbsearch on its own placement. 'loses' = how much longer an iteration takes with "
        "the best handcrafted schedule of the family that fits the limit than with zbsearch's: (its cost - "
        "zbsearch's) / zbsearch's. 'none fits': no handcrafted schedule of the family fits the limit.",
        "",
        "![hetero study](hetero_study.png)",
        "",
    ]


def _summary_table(comps: Comparisons) -> tuple[list[str], Loss | None]:
    """The summary table, and where a family's best handcrafted schedule loses the most."""
    lines = [
        "## Summary",
        "",
        "| objective | limit | linear: best handcrafted | bubble | zbsearch linear | status | loses "
        "| V-shape: best handcrafted | bubble | zbsearch V-shape | status | loses |",
        "|---|---|---|---:|---:|---|---:|---|---:|---:|---|---:|",
    ]
    worst: Loss | None = None
    for objective in OBJECTIVES:
        for limit in HETERO_LIMITS:
            cells = [objective, limit]
            for family in FAMILIES:
                best, z = _family_rows(comps[objective], limit, family)
                loss = None if best is None or z is None else best.cost / z.cost - 1
                cells += [best.schedule if best else "none fits", pct(best.bubble_rate) if best else "-",
                          pct(z.bubble_rate) if z else "infeasible", z.status if z else "-",
                          pct(loss, 1) if loss is not None else "-"]
                if loss is not None and (worst is None or loss > worst[0]):
                    worst = (loss, objective, limit, family[0], best, z)
            lines.append("| " + " | ".join(cells) + " |")
    return lines, worst


def _every_schedule(prof: Profile, comps: Comparisons) -> tuple[list[str], list[dict[str, Any]]]:
    """A table per objective and limit of every schedule, and the same rows as CSV records."""
    m = prof.microbatches
    lines: list[str] = []
    records = []
    for objective in OBJECTIVES:
        lin, vs = comps[objective]["linear"], comps[objective]["v"]
        lines += ["", f"## Every schedule, {objective}", ""]
        for limit in HETERO_LIMITS:
            rows = lin.rows_for(m, limit) + [r for r in vs.rows_for(m, limit) if r.source == "zbsearch"]
            lines += [f"### limit {limit}", ""] + cmp.markdown_table(rows, prof.time_unit) + [""]
            records += [cmp.csv_record(lin, r) for r in cmp.sorted_rows(rows)]
        skipped = lin.skipped + vs.skipped
        if skipped:
            lines += ["Not in the tables: " + "; ".join(f"{s.schedule}: {s.reason}" for s in skipped), ""]
        lines += anomalies([r for r in lin.rows + vs.rows if r.source == "zbsearch"])
    return lines, records


def _worst_figure(worst: Loss, cmd: str) -> None:
    loss, objective, limit, fam, best, z = worst
    charts = [(cmp.chart_title(best), best.timeline), (cmp.chart_title(z), z.timeline)]
    title = (f"Heterogeneous stages (first 1.2x, last 1.5x, comm 5% of F), p=8, m=24, {fam} placement, limit "
             f"{limit}, {objective}: the best handcrafted schedule takes {pct(loss, 1)} longer than zbsearch's")
    figures(RESULTS / "hetero_study", lambda path: plot_gantt_grid(charts, path, suptitle=title,
                                                                    footer=f"regenerate: {cmd}"))


def _pareto_figure(prof: Profile, comp: dict[str, cmp.Comparison], cmd: str) -> None:
    m = prof.microbatches
    points = (cmp.pareto_points(comp["linear"].rows_for(m), "zbsearch, linear placement", "linear")
              + cmp.pareto_points(comp["v"].rows_for(m), "zbsearch, V-shape placement", "v"))
    figures(RESULTS / "pareto_hetero_p8_m24", lambda path: plot_pareto(
        points, path, title="Heterogeneous stages, p=8, m=24: bubble rate (makespan) against peak activation memory",
        objective="makespan", p=prof.num_stages, footer=f"regenerate: {cmd}"))
