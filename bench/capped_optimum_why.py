"""Why the bound stays below the capped optimum (issue 39, deliverable 3, the research part): on a plan at or
near the optimum of a capped instance (bench/capped_optimum_rows.py), per rank: what each part of the
analytic bound (bounds/analytic.py) gives, where the plan idles (before the rank's first backward, between
its first backward and its last forward, after the last forward), and how its memory-time compares with the
one the memory-time bound assumes.

The memory-time bound says a rank's window lasts at least need / cap, where `need` sums over the rank's
activations their bytes times the shortest time they must stay (the longest dependency path from F's start to
B's and W's ends). On a plan, window = need * stretch / (fill * cap): `stretch` is how much longer than that
shortest time the plan holds its bytes (its memory-time integral over need), `fill` how full it keeps the cap
over its window (that integral over cap * window). The bound is off by stretch / fill.

    python bench/capped_optimum_why.py                # four plans: about 8 minutes
    python bench/capped_optimum_why.py --seconds 60   # every plan at 60 s

Writes results/capped_optimum_why.md; one run per row on a shared 2-core machine (load averages given).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capped_optimum_rows import QUANTUM_US, Instance, load, problem_of, quantized_profile  # noqa: E402
from results_common import RESULTS, log, write_text  # noqa: E402

from zbsearch.core.ir import Kind  # noqa: E402
from zbsearch.core.profile import load_profile  # noqa: E402
from zbsearch.search.bounds.analytic import RankBound, rank_bounds  # noqa: E402
from zbsearch.search.bounds.relaxations import bound_passes  # noqa: E402
from zbsearch.search.options import SearchOptions  # noqa: E402
from zbsearch.search.problem import Problem  # noqa: E402
from zbsearch.search.solve.driver import solve  # noqa: E402
from zbsearch.sim.simulate import Timeline  # noqa: E402

COMMAND = "python bench/capped_optimum_why.py"
# (instance, rounded times, solve's seconds): the study's rows (times rounded; seconds enough to reach the
# optimum there at a load of about 4), and issue 39's example itself (p=8, m=32, times as estimated).
ROWS = ((Instance("B", 3, 6, "v", "0.58p", "torch-runtime"), True, 120.0),
        (Instance("B", 4, 8, "v", "0.58p", "paper"), True, 300.0),
        (Instance("B", 4, 8, "v", "0.58p", "torch-runtime"), True, 300.0),
        (Instance("A", 8, 32, "v", "auto", "torch-runtime"), False, 120.0))


def idle_parts(tl: Timeline, r: int) -> tuple[float, float, float]:
    """The rank's idle time before its first backward, between it and its last forward's end, and after."""
    slots = tl.slots[r]
    first_b = min(s.start for s in slots if s.action.kind in (Kind.B, Kind.FULL_B))
    last_f = max(s.end for s in slots if s.action.kind is Kind.F)
    busy_before = sum(min(s.end, first_b) - s.start for s in slots if s.start < first_b)
    busy_after = sum(s.end - max(s.start, last_f) for s in slots if s.end > last_f)
    start, end = first_b - tl.first_start(r) - busy_before, tl.last_end(r) - last_f - busy_after
    middle = tl.last_end(r) - tl.first_start(r) - tl.work(r) - start - end
    return start, middle, end


def memory_time(tl: Timeline, r: int) -> float:
    """The integral of the rank's held activation bytes over time."""
    area, prev_t, prev_level = 0.0, 0.0, 0.0
    for t, level, _ in tl.memory[r]:
        area += prev_level * (t - prev_t)
        prev_t, prev_level = t, level
    return area


def rank_rows(problem: Problem, bounds: list[RankBound], tl: Timeline) -> list[dict[str, Any]]:
    out = []
    for b in bounds:
        r, cap = b.rank, problem.limit.per_rank[b.rank]
        window = tl.last_end(r) - tl.first_start(r)
        start, middle, end = idle_parts(tl, r)
        need = b.memory_time * cap  # the bound's bytes x shortest holds
        area = memory_time(tl, r)
        idle = b.start_idle + b.end_idle if b.disjoint else max(b.start_idle, b.end_idle)
        out.append({"rank": r, "bound end": b.end, "work": b.work, "work+idle": b.work + idle,
                    "memory-time": b.memory_time, "sequence": b.sequence, "nesting": b.nested,
                    "plan window": window, "idle start": start, "idle middle": middle, "idle end": end,
                    "stretch": area / need if need else math.nan, "fill": area / (cap * window)})
    return out


def measure(inst: Instance, rounded: bool, seconds: float, tmp: Path) -> dict[str, Any]:
    path = quantized_profile(inst.p, inst.m, tmp / f"p{inst.p}m{inst.m}.json", QUANTUM_US if rounded else None)
    problem = problem_of(load_profile(str(path)), inst)
    bounds = rank_bounds(problem, bound_passes(problem))
    before, t0 = load(), time.monotonic()
    result = solve(problem, SearchOptions(time_limit=seconds))
    return {"label": inst.label + ("" if rounded else ", times not rounded"), "plan": result.objective,
            "status": result.status.value, "bound": result.lower_bound, "seconds": round(time.monotonic() - t0, 1),
            "load": f"{before}/{load()}", "ranks": rank_rows(problem, bounds, result.timeline)}


def markdown(rows: list[dict[str, Any]], seconds: float | None) -> str:
    lines = ["# Why the bound stays below the capped optimum\n",
             f"Regenerate: `{COMMAND}{'' if seconds is None else f' --seconds {seconds:g}'}`. " + " ".join(
                 (__doc__ or "").split("\n\n")[1].split()) + " Times in us.\n"]
    keys = ("rank", "bound end", "work", "work+idle", "memory-time", "sequence", "nesting", "plan window", "idle start",
            "idle middle", "idle end", "stretch", "fill")
    for row in rows:
        lines += [f"## {row['label']}\n",
                  f"Plan {row['plan']:,.0f} ({row['status']}, solve {row['seconds']} s, load {row['load']}); "
                  f"solve's bound {row['bound']:,.0f}.\n",
                  "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for rk in row["ranks"]:
            lines.append("| " + " | ".join(f"{rk[k]:.2f}" if k in ("stretch", "fill") else f"{rk[k]:,.0f}"
                                            for k in keys) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, help="solve's time limit for every plan (default: per row, ROWS)")
    args = ap.parse_args()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for inst, rounded, seconds in ROWS:
            out.append(measure(inst, rounded, args.seconds or seconds, Path(tmp)))
            log(f"{out[-1]['label']}: plan {out[-1]['plan']:.0f} bound {out[-1]['bound']:.0f}")
            write_text(RESULTS / "capped_optimum_why.md", markdown(out, args.seconds))


if __name__ == "__main__":
    main()
