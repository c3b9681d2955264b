"""Where memory binds, which side is weak: the plan or the bound? (issue 39, deliverable 3.)

On instances small enough for CP-SAT to prove the optimum (bench/capped_optimum_rows.py builds them: the
example's layer shape, four layers per rank, times rounded to 100 us), per instance and memory accounting:
(a) the proven optimum (solve() for up to --proof-limit seconds on the one problem: split balanced, one
placement), (b) the lower bound `zbsearch solve` reports at its default time limit, and the analytic bound it
starts from (at p=8, m=32 CP-SAT proves nothing, so the analytic bound is all the user gets), (c) the plan
`zbsearch solve --partition balanced --placement PLACEMENT --mem-limit CAP` finds at the default time limit.

Two families of caps:
- A: `--mem-limit auto` on the example's GPU: with four layers per rank as in the example, each rank holds the
  same static bytes and activations as the example's, so the cap is the same multiple of one microbatch's
  activations per rank (the example's 3.52-5.13 on V at p=4; 2.8-6.0 over all these rows).
- B: the example's cap as a multiple of p: its typical rank's (4.64 microbatches at p=8, 0.58p), so memory
  binds about as hard relative to the pipeline's depth.

    python bench/capped_optimum.py                       # every row: 42 minutes on a shared 2-core machine
    python bench/capped_optimum.py --family A --p 2,3    # some rows
    python bench/capped_optimum.py --proof-limit 300
    python bench/capped_optimum.py --family B --p 4 --m 8 --accounting paper --proof-limit 900 --merge

Writes results/capped_optimum.md, results/capped_optimum.csv and (the `--placement auto` rows)
results/capped_optimum_auto.csv after every row; `--merge` replaces the rows it measures and keeps the others, and
every rerun keeps the written findings (FINDINGS onwards). One run per row, on a shared machine: the load
average before/after each timed solve is given.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capped_optimum_rows import (DEFAULT, Instance, at_default, load, measure, problem_of,  # noqa: E402
                                 quantized_profile, cap_ratios)
from results_common import RESULTS, log, read_csv, write_csv, write_text  # noqa: E402

from zbsearch.core.profile import load_profile  # noqa: E402

COMMAND = "python bench/capped_optimum.py"
ACCOUNTINGS = ("torch-runtime", "paper")
FAMILY_B_LIMIT = "0.58p"
SIZES = {"A": ((2, 4), (2, 6), (3, 6), (3, 9), (4, 8), (4, 12)),
         "B": ((3, 6), (3, 9), (4, 8), (4, 12))}
# The written findings: a rerun keeps what follows this heading in the old file.
FINDINGS = "## What it says"
PLACEMENTS = {"A": ("v", "linear"), "B": ("v",)}
COLUMNS = ("family", "p", "m", "layers", "placement", "split", "cap", "cap_ratio_min", "cap_ratio_max", "accounting",
           "optimum_us", "proof_status", "proof_bound_us", "proof_s", "proof_cpsat", "proof_start", "proof_start_us",
           "uncapped_us", "uncapped_status", "analytic_bound_us", "analytic_binds", "bound_us", "solve_us",
           "solve_status", "solve_placement", "solve_phase", "solve_start_us", "solve_s", "gap_bound",
           "gap_analytic", "gap_solve", "cap_cost", "proof_load", "solve_load", "proof_limit_s", "row_s")


def instances(families: list[str], ps: list[int]) -> list[Instance]:
    out = []
    for fam in families:
        for p, m in SIZES[fam]:
            if p in ps:
                for acct in ACCOUNTINGS:
                    for pl in PLACEMENTS[fam]:
                        out.append(Instance(fam, p, m, pl, "auto" if fam == "A" else FAMILY_B_LIMIT, acct))
    return out


def example_ratios(tmp: Path) -> str:
    """The example's cap over one microbatch's activations per rank (p=8, m=32, balanced, V, auto), rounded
    times (the ratio is of bytes, which rounding leaves alone)."""
    prof = load_profile(str(quantized_profile(8, 32, tmp / "example.json")))
    out = []
    for acct in ACCOUNTINGS:
        ratios = cap_ratios(problem_of(prof, Instance("A", 8, 32, "v", "auto", acct)))
        out.append(f"{acct}: " + ", ".join(f"{r:.2f}" for r in ratios))
    return "; ".join(out)


def auto_row(path: Path, inst: Instance, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`--placement auto` (linear and V, the time shared) against the better placement's optimum (`rows`: the
    instance's rows, one per placement)."""
    best = min(rows, key=lambda r: r["optimum_us"])
    got = at_default(load_profile(str(path)), inst, "auto")
    opt = best["optimum_us"]
    return {"family": inst.family, "p": inst.p, "m": inst.m, "accounting": inst.memory_model,
            "optimum_us": opt, "optimum_placement": best["placement"],
            "proven": all(r["proof_status"] == "optimal" for r in rows), **got,
            "gap_bound": (opt - got["bound_us"]) / opt, "gap_solve": (got["solve_us"] - opt) / opt}


def pct(x: float) -> str:
    return f"{x:.1%}"


def optimum_cell(r: dict[str, Any]) -> str:
    if r["proof_status"] == "optimal":
        return f"{r['optimum_us']:,.0f} ({r['proof_s']:.0f} s, optimal)"
    return f"<= {r['optimum_us']:,.0f}, >= {r['proof_bound_us']:,.0f} ({r['proof_s']:.0f} s, not proven)"


def table(rows: list[dict[str, Any]]) -> list[str]:
    """Where the optimum is not proven, the best plan found stands for it: the bound's gap is then at most
    the one shown and solve's at least."""
    lines = ["| fam | p | m | placement (split) | cap (x one mb's act.) | accounting | optimum us (proof s, status) | "
             "uncapped us (cap costs) | analytic bound us | bound us | solve@default us | (opt-bound)/opt | "
             "(opt-analytic)/opt | (solve-opt)/opt | solve phase | load proof / solve |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        le, ge = ("", "") if r["proof_status"] == "optimal" else ("<= ", ">= ")
        lines.append(
            f"| {r['family']} | {r['p']} | {r['m']} | {r['placement']} ({r['split']}) | {r['cap']} "
            f"({r['cap_ratio_min']:.2f}-{r['cap_ratio_max']:.2f}) | {r['accounting']} | {optimum_cell(r)} | "
            f"{r['uncapped_us']:,.0f} ({le}+{pct(r['cap_cost'])}) | {r['analytic_bound_us']:,.0f} | {r['bound_us']:,.0f} | "
            f"{r['solve_us']:,.0f} | {le}{pct(r['gap_bound'])} | {le}{pct(r['gap_analytic'])} | {ge}{pct(r['gap_solve'])} | "
            f"{r['solve_phase']} | {r['proof_load']} / {r['solve_load']} |")
    return lines


def auto_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| fam | p | m | accounting | best optimum us (placement) | solve@default us (placement) | bound us | "
             "(opt-bound)/opt | (solve-opt)/opt | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        proven = "" if r["proven"] else ", not proven"
        lines.append(f"| {r['family']} | {r['p']} | {r['m']} | {r['accounting']} | {r['optimum_us']:,.0f} "
                     f"({r['optimum_placement']}{proven}) | {r['solve_us']:,.0f} ({r['solve_placement']}) | "
                     f"{r['bound_us']:,.0f} | {pct(r['gap_bound'])} | {pct(r['gap_solve'])} | {r['solve_load']} |")
    return lines


def markdown(rows: list[dict[str, Any]], autos: list[dict[str, Any]], meta: dict[str, Any], text: str) -> str:
    head = [
        "# Where memory binds: the plan or the bound? (issue 39, deliverable 3)\n",
        f"Regenerate: `{COMMAND}` (about {minutes(rows, autos):.0f} minutes of solving on a shared 2-core machine; "
        "load averages (1 min) before/after each timed solve in the last column; `--merge` with `--family`, `--p`, "
        "`--m`, `--accounting` reruns some rows). One run per row: under load, CP-SAT proves less in the same "
        "time.\n",
        "Instances: `zbsearch profile --estimate --gpu h100 --mfu 0.4 --layers 4p --hidden 4096 --heads 32 --seq 4096 "
        "--micro-batch 1 --vocab 128256 -p P -m M`, the example's shape with four layers per rank as there, every "
        "time rounded to 100 us so that CP-SAT can prove optima; split `balanced`. Family A: `--mem-limit auto` "
        "(the example's bytes per rank, so the same cap per microbatch of activations); family B: "
        f"`--mem-limit {FAMILY_B_LIMIT}` (the example's typical rank, 4.64 microbatches at p=8, as a multiple of p). "
        f"The example's own ratios per rank (p=8, V): {meta['example']}.\n",
        "Columns: cap (x one mb's act.): the per-rank activation cap over the mem_B of the rank's chunks, least and "
        "most over ranks; optimum: solve() on the one problem for up to its proof limit (CSV; 600 s unless "
        "rerun), optimal where CP-SAT proved it on the exact grid, else the best plan and bound found; uncapped: the same without "
        "the cap; analytic bound: the rank bounds solve() starts from (bounds/analytic.py), what a user gets where "
        "CP-SAT proves nothing (p=8, m=32); bound and solve@default: `zbsearch solve --partition balanced "
        f"--placement PLACEMENT --mem-limit CAP --memory-model ACCOUNTING` at the default {DEFAULT.time_limit:g} s; "
        "solve phase: where its plan came from.\n",
    ]
    body = table(rows)
    if autos:
        body += ["", "`--placement auto` (linear and V share the time, as in the example) against the better "
                 "placement's optimum:", ""] + auto_table(autos)
    return "\n".join(head + body) + "\n" + (f"\n{text.rstrip()}\n" if text else "")


def minutes(rows: list[dict[str, Any]], autos: list[dict[str, Any]]) -> float:
    return (sum(r["row_s"] for r in rows) + sum(r["solve_s"] for r in autos)) / 60


def write(rows: list[dict[str, Any]], autos: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    old = RESULTS / "capped_optimum.md"
    text = old.read_text().split(FINDINGS, 1) if old.exists() else []
    write_text(RESULTS / "capped_optimum.md", markdown(rows, autos, meta, FINDINGS + text[1] if len(text) > 1 else ""))
    write_csv(RESULTS / "capped_optimum.csv", COMMAND, rows, COLUMNS)
    if autos:
        write_csv(RESULTS / "capped_optimum_auto.csv", COMMAND, autos, list(autos[0]))


KEY = ("family", "p", "m", "placement", "accounting")
AUTO_KEY = ("family", "p", "m", "accounting")


def typed(record: dict[str, str]) -> dict[str, Any]:
    """A CSV record back as the row it was written from: numbers as numbers, True/False as booleans."""
    out: dict[str, Any] = {}
    for key, text in record.items():
        value: Any = text
        if text in ("True", "False"):
            value = text == "True"
        else:
            try:
                value = int(text) if text.isdigit() else float(text)
            except ValueError:
                pass
        out[key] = value
    return out


def previous(name: str) -> list[dict[str, Any]]:
    path = RESULTS / name
    rows = [typed(r) for r in read_csv(path)] if path.exists() else []
    for r in rows:  # written before these columns were
        r.setdefault("proof_limit_s", 600.0)
        r.setdefault("row_s", r.get("proof_s", 0.0) + r.get("solve_s", 0.0))
    return rows


def merged(old: list[dict[str, Any]], new: list[dict[str, Any]], key: tuple[str, ...]) -> list[dict[str, Any]]:
    """The old rows with those the new ones measure again replaced, in the old order, then the new rows."""
    fresh = {tuple(r[k] for k in key): r for r in new}
    kept = [fresh.pop(tuple(r[k] for k in key), r) for r in old]
    return kept + list(fresh.values())


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="A,B", help="comma list of A, B")
    ap.add_argument("--p", default="2,3,4", help="comma list of rank counts")
    ap.add_argument("--m", default="", help="comma list of microbatch counts (default: every size of the family)")
    ap.add_argument("--accounting", default=",".join(ACCOUNTINGS), help="comma list of torch-runtime, paper")
    ap.add_argument("--proof-limit", type=float, default=600.0, help="seconds for each proof")
    ap.add_argument("--no-auto", action="store_true", help="skip the --placement auto rows")
    ap.add_argument("--merge", action="store_true", help="replace these rows in the results, keep the others")
    return ap.parse_args()


def main() -> None:
    args = parse()
    todo = [i for i in instances(args.family.split(","), [int(x) for x in args.p.split(",")])
            if (not args.m or str(i.m) in args.m.split(",")) and i.memory_model in args.accounting.split(",")]
    old_rows = previous("capped_optimum.csv") if args.merge else []
    old_autos = previous("capped_optimum_auto.csv") if args.merge else []
    rows: list[dict[str, Any]] = []
    autos: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        meta = {"example": example_ratios(Path(tmp))}
        for k, inst in enumerate(todo):
            t0 = time.monotonic()
            path = quantized_profile(inst.p, inst.m, Path(tmp) / f"p{inst.p}m{inst.m}.json")
            rows.append({**measure(path, inst, args.proof_limit), "proof_limit_s": args.proof_limit,
                         "row_s": round(time.monotonic() - t0, 1)})
            log(f"[{k + 1}/{len(todo)}] {inst.label}: {rows[-1]} (load {load()})")
            every = merged(old_rows, rows, KEY)
            group = [r for r in every if tuple(r[x] for x in AUTO_KEY) == (inst.family, inst.p, inst.m, inst.memory_model)]
            if not args.no_auto and len(group) == len(PLACEMENTS[inst.family]) > 1 and \
                    (k + 1 == len(todo) or todo[k + 1].memory_model != inst.memory_model or todo[k + 1].m != inst.m):
                autos.append(auto_row(path, inst, group))
                log(f"auto: {autos[-1]}")
            write(every, merged(old_autos, autos, AUTO_KEY), meta)


if __name__ == "__main__":
    main()
