"""Two ranks kept whole: how far the capped bound rises (issue 39, deliverable 3's research part).

results/capped_optimum.md found the bound the weak side where memory binds hard (family B, 0.58p): the
analytic bound 6-13% below proven optima. This script bounds the same instances with
zbsearch.search.exact.rank_subset: the problem with the one-at-a-time rule and the memory limit kept on two
ranks only (rank 0 and each other rank in turn), every other rank a pure delay, solved by CP-SAT for up to
--limit seconds per pair. The best pair's bound is valid for the whole problem; it is compared with the proven
optimum and the analytic bound results/capped_optimum.csv recorded for the row.

    python bench/capped_pair_bound.py                  # family B's rows: about 20 minutes
    python bench/capped_pair_bound.py --p 3 --limit 30
    python bench/capped_pair_bound.py --solve-only       # keep the pair columns, rerun `solve` (4 minutes)

Writes results/capped_pair_bound.md and .csv. One run per row on a shared 2-core machine (one CP-SAT worker):
a pair not proven in its limit gives the bound CP-SAT had reached, still valid.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capped_optimum_rows import Instance, at_default, load, problem_of, quantized_profile  # noqa: E402
from results_common import RESULTS, log, read_csv, write_csv, write_text  # noqa: E402

from zbsearch.core.profile import load_profile  # noqa: E402
from zbsearch.search.exact.rank_subset import subset_bound  # noqa: E402

COMMAND = "python bench/capped_pair_bound.py"
FINDINGS = "## What it says"  # a rerun keeps what follows this heading in the old file
STEP_US = 100.0  # the instances' times are whole multiples of it (capped_optimum_rows.QUANTUM_US)
COLUMNS = ("p", "m", "accounting", "optimum_us", "optimum_proven", "analytic_us", "pair_us", "pair", "pair_proven",
           "pairs", "gap_analytic", "gap_pair", "seconds", "load", "solve_bound_before_us", "solve_bound_us",
           "solve_before_us", "solve_us", "solve_pair", "solve_load")


def rows(ps: list[int]) -> list[dict[str, str]]:
    """Family B's rows of results/capped_optimum.csv (V, 0.58p), at the given p."""
    return [r for r in read_csv(RESULTS / "capped_optimum.csv") if r["family"] == "B" and int(r["p"]) in ps]


def measure(row: dict[str, str], tmp: Path, limit: float, kept: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row: the pairs' bounds (or `kept`, those of an earlier run) and `solve` at the default time."""
    p, m, acct = int(row["p"]), int(row["m"]), row["accounting"]
    profile = quantized_profile(p, m, tmp / f"p{p}_m{m}.json")
    if kept is not None:
        solved = at_default(load_profile(str(profile)), Instance("B", p, m, "v", row["cap"], acct), "v")
        return {**kept, **_solve_columns(row, solved, solved.pop("pair_bound", None))}
    problem = problem_of(load_profile(str(profile)), Instance("B", p, m, "v", row["cap"], acct))
    t0, before = time.monotonic(), load()
    found = [subset_bound(problem, (0, r), limit, STEP_US) for r in range(1, p)]
    best = max(found, key=lambda b: b.value)
    optimum, analytic = float(row["optimum_us"]), float(row["analytic_bound_us"])
    proven = row["proof_status"] == "optimal"
    log(f"p={p} m={m} {acct}: pairs {[(b.kept, b.value, b.proven) for b in found]}")
    solved = at_default(load_profile(str(profile)), Instance("B", p, m, "v", row["cap"], acct), "v")
    pair_ran = solved.pop("pair_bound", None)
    return {**_solve_columns(row, solved, pair_ran),"p": p, "m": m, "accounting": acct, "optimum_us": optimum, "optimum_proven": proven,
            "analytic_us": analytic, "pair_us": best.value, "pair": "+".join(map(str, best.kept)),
            "pair_proven": best.proven, "pairs": "; ".join(f"{b.kept[1]}: {b.value:,.0f}{'' if b.proven else '+'}"
                                                           for b in found),
            "gap_analytic": (optimum - analytic) / optimum, "gap_pair": (optimum - max(best.value, analytic)) / optimum,
            "seconds": round(time.monotonic() - t0, 1), "load": f"{before}/{load()}"}


def _solve_columns(row: dict[str, str], solved: dict[str, Any], pair_ran: Any) -> dict[str, Any]:
    """`zbsearch solve` at the default time limit now (its pair phase, solve/pair_phase.py, included) beside
    what results/capped_optimum.csv recorded before that phase."""
    return {"solve_bound_before_us": float(row["bound_us"]), "solve_bound_us": solved["bound_us"],
            "solve_before_us": float(row["solve_us"]), "solve_us": solved["solve_us"],
            "solve_pair": "-" if pair_ran is None else f"{pair_ran.value:,.0f} (0+{pair_ran.kept[1]}"
                          f"{'' if pair_ran.proven else ', not proven'}, {pair_ran.seconds:.1f} s)",
            "solve_load": solved["solve_load"]}


def _findings() -> str:
    """The written findings of the file being replaced (from FINDINGS on), empty where there are none."""
    path = RESULTS / "capped_pair_bound.md"
    text = path.read_text() if path.exists() else ""
    return "\n" + text[text.index(FINDINGS):] if FINDINGS in text else ""


def _typed(record: dict[str, str]) -> dict[str, Any]:
    """A row of the CSV with its numbers and flags read back as the report needs them."""
    out: dict[str, Any] = dict(record)
    for key in ("p", "m"):
        out[key] = int(record[key])
    for key in ("optimum_us", "analytic_us", "pair_us", "gap_analytic", "gap_pair"):
        out[key] = float(record[key])
    for key in ("optimum_proven", "pair_proven"):
        out[key] = record[key] == "True"
    return out


def report(records: list[dict[str, Any]], limit: float) -> str:
    lines = ["# Two ranks kept whole: the capped bound (issue 39, deliverable 3)", "",
             f"Regenerate: `{COMMAND}` (CP-SAT, one worker, up to {limit:g} s per pair, on a shared 2-core machine; "
             "load averages before/after each row in the last column). Instances: results/capped_optimum.md's family B "
             "(V, balanced split, `--mem-limit 0.58p`, times rounded to 100 us), its proven optimum (or best plan, "
             "where not proven) and the analytic bound `solve` reports there. Pair bound: the problem with the "
             "one-at-a-time rule and the limit kept on rank 0 and rank r only (zbsearch/search/exact/rank_subset.py), "
             "the best over r; per r its bound, `+` where CP-SAT had not proven it in the limit (still a bound).", "",
             "| p | m | accounting | optimum us | analytic bound us | pair bound us (ranks) | per r | "
             "(opt-analytic)/opt | (opt-max)/opt | seconds | load |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        opt = f"{r['optimum_us']:,.0f}" + ("" if r["optimum_proven"] else " (best found, not proven)")
        lines.append(f"| {r['p']} | {r['m']} | {r['accounting']} | {opt} | {r['analytic_us']:,.0f} | "
                     f"{r['pair_us']:,.0f} ({r['pair']}{'' if r['pair_proven'] else ', not proven'}) | {r['pairs']} | "
                     f"{r['gap_analytic']:.1%} | {r['gap_pair']:.1%} | {r['seconds']} | {r['load']} |")
    lines += ["", "`zbsearch solve --partition balanced --placement v --mem-limit 0.58p` at the default time limit "
              "(30 s), before the pair phase (results/capped_optimum.csv's bound and plan) and with it "
              "(solve/pair_phase.py: up to 20% of the limit, pairs of rank 0 with p-1, then 1, then the others):", "",
              "| p | m | accounting | optimum us | bound before | bound now | pair phase | (opt-bound)/opt before | "
              "now | plan before | plan now | load |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        opt = r["optimum_us"]
        lines.append(f"| {r['p']} | {r['m']} | {r['accounting']} | {opt:,.0f} | {r['solve_bound_before_us']:,.0f} | "
                     f"{r['solve_bound_us']:,.0f} | {r['solve_pair']} | {(opt - r['solve_bound_before_us']) / opt:.1%} | "
                     f"{(opt - r['solve_bound_us']) / opt:.1%} | {r['solve_before_us']:,.0f} | {r['solve_us']:,.0f} | "
                     f"{r['solve_load']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--p", default="3,4", help="pipeline degrees of family B to run, e.g. 3,4")
    parser.add_argument("--limit", type=float, default=60.0, help="CP-SAT seconds per pair")
    parser.add_argument("--solve-only", action="store_true", help="keep the pair columns of the CSV, rerun solve")
    args = parser.parse_args()
    earlier = {(r["p"], r["m"], r["accounting"]): _typed(r) for r in read_csv(RESULTS / "capped_pair_bound.csv")} \
        if args.solve_only else {}
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows([int(x) for x in args.p.split(",")]):
            kept = earlier.get((row["p"], row["m"], row["accounting"])) if args.solve_only else None
            records.append(measure(row, Path(tmp), args.limit, kept))
            write_csv(RESULTS / "capped_pair_bound.csv", COMMAND, records, COLUMNS)
            write_text(RESULTS / "capped_pair_bound.md", report(records, args.limit) + _findings())


if __name__ == "__main__":
    main()
