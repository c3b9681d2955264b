"""The partition study: how much choosing the layer split (with the placement and the schedule) gains
over the splits users write by hand, on estimated H100 profiles of real model shapes.

    python bench/partition_study.py                     # every row, about 25 minutes on 2 cores
    python bench/partition_study.py --only llama3-8b    # rows of some models
    python bench/partition_study.py --time-limit 80     # seconds of the joint search per row (default 80)
    python bench/partition_study.py --memory-model paper   # the Zero Bubble paper's accounting (before issue 28)

Writes results/partition_study.{md,csv,png,svg} under torch's runtime accounting (every estimate's default since
issue 28), results/partition_study_paper.* under the paper's. Profiles are estimates (FLOP counts and bytes over an
H100's datasheet peak at 40% MFU, see each profile's `source`), not measurements. Each model runs at two
whole-rank byte caps: `auto` (80 GB less an 8% headroom) and a tight one that the time-balanced split
with 1F1B does not fit on rank 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from partition_rows import GiB, Plan, handcrafted, searched, tight_cap  # noqa: E402
from results_common import RESULTS, log, read_csv, save_figure, write_csv, write_text  # noqa: E402
from zbsearch.core.memory import byte_cap  # noqa: E402
from zbsearch.profiling.build import profile_estimate  # noqa: E402
from zbsearch.profiling.request import PipelineSetup, StageSplit  # noqa: E402

ROWS = (("llama3-8b", 4), ("llama3-8b", 8), ("gpt3-2.7b", 8), ("gemma2-2b", 4), ("gemma2-2b", 8),
        ("deepseek-v2-lite", 8))
COMMAND = "python bench/partition_study.py"
# The issue allows a row 120 s: the joint search gets 80 s, the solve of the balanced split 30 s, and the
# handcrafted columns take a few seconds.
JOINT_SECONDS = 80.0
ACCOUNTING = {"torch-runtime": "what torch's runtime holds: everything saved for B plus the gradients I stores "
                               "for W, held from I until W; every estimate's default since issue 28",
              "paper": "the Zero Bubble paper's M_B and M_W, the study's first version"}
BALANCED_SECONDS = 30.0
COLUMNS = ("model", "p", "m", "cap_gib", "column", "schedule", "placement", "layers_per_chunk", "iteration_ms",
           "gap_to_any_split_bound", "imbalance", "peak_gib", "peak_gib_per_rank", "fits", "seconds", "note")


def study_profile(model: str, p: int, memory_model: str = "torch-runtime") -> Any:
    """The estimated H100 profile of a preset at p stages, m = 4p microbatches of one sequence, under
    `memory_model`: torch-runtime (what plans on torch hold, every estimate's default) or paper (the Zero
    Bubble paper's accounting, the study's first version)."""
    return profile_estimate(model, "h100", StageSplit(stages=p), PipelineSetup(microbatches=4 * p),
                            memory_model=memory_model)


def run_row(model: str, p: int, cap: str, time_limit: float, memory_model: str) -> list[Plan]:
    prof = study_profile(model, p, memory_model)
    t0 = time.monotonic()
    plans = [handcrafted(prof, p, cap, "even"), handcrafted(prof, p, cap, "balanced"),
             searched(prof, p, cap, "balanced", BALANCED_SECONDS), searched(prof, p, cap, "auto", time_limit)]
    bound = plans[-1].extra.get("any_split_bound")
    for plan in plans:
        plan.extra["bound"] = bound
    seconds = plans[-1].extra["row_seconds"] = time.monotonic() - t0
    log(f"{model} p={p} cap {cap}: " + "; ".join(f"{pl.label} {pl.time / 1e3:.1f} ms" for pl in plans)
        + f" ({seconds:.0f} s)")
    return plans


def record(model: str, p: int, m: int, cap_gib: float, plan: Plan) -> dict[str, Any]:
    bound = plan.extra.get("bound")
    gap = (plan.time - bound) / plan.time if bound and plan.fits else None
    return {"model": model, "p": p, "m": m, "cap_gib": round(cap_gib, 1), "column": plan.label,
            "schedule": plan.schedule, "placement": plan.placement,
            "layers_per_chunk": ",".join(map(str, plan.counts)),
            "iteration_ms": round(plan.time / 1e3, 2) if plan.fits else "",
            "gap_to_any_split_bound": round(gap, 4) if gap is not None else "",
            "imbalance": round(plan.extra["imbalance"], 4) if "imbalance" in plan.extra else "",
            "peak_gib": round(plan.peak / GiB, 1) if plan.peak_per_rank else "",
            "peak_gib_per_rank": " ".join(f"{x / GiB:.1f}" for x in plan.peak_per_rank),
            "fits": "yes" if plan.fits else "no", "seconds": round(plan.seconds, 1), "note": plan.note}


def markdown(records: list[dict[str, Any]], args: argparse.Namespace, notes: list[str]) -> str:
    lines = [
        "# Partition study: choosing the layer split with the schedule", "",
        f"Regenerate: `{COMMAND}{'' if args.time_limit == JOINT_SECONDS else f' --time-limit {args.time_limit:g}'}"
        f"{'' if args.memory_model == 'torch-runtime' else ' --memory-model paper'}` "
        f"(joint search {args.time_limit:g} s per row, balanced + zbsearch {BALANCED_SECONDS:g} s; one run, 2 cores).", "",
        f"Memory accounting: {args.memory_model} ({ACCOUNTING[args.memory_model]}). "
        "Estimated H100 profiles (FLOP counts over the datasheet peak at 40% MFU; not measured), m = 4p, "
        "one sequence per microbatch, bf16, Adam (16 bytes per parameter). Caps are whole-rank: static bytes "
        "plus peak activations. `gap` is (iteration - bound) / iteration against the lower bound that holds "
        "for every split on the linear and V-shape placements; `imbalance` is 1 - mean rank work / the busiest "
        "rank's, the bubble the split alone forces (whole layers set its floor).", "",
        "| model | p | cap GiB | column | schedule (placement) | layers per chunk | iteration ms | gap | "
        "imbalance | peak GiB | fits |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        sched = f"{r['schedule']} ({r['placement']})" if r["schedule"] != "-" else r["note"] or "-"
        gap = f"{100 * r['gap_to_any_split_bound']:.2f}%" if r["gap_to_any_split_bound"] != "" else "-"
        imb = f"{100 * r['imbalance']:.2f}%" if r["imbalance"] != "" else "-"
        lines.append(f"| {r['model']} | {r['p']} | {r['cap_gib']} | {r['column']} | {sched} | "
                     f"{r['layers_per_chunk'] or '-'} | {r['iteration_ms'] or '-'} | {gap} | {imb} | "
                     f"{r['peak_gib'] or '-'} | {r['fits']} |")
    return "\n".join(lines + notes) + "\n"


def _best_found(by: dict[str, Any], weakest: str, joint: Plan) -> str:
    """Where the bound is another placement's, the best plan found there: far above its bound, that
    placement's plans or its bound are weak, and the gap says which placement to look at."""
    if weakest == "-" or weakest == joint.placement or "best_found" not in by[weakest]:
        return ""
    found = by[weakest]["best_found"]
    if found == float("inf"):
        return f"; no {weakest} plan fits"
    return f"; the best {weakest} plan found is {found / 1e3:.1f} ms against its bound {by[weakest]['bound'] / 1e3:.1f} ms"


def findings(rows: list[tuple[str, int, float, list[Plan]]]) -> list[str]:
    """What the rows show against the issue's targets, one line per row."""
    out = ["", "## Findings, row by row", ""]
    for model, p, cap_gib, plans in rows:
        joint, others = plans[-1], [pl for pl in plans[:-1] if pl.fits]
        best = min(others, key=lambda pl: pl.time, default=None)
        line = f"- {model}, p={p}, {cap_gib:.1f} GiB: "
        if not joint.fits:
            out.append(line + f"joint search found no plan ({joint.note}).")
            continue
        if best is None:
            line += "no other column fits; "
        else:
            margin = (best.time - joint.time) / best.time
            line += f"joint {joint.time / 1e3:.1f} ms vs best other ({best.label}) {best.time / 1e3:.1f} ms: {margin:+.2%}; "
        balanced = plans[1]
        if not balanced.fits or balanced.placement == "-":
            line += "the balanced split with handcrafted schedules does not fit; "
        gap = (joint.time - joint.extra["bound"]) / joint.time
        by = joint.extra.get("by_placement", {})
        weakest = min(by, key=lambda k: by[k]["bound"]) if by else "-"
        line += (f"gap {gap:.2%} to the bound over every split (set by the {weakest} placement's bound"
                 f"{'' if not by or by[weakest]['walk_complete'] else ', whose split walk ran out of time'}"
                 f"{_best_found(by, weakest, joint)}); "
                 f"imbalance of the plan's split {joint.extra['imbalance']:.2%}; joint search {joint.seconds:.0f} s, "
                 f"the whole row {joint.extra['row_seconds']:.0f} s.")
        out.append(line)
    return out


def figure(records: list[dict[str, Any]], stem: Path) -> None:
    """Each column's iteration time over the row's bound over every split (1 = provably the best plan
    of any split; missing bars: nothing fits the cap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys((r["model"], r["p"], r["cap_gib"]) for r in records))
    columns = list(dict.fromkeys(r["column"] for r in records))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(columns)
    for k, col in enumerate(columns):
        xs, ys = [], []
        for i, row in enumerate(rows):
            hit = [r for r in records if (r["model"], r["p"], r["cap_gib"]) == row and r["column"] == col]
            if hit and hit[0]["gap_to_any_split_bound"] not in ("", None):
                xs.append(i + k * width)
                ys.append(1 / (1 - float(hit[0]["gap_to_any_split_bound"])))
        ax.bar(xs, ys, width, label=col)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax.set_xticklabels([f"{m}\np={p}, {c:g} GiB" for m, p, c in rows], fontsize=7)
    ax.set_ylabel("iteration time / bound over every split")
    ax.set_ylim(bottom=0.9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, stem)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--time-limit", type=float, default=JOINT_SECONDS, help="seconds of the joint search per row")
    ap.add_argument("--memory-model", choices=tuple(ACCOUNTING), default="torch-runtime",
                    help="the memory accounting (default torch-runtime, as every estimate)")
    ap.add_argument("--figure-only", action="store_true", help="redraw the figure from results/partition_study.csv")
    args = ap.parse_args(argv)
    if args.figure_only:
        rows_read: list[dict[str, Any]] = list(read_csv(RESULTS / "partition_study.csv"))
        for r in rows_read:
            r["p"], r["cap_gib"] = int(r["p"]), float(r["cap_gib"])
        figure(rows_read, RESULTS / "partition_study")
        return
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    records, rows = [], []
    for model, p in ROWS:
        if wanted and model not in wanted:
            continue
        prof = study_profile(model, p, args.memory_model)
        auto_gib = byte_cap("auto", prof) / GiB
        for cap_gib in (auto_gib, min(auto_gib - 1, tight_cap(prof, p))):
            cap = "auto" if cap_gib == auto_gib else f"{cap_gib:g}GiB"
            plans = run_row(model, p, cap, args.time_limit, args.memory_model)
            rows.append((model, p, cap_gib, plans))
            records += [record(model, p, prof.microbatches, cap_gib, plan) for plan in plans]
    RESULTS.mkdir(exist_ok=True)
    stem = "partition_study" + ("" if args.memory_model == "torch-runtime" else "_paper")
    write_csv(RESULTS / f"{stem}.csv", COMMAND, records, COLUMNS)
    write_text(RESULTS / f"{stem}.md", markdown(records, args, findings(rows)))
    figure(records, RESULTS / stem)


if __name__ == "__main__":
    main(sys.argv[1:])
