"""Solver benchmark: every handcrafted schedule, the best heuristic, zbsearch and its proven bound.

Regenerate with:  python bench/solve_bench.py            (all sections, about 65 minutes on 2 cores)
                  python bench/solve_bench.py --only table5-span,small   (some sections)
Writes results/solve_bench.md and results/solve_bench.json. Wall times are of this machine, same run.

Sections:
- table5-span / table5-makespan: the Zero Bubble paper's 12 Table 5 setups (profiles/zb-paper-*.json),
  at the 1p and 2p limits, next to the paper's ZB-1p / ZB-2p figures (span).
- hetero: first stage 1.2x, last 1.5x the others, comm 5% of F, M_W = M_B / 2; zbsearch against
  every handcrafted schedule that fits the same limit.
- small / small-auto: p*m <= 64, where zbsearch should prove optimality (120 s limit); one stage per
  rank, then with --placement auto (one stage per rank or V-shape).
- scale: p=32, m=256 under a 120 s limit, and p=64, m=512 under 300 s, with the process's peak memory.
- hetero-random: 24 seeded random heterogeneous instances (bench_instances.py: p=4 and 8, m=2p..4p,
  stage times 0.7-1.5x, comm 0-10% of F, limits 0.75p..2p), span, linear placement, 30 s each; the gap
  distribution is summarized under the table.
- v-large: the V-shape at 1p, span, on the paper's 6.2B-28.3B stage times at p=16 and 32, m=3p..8p.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from zbsearch.core.errors import PreconditionError
from zbsearch.core.fileio import write_atomic
from zbsearch.core.memory import parse_mem_limit
from zbsearch.search.options import SearchOptions
from zbsearch.search.problem import make_problems
from zbsearch.core.profile import Profile, load_profile
from zbsearch.schedules import REGISTRY, generate
from zbsearch.search.solve.driver import solve_placements
from zbsearch.sim.validate import check

from bench_instances import hetero_random, scale_64, v_large
from make_results import hetero_profile  # the same synthetic profile as results/hetero_study.md

ROOT = Path(__file__).resolve().parent.parent
HANDCRAFTED = [name for name in REGISTRY if name not in ("gpipe",)]
# Table 5 of the paper (ZB-1p, ZB-2p columns: its greedy scheduler, span convention).
PAPER = {
    ("1.5b", 24): (.1585, .0433), ("1.5b", 32): (.1242, .0039), ("1.5b", 64): (.0674, .0026),
    ("6.2b", 24): (.1323, .0029), ("6.2b", 32): (.1045, .0022), ("6.2b", 64): (.0554, .0010),
    ("14.6b", 48): (.1397, .0066), ("14.6b", 64): (.1088, .0054), ("14.6b", 128): (.0576, .0028),
    ("28.3b", 96): (.1421, .0038), ("28.3b", 128): (.1106, .0029), ("28.3b", 256): (.0594, .0018),
}


def handcrafted_rows(profile: Profile, limit_text: str, objective: str) -> dict[str, float | None]:
    """Bubble rate of every handcrafted schedule on this profile; None where it breaks the limit or
    is not defined for these p, m."""
    limit = parse_mem_limit(limit_text, profile)
    out: dict[str, float | None] = {}
    for name in HANDCRAFTED:
        try:
            sched = generate(name, profile.num_stages, profile.microbatches)
        except PreconditionError:
            continue
        report = check(sched, profile, limit)
        if report.timeline is None:
            continue
        rate = report.timeline.bubble_rate_span if objective == "span" else report.timeline.bubble_rate_makespan
        out[name] = rate if report.ok else None
    return out


WORKERS = 2  # CP-SAT workers (--workers)


def run_one(profile: Profile, limit: str, objective: str, time_limit: float, placement: str = "linear") -> dict:
    problems = make_problems(profile, limit, objective, placement)
    t0 = time.monotonic()
    result = solve_placements(problems, SearchOptions(time_limit=time_limit, workers=WORKERS))
    # The solve alone (its validation included), not the handcrafted columns evaluated below.
    wall = time.monotonic() - t0
    problem = result.problem
    rep = result.report()
    heur_tl_rate = 1 - sum(rep.summary.work_per_rank) / (problem.num_ranks * result.heuristic_objective)
    return {
        "profile": profile.name, "p": profile.num_stages, "m": profile.microbatches, "limit": limit,
        "objective": objective, "handcrafted": handcrafted_rows(profile, limit, objective),
        "best_heuristic": result.start_heuristic, "heuristic_bubble": heur_tl_rate,
        "zbsearch_bubble": rep.summary.bubble_rate(objective), "bound_bubble": rep.bubble_rate_lower_bound,
        "gap": rep.gap, "status": rep.status, "wall_s": wall, "cpsat": rep.details.cpsat_status,
        "peak_memory": rep.summary.peak_memory,
        "placement": rep.summary.placement,
    }


def section_table5(objective: str, time_limit: float) -> list[dict]:
    rows = []
    for (model, m), (paper1, paper2) in PAPER.items():
        prof = load_profile(ROOT / "profiles" / f"zb-paper-{model}-m{m}.json")
        for limit, paper in (("1p", paper1), ("2p", paper2)):
            row = run_one(prof, limit, objective, time_limit)
            row["paper"] = paper if objective == "span" else None
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def section_hetero(time_limit: float) -> list[dict]:
    """zbsearch tries the one-stage-per-rank and the V-shape placement (--placement auto), so it
    competes with the V-shape schedules (ZB-V, DualPipeV, V-Half, V-Min) on their own ground."""
    rows = []
    for m in (24, 32):
        prof = hetero_profile(8, m)
        for limit in ("0.5p", "1p", "2p"):
            for objective in ("makespan", "span"):
                row = run_one(prof, limit, objective, time_limit, placement="auto")
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def section_small(time_limit: float, placement: str = "linear") -> list[dict]:
    """p*m <= 64 on one stage per rank (the optimality target), and again with --placement auto,
    where the V-shape beats every linear schedule at 0.5p."""
    rows = []
    for p, m in ((4, 8), (4, 16), (8, 8)):
        prof = hetero_profile(p, m)
        for limit in ("0.5p", "1p", "2p"):
            for objective in ("makespan", "span"):
                row = run_one(prof, limit, objective, time_limit, placement=placement)
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def section_scale(time_limit: float, time_limit_64: float) -> list[dict]:
    """p=32, m=256 at 1p and 2p, then p=64, m=512 at 1p; peak RSS is the process's so far, which the
    last and largest row sets."""
    prof = load_profile(ROOT / "profiles" / "zb-paper-28.3b-m256.json")
    rows = []
    for profile, limit, seconds in ((prof, "1p", time_limit), (prof, "2p", time_limit),
                                    (scale_64(), "1p", time_limit_64)):
        row = run_one(profile, limit, "makespan", seconds)
        row["max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def section_hetero_random(time_limit: float, only: list[int] | None = None) -> list[dict]:
    rows = []
    for n, (prof, limit) in enumerate(hetero_random()):
        if only is not None and n not in only:
            continue
        row = run_one(prof, limit, "span", time_limit)
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def section_v_large(time_limit: float, only: list[int] | None = None) -> list[dict]:
    rows = []
    for n, prof in enumerate(v_large()):
        if only is not None and n not in only:
            continue
        row = run_one(prof, "1p", "span", time_limit, placement="v")
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def gap_summary(rows: list[dict]) -> str:
    """One line: how the gaps of a section are distributed."""
    gaps = sorted(r["gap"] for r in rows)
    if not gaps:
        return ""
    mean = sum(gaps) / len(gaps)
    median = gaps[len(gaps) // 2] if len(gaps) % 2 else (gaps[len(gaps) // 2 - 1] + gaps[len(gaps) // 2]) / 2
    proven = sum(1 for r in rows if r["status"] == "optimal")
    return (f"Gaps over {len(gaps)} instances: max {gaps[-1]:.2%}, mean {mean:.2%}, median {median:.2%}; "
            f"{proven} proven optimal; {sum(1 for g in gaps if g > 0.01)} above 1%.")


def _line(row: dict) -> str:
    return (f"{row['profile']:24s} m={row['m']:<4d} {row['limit']:5s} {row['objective']:8s} "
            f"heur={row['heuristic_bubble']:.4f} zbsearch={row['zbsearch_bubble']:.4f} bound={row['bound_bubble']:.4f} "
            f"gap={row['gap']:.4f} {row['status']:8s} {row['wall_s']:.1f}s")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def markdown(sections: dict[str, list[dict]], command: str) -> str:
    out = [f"# Solver benchmark\n\nRegenerate: `{command}`\n",
           "Bubble rate = 1 - sum(work) / (p x cost), cost = makespan or max span as the objective says. "
           "'bound' is the bubble rate of zbsearch's proven lower bound: no schedule under that limit does "
           "better. Handcrafted columns: '-' = breaks the limit or not defined for this p, m. Wall times: "
           "zbsearch's solve (heuristics, CP-SAT, validation), on this 2-core machine, one run. Time limit "
           "per instance: 60 s; 120 s for the small and scale sections (300 s for p=64, m=512); 30 s for "
           "hetero-random.\n"]
    for name, rows in sections.items():
        if not rows:
            continue
        out.append(f"\n## {name}\n")
        hc = [h for h in HANDCRAFTED if any(h in r["handcrafted"] for r in rows)]
        cols = ["setup", "m", "limit", "objective"] + hc + ["best heuristic", "heuristic", "zbsearch", "placement", "bound", "gap", "status", "wall s"]
        if any(r.get("paper") is not None for r in rows):
            cols.insert(cols.index("zbsearch"), "paper ZB-1p/2p")
        if any("max_rss_gib" in r for r in rows):
            cols.append("peak RSS GiB")
        out.append("| " + " | ".join(cols) + " |")
        out.append("|" + "---|" * len(cols))
        for r in rows:
            cells = [r["profile"], str(r["m"]), r["limit"], r["objective"]] + [_fmt(r["handcrafted"].get(h)) for h in hc]
            cells += [r["best_heuristic"], _fmt(r["heuristic_bubble"])]
            if "paper ZB-1p/2p" in cols:
                cells.append(_fmt(r.get("paper")))
            cells += [_fmt(r["zbsearch_bubble"]), r.get("placement", "linear"), _fmt(r["bound_bubble"]), f"{r['gap']:.2%}",
                      r["status"], f"{r['wall_s']:.1f}"]
            if "peak RSS GiB" in cols:
                cells.append(f"{r.get('max_rss_gib', float('nan')):.2f}")
            out.append("| " + " | ".join(cells) + " |")
        if name in ("hetero-random", "v-large"):
            out.append("\n" + gap_summary(rows))
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="table5-span,table5-makespan,hetero,small,small-auto,scale,hetero-random,v-large")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--scale-time-limit", type=float, default=120.0)
    ap.add_argument("--scale64-time-limit", type=float, default=300.0)
    # The issue sets no time for the small instances, only that they be proven optimal; at 60 s the
    # proof of hetero p=4, m=16, 0.5p, span landed in 2 of 4 runs (CP-SAT's two threads race).
    ap.add_argument("--small-time-limit", type=float, default=120.0)
    ap.add_argument("--hetero-random-time-limit", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT workers")
    ap.add_argument("--instances", default=None,
                    help="comma list of instance numbers for hetero-random and v-large (a quick check)")
    ap.add_argument("--out", default=str(ROOT / "results" / "solve_bench"))
    args = ap.parse_args(argv)
    wanted = args.only.split(",")
    global WORKERS
    WORKERS = args.workers
    only = [int(x) for x in args.instances.split(",")] if args.instances else None
    runners = {
        "table5-span": lambda: section_table5("span", args.time_limit),
        "table5-makespan": lambda: section_table5("makespan", args.time_limit),
        "hetero": lambda: section_hetero(args.time_limit),
        "small": lambda: section_small(args.small_time_limit),
        "small-auto": lambda: section_small(args.small_time_limit, "auto"),
        "scale": lambda: section_scale(args.scale_time_limit, args.scale64_time_limit),
        "hetero-random": lambda: section_hetero_random(args.hetero_random_time_limit, only),
        "v-large": lambda: section_v_large(args.time_limit, only),
    }
    # Sections not run this time keep their last results, so one section can be rerun on its own.
    previous = Path(args.out + ".json")
    sections = json.loads(previous.read_text()) if previous.exists() else {}
    sections.update({name: runners[name]() for name in runners if name in wanted})
    sections = {name: sections[name] for name in runners if name in sections}
    command = "python bench/solve_bench.py [--only SECTION,...]"
    write_atomic(args.out + ".md", markdown(sections, command))
    write_atomic(args.out + ".json", json.dumps(sections, indent=1) + "\n")
    print(f"wrote {args.out}.md and .json")


if __name__ == "__main__":
    main(sys.argv[1:])
