"""make_results.py --only paper: the Zero Bubble paper's Table 5 (results/paper_reproduction.{md,csv})."""

from __future__ import annotations

import argparse
import time
from typing import Any, NamedTuple

from results_common import (
    CITATION, OBJECTIVES, PROFILES, RESULTS, anomalies, command, log, rate4, signed4, write_csv, write_text,
)
from zbsearch.search.options import SearchOptions
from zbsearch.core.errors import PreconditionError
from zbsearch.core.profile import Profile, load_profile
from zbsearch.studies import compare as cmp
from zbsearch.report.render import fmt_number
from zbsearch.schedules import REGISTRY

# Table 5: model, m -> 1F1B, 1F1B-I, ZB-H1, ZB-H2, ZB-1p, ZB-2p (published bubble rates).
TABLE5: dict[tuple[str, int], tuple[float, ...]] = {
    ("1.5b", 24): (.2431, .1055, .1585, .1083, .1585, .0433),
    ("1.5b", 32): (.1985, .0818, .1242, .0837, .1242, .0039),
    ("1.5b", 64): (.1240, .0443, .0674, .0444, .0674, .0026),
    ("6.2b", 24): (.2347, .0808, .1323, .0698, .1323, .0029),
    ("6.2b", 32): (.1898, .0628, .1045, .0559, .1045, .0022),
    ("6.2b", 64): (.1091, .0320, .0554, .0294, .0554, .0010),
    ("14.6b", 48): (.2552, .1104, .1397, .0672, .1397, .0066),
    ("14.6b", 64): (.2082, .0852, .1088, .0516, .1088, .0054),
    ("14.6b", 128): (.1251, .0445, .0576, .0266, .0576, .0028),
    ("28.3b", 96): (.2646, .1493, .1421, .0641, .1421, .0038),
    ("28.3b", 128): (.2168, .1164, .1106, .0490, .1106, .0029),
    ("28.3b", 256): (.1352, .0624, .0594, .0257, .0594, .0018),
}
# The paper's handcrafted columns: (column, our schedule, the convention the paper charged it with).
PAPER_COLUMNS = (("1F1B", "1f1b", "makespan"), ("1F1B-I", "interleaved-1f1b", "makespan"),
                 ("ZB-H1", "zb-h1", "makespan"), ("ZB-H2", "zb-h2", "span"))
PAPER_CSV = ("model", "m", "p", "schedule", "source", "mem_limit", "objective", "bubble_rate", "paper", "difference",
             "bubble_rate_makespan", "bubble_rate_span", "makespan", "span", "peak_memory", "within_1p", "within_2p",
             "solve_seconds", "gap", "status", "bubble_rate_lower_bound", "note")


class Setup(NamedTuple):
    """One (model, m) of Table 5: its profile, the published figures and our rows."""

    model: str
    m: int
    prof: Profile
    published: tuple[float, ...]
    fixed: dict[str, cmp.Row]  # registry name -> its row at 1p
    fits: dict[str, tuple[bool, bool]]  # registry name -> (within 1p, within 2p)
    solved: dict[tuple[str, str], cmp.Row]  # (limit, objective) -> zbsearch's row


def paper_section(args: argparse.Namespace) -> None:
    cmd = command("paper", args)
    records: list[dict[str, Any]] = []
    setups = []
    for (model, m), published in TABLE5.items():
        t0 = time.monotonic()
        setup = _run_setup(model, m, published, args.time_limit)
        setups.append(setup)
        log(f"paper {model} m={m}: {time.monotonic() - t0:.0f} s")
        records += _paper_records(setup)
    write_text(RESULTS / "paper_reproduction.md", _paper_markdown(setups, cmd, args))
    write_csv(RESULTS / "paper_reproduction.csv", cmd, records, PAPER_CSV)


def _run_setup(model: str, m: int, published: tuple[float, ...], time_limit: float) -> Setup:
    prof = load_profile(PROFILES / f"zb-paper-{model}-m{m}.json")
    v = prof.details["v"]
    fixed: dict[str, cmp.Row] = {}
    fits: dict[str, tuple[bool, bool]] = {}
    for name in REGISTRY:
        try:
            sched = cmp.handcrafted_schedule(name, prof, v)
        except PreconditionError:
            continue
        at_1p, at_2p = cmp.fixed_rows(sched, prof, ["1p", "2p"], "makespan", name=cmp.display_name(name, v),
                                      source="handcrafted")
        fixed[name], fits[name] = at_1p, (at_1p.within_limit, at_2p.within_limit)
    solved: dict[tuple[str, str], cmp.Row] = {}
    for objective in OBJECTIVES:
        for limit in ("1p", "2p"):
            solved[(limit, objective)] = cmp.solved_row(prof, limit, objective, placement="linear",
                                                        options=SearchOptions(time_limit=time_limit))
    return Setup(model, m, prof, published, fixed, fits, solved)


def _interleaved_as_published(prof: Profile, row: cmp.Row) -> float:
    """1F1B-I's bubble rate under the paper script's timing rule: our makespan minus p*c."""
    p, c = prof.num_stages, prof.comm[0]
    work = sum(row.timeline.work(r) for r in range(p))  # type: ignore[union-attr]
    return 1 - work / (p * (row.makespan - p * c))


def _paper_records(s: Setup) -> list[dict[str, Any]]:
    pub = {name: (s.published[i], conv) for i, (_, name, conv) in enumerate(PAPER_COLUMNS)}
    out = []
    for name, row in s.fixed.items():
        paper, conv = pub.get(name, (None, "makespan"))
        rate = row.bubble_rate_span if conv == "span" else row.bubble_rate_makespan
        out.append({
            "model": s.model, "m": s.m, "p": s.prof.num_stages, "schedule": row.schedule, "source": "handcrafted",
            "mem_limit": "", "objective": conv, "bubble_rate": rate, "paper": paper,
            "difference": None if paper is None else round(rate, 4) - paper,
            "bubble_rate_makespan": row.bubble_rate_makespan, "bubble_rate_span": row.bubble_rate_span,
            "makespan": row.makespan, "span": row.span, "peak_memory": row.peak_memory,
            "within_1p": s.fits[name][0], "within_2p": s.fits[name][1],
            "note": "paper script rule (wrap-around hop waived): " + f"{_interleaved_as_published(s.prof, row):.4f}"
            if name == "interleaved-1f1b" else "",
        })
    for (limit, objective), row in s.solved.items():
        paper = s.published[4 if limit == "1p" else 5] if objective == "span" else None
        out.append({
            "model": s.model, "m": s.m, "p": s.prof.num_stages, "schedule": "zbsearch", "source": "zbsearch",
            "mem_limit": limit, "objective": objective, "bubble_rate": row.bubble_rate, "paper": paper,
            "difference": None if paper is None else round(row.bubble_rate, 4) - paper,
            "bubble_rate_makespan": row.bubble_rate_makespan, "bubble_rate_span": row.bubble_rate_span,
            "makespan": row.makespan, "span": row.span, "peak_memory": row.peak_memory,
            "within_1p": row.peak_memory <= s.prof.num_stages * (1 + 1e-9), "within_2p": True,
            "solve_seconds": row.solve_seconds, "gap": row.gap, "status": row.status,
            "bubble_rate_lower_bound": row.bubble_rate_lower_bound, "note": row.note,
        })
    return out


def _cell(paper: float, ours: float) -> str:
    """'.1585' when we reproduce the published figure to 4 places, else '.1055 → .1090 (+.0035)'."""
    mine = round(ours, 4)
    if abs(mine - paper) < 5e-5:
        return f"{rate4(paper)} ✓"
    return f"{rate4(paper)} → {rate4(mine)} ({signed4(mine - paper)})"


def _vs(ours: float, paper: float) -> str:
    mine = round(ours, 4)
    return f"{rate4(mine)} ✓" if abs(mine - paper) < 5e-5 else f"{rate4(mine)} ({signed4(mine - paper)})"


def _paper_markdown(setups: list[Setup], cmd: str, args: argparse.Namespace) -> str:
    lines = [
        "# Reproducing the Zero Bubble paper's Table 5",
        "",
        f"Regenerate: `{cmd}`",
        "",
        f"Source: {CITATION}, Table 5 (bubble rates) computed from its appendix's profiled times, one profile per "
        "(model, m) in `profiles/zb-paper-*.json`. Every number below is zbsearch's simulator on those profiles "
        "(comm c on every cross-rank hop). Bubble rate = (cost - m(F+B+W)) / cost with cost the makespan (time 0 to "
        "the last pass) or the span (each rank's own first to last pass), the paper's two conventions. "
        f"zbsearch: `solve` on the linear placement, {args.time_limit:g} s per instance on a shared 2-core machine "
        "(a solve can run past that on the largest setups: the heuristics that seed it run to completion first).",
        "",
    ]
    lines += _handcrafted_columns(setups) + _interleaved_note(setups[0]) + _automatic_schedules(setups)
    lines += _makespan_limits(setups) + _every_schedule(setups)
    lines += ["", "The CSV (`paper_reproduction.csv`) has every number above at full precision.", ""]
    lines += anomalies([row for s in setups for row in s.solved.values()])
    return "\n".join(lines)


def _handcrafted_columns(setups: list[Setup]) -> list[str]:
    lines = [
        "## 1. The paper's handcrafted columns",
        "",
        "Each cell: published figure, then zbsearch's where it differs (✓: equal to 4 places). 1F1B, 1F1B-I and "
        "ZB-H1 charged by makespan, ZB-H2 by span, as in the paper's script.",
        "",
        "| model | m | p | 1F1B | 1F1B-I | v | ZB-H1 | ZB-H2 |",
        "|---|---:|---:|---|---|---:|---|---|",
    ]
    for s in setups:
        cells = []
        for i, (_, name, conv) in enumerate(PAPER_COLUMNS):
            row = s.fixed[name]
            cells.append(_cell(s.published[i], row.bubble_rate_span if conv == "span" else row.bubble_rate_makespan))
        cells.insert(2, str(s.prof.details["v"]))
        lines.append(f"| {s.model.upper()} | {s.m} | {s.prof.num_stages} | " + " | ".join(cells) + " |")
    return lines


def _interleaved_note(ex: Setup) -> list[str]:
    p, c = ex.prof.num_stages, ex.prof.comm[0]
    return [
        "",
        "**Why 1F1B-I differs.** The paper's bubble-rate script (efficiency.py in "
        "sail-sg/zero-bubble-pipeline-parallelism) makes only the first microbatch of each group of p wait for the "
        "wrap-around hop from rank p-1 back to rank 0 (the forward into the next chunk, and the backward into the "
        "previous chunk on rank p-1); the other p-1 microbatches of the group skip that data dependency. Every "
        "published 1F1B-I figure is therefore optimistic by exactly p x c per iteration. zbsearch's simulator makes "
        "every microbatch wait for its input, which is what a real executor does, so its column is the correct one. "
        f"Example, {ex.model.upper()} m={ex.m}: p x c = {p} x {fmt_number(c)} us = {fmt_number(p * c)} us; taking "
        f"that off zbsearch's makespan gives {rate4(_interleaved_as_published(ex.prof, ex.fixed['interleaved-1f1b']))}, "
        f"the published {rate4(ex.published[1])}. Every row is checked this way in tests/studies/test_paper_table5.py, and the CSV "
        "lists the figure under the script's rule for each row.",
        "",
    ]


def _automatic_schedules(setups: list[Setup]) -> list[str]:
    lines = [
        "## 2. zbsearch against the paper's automatic schedules (span, as the paper's ZB-1p / ZB-2p)",
        "",
        "ZB-1p and ZB-2p are the paper's greedy scheduler at limits p x M_B and 2p x M_B. zbsearch: bubble rate of "
        "its schedule, then the bubble rate of its proven lower bound (no schedule on this placement under that "
        "limit does better), the status and the solve time. Where the status is 'feasible' the solve stopped on its "
        "time limit, so a rerun (or a longer limit) can land on a slightly different figure; 'optimal' rows are "
        "final.",
        "",
        "| model | m | ZB-1p paper | zbsearch 1p | bound | status | s | ZB-2p paper | zbsearch 2p | difference | bound | status | s |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for s in setups:
        a, b = s.solved[("1p", "span")], s.solved[("2p", "span")]
        lines.append(
            f"| {s.model.upper()} | {s.m} | {rate4(s.published[4])} | {_vs(a.bubble_rate, s.published[4])} | "
            f"{rate4(a.bubble_rate_lower_bound)} | {a.status} | {a.solve_seconds:.0f} | {rate4(s.published[5])} | "
            f"{rate4(b.bubble_rate)} | {signed4(round(b.bubble_rate, 4) - s.published[5])} | "
            f"{rate4(b.bubble_rate_lower_bound)} | {b.status} | {b.solve_seconds:.0f} |")
    return lines


def _makespan_limits(setups: list[Setup]) -> list[str]:
    lines = [
        "",
        "## 3. The same limits when the optimizer step synchronizes ranks (makespan)",
        "",
        "The paper gives no figures for this convention. 'best handcrafted' is the best handcrafted schedule "
        "within the limit, on any placement; zbsearch is on the linear placement.",
        "",
        "| model | m | best handcrafted within 1p | zbsearch 1p | bound | status | best handcrafted within 2p | zbsearch 2p | bound | status |",
        "|---|---:|---|---:|---:|---|---|---:|---:|---|",
    ]
    for s in setups:
        cells = []
        for limit in ("1p", "2p"):
            cap = s.prof.num_stages * (1 if limit == "1p" else 2)
            fits = [r for r in s.fixed.values() if r.peak_memory <= cap * (1 + 1e-9)]
            best = min(fits, key=lambda r: r.bubble_rate_makespan)
            z = s.solved[(limit, "makespan")]
            cells += [f"{best.schedule} {rate4(best.bubble_rate_makespan)}", rate4(z.bubble_rate),
                      rate4(z.bubble_rate_lower_bound), z.status]
        lines.append(f"| {s.model.upper()} | {s.m} | " + " | ".join(cells) + " |")
    return lines


def _every_schedule(setups: list[Setup]) -> list[str]:
    names = [n for n in REGISTRY if all(n in s.fixed for s in setups)]
    lines = [
        "",
        "## 4. Every handcrafted schedule",
        "",
        "Each cell: bubble rate by makespan / by span, then the peak activation memory on the busiest rank in "
        "multiples of its stage M_B (1p = p of them). Interleaved 1F1B uses the paper's v.",
        "",
        "| model | m | " + " | ".join(names) + " |",
        "|---|---:|" + "---|" * len(names),
    ]
    for s in setups:
        cells = [f"{rate4(s.fixed[n].bubble_rate_makespan)} / {rate4(s.fixed[n].bubble_rate_span)} · "
                 f"{s.fixed[n].peak_memory:.3g}" for n in names]
        lines.append(f"| {s.model.upper()} | {s.m} | " + " | ".join(cells) + " |")
    return lines
