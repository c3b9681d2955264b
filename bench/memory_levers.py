"""The memory-levers study: what choosing activation recompute (per layer, rank and microbatch) with the
split, the placement and the schedule gains over no recompute and over recomputing every block, on
estimated H100 profiles of real model shapes, under torch's runtime accounting, with and without FSDP.

    python bench/memory_levers.py                      # every row, about 30 minutes on 2 cores
    python bench/memory_levers.py --only llama3-8b     # rows of some models
    python bench/memory_levers.py --from-csv           # rewrite the report and figure from the CSV

Writes results/memory_levers.{md,csv,png,svg}. Profiles are estimates (FLOP counts and bytes over an
H100's datasheet peak at 40% MFU, see each profile's `source`), not measurements. Caps are whole-rank
byte caps (static bytes plus activations): the partition study's tight ones, two where nothing fits
without recompute, each with static bytes whole and sharded FSDP over 8 data-parallel ranks, and the
partition study's deepseek-v2-lite row again under its own (the paper's) accounting.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_levers_rows import COLUMNS, Row, record, run_row, study_profile  # noqa: E402
from results_common import RESULTS, log, read_csv, save_figure, write_csv, write_text  # noqa: E402

TIGHT = (("llama3-8b", 4, 61), ("llama3-8b", 8, 49), ("gpt3-2.7b", 8, 10), ("gemma2-2b", 4, 25),
         ("deepseek-v2-lite", 8, 42))
NO_FIT = (("llama3-8b", 8, 36), ("deepseek-v2-lite", 8, 36))
ROWS = tuple(Row(model, p, cap, shard) for shard in (None, 8) for model, p, cap in TIGHT + NO_FIT) + \
    (Row("deepseek-v2-lite", 8, 42, None, "paper"),)
COMMAND = "python bench/memory_levers.py"
# A row's 120 s: each joint search (columns 1 and 4) 25 s, each walk (5 and 6, from those two) 25 s, the
# handcrafted columns a few seconds, and 15 s for the plan without recompute under the device's memory.
JOINT_SECONDS = 25.0
WALK_SECONDS = 25.0
ROOMY_SECONDS = 15.0
TARGET_MS = {Row("deepseek-v2-lite", 8, 42, None, "paper"): 1016.0}  # the issue's: 10% under 1,129 ms
CSV_COLUMNS = ("model", "p", "m", "cap_gib", "dp_shard", "memory_model", "column", "schedule", "placement",
               "layers_per_chunk", "iteration_ms", "gap_to_bound", "peak_gib", "peak_gib_per_rank",
               "layers_recomputed_per_rank", "microbatches_recomputed_per_rank", "ranks_at_cap", "device_memory_ms", "fits",
               "seconds", "note")


def markdown(records: list[dict[str, Any]], findings: list[str]) -> str:
    lines = [
        "# Memory levers: recompute chosen with the split and the schedule", "",
        f"Regenerate: `{COMMAND}` (joint searches {JOINT_SECONDS:g} s each, walks {WALK_SECONDS:g} s each per row; "
        "one run, 2 cores).", "",
        "Estimated H100 profiles (FLOP counts over the datasheet peak at 40% MFU; not measured), m = 4p, one "
        "sequence per microbatch, bf16, Adam, flash attention (sdpa). Memory under torch's runtime accounting "
        "(what its pipelining runtime holds: the split backward keeps each layer's graph from I until W) unless "
        "the row says otherwise. Caps are whole-rank: static bytes plus peak activations; `fsdp 8` shards "
        "static bytes over 8 data-parallel ranks (plus the largest layer's gathered weights and gradient). "
        "Recompute is `full` (only a block's input kept; F runs again in I) per block. Columns: joint search "
        "without recompute; every block recomputed with the fastest handcrafted schedule on the time-balanced "
        "split (the Megatron/torchtitan habit); the same with selective recompute; every block recomputed with "
        "the joint search; recompute chosen per rank (`--recompute auto-layers`); and per microbatch "
        "(`--recompute auto`). `gap` is against the row's lower bound over every split and every recompute "
        "choice. `layers` and `passes` per rank: blocks recomputed, and (chunk, microbatch) passes that "
        "recompute (of m per chunk). A recomputed block pays its forward again in I: where the cap costs the "
        "plan without recompute less than that, the search keeps no recompute (the rows at +0.0%). And under "
        "torch's split backward a decoder block holds 1.6 to 1.7 times more from I until W than from F until "
        "I (llama3-8b: 1.85 against 1.06 GiB per microbatch), which `full` recompute does not lower: it frees "
        "memory only while a microbatch waits for its I, not while its W is deferred.", "",
        "Every search here is time-limited: runs of the study on the same machine moved single cells by up "
        "to 2% either way, and once by 4% (deepseek-v2-lite p=8 42 GiB, per rank: 1,147.0 and 1,192.1 ms with "
        "the same code, from joint searches with every block recomputed at 1,230.5 and 1,284.9 ms), so read "
        "differences under that as noise. `python bench/free_recompute.py` searches the throttled rows again "
        "with recompute at no time cost (results/free_recompute.md): what a perfect recompute choice could "
        "reach with this search.", "",
        "| row | column | schedule (placement) | layers per chunk | iteration ms | gap | peak GiB | "
        "layers per rank | passes per rank |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        sched = f"{r['schedule']} ({r['placement']})" if r["schedule"] != "-" else (r["note"] or "-")
        gap = f"{100 * float(r['gap_to_bound']):.2f}%" if r["gap_to_bound"] != "" else "-"
        row = row_of(r).label
        lines.append(f"| {row} | {r['column']} | {sched} | {r['layers_per_chunk'] or '-'} | "
                     f"{r['iteration_ms'] or '-'} | {gap} | {r['peak_gib'] or '-'} | "
                     f"{r['layers_recomputed_per_rank'] or '-'} | {r['microbatches_recomputed_per_rank'] or '-'} |")
    return "\n".join(lines + findings) + "\n"


def ms_of(record: dict[str, Any], key: str = "iteration_ms") -> float:
    return float(record[key]) if record.get(key) not in ("", None) else math.nan


def throttled(plain: dict[str, Any]) -> bool:
    """Whether the cap costs the plan without recompute more than 1% against the device's whole memory."""
    return plain["fits"] == "yes" and ms_of(plain) > ms_of(plain, "device_memory_ms") * 1.01


def target_ms(recs: list[dict[str, Any]]) -> float:
    """The issue's target on a throttled row (recs: its six columns' records, in order): 5% under no
    recompute and 10% under uniform full + handcrafted (where that fits)."""
    plain, full_hand = recs[0], recs[1]
    return min([0.95 * ms_of(plain)] + ([0.9 * ms_of(full_hand)] if full_hand["fits"] == "yes" else []))


def verdict(row: Row, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """The row against the issue's targets: per-microbatch recompute never slower than another column nor
    over the cap; on throttled rows 5% under no recompute and 10% under uniform full + handcrafted."""
    chosen, plain, full_hand = recs[5], recs[0], recs[1]
    t = ms_of(chosen)
    fits = chosen["fits"] == "yes"
    out = {"fits": fits, "slower_than": [r["column"] for r in recs[:5] if r["fits"] == "yes" and ms_of(r) < t * (1 - 1e-9)],
           "throttled": throttled(plain), "no_fit_without": plain["fits"] != "yes"}
    out["met"] = fits and (not out["throttled"] or (t <= 0.95 * ms_of(plain) and (
        full_hand["fits"] != "yes" or t <= 0.9 * ms_of(full_hand))))
    # Out of reach: a target below the row's bound (over every split, recompute choice and schedule on
    # the study's placements), which no plan there can meet.
    bound = t * (1 - float(chosen["gap_to_bound"])) if fits and chosen["gap_to_bound"] != "" else math.nan
    out["out_of_reach"] = out["throttled"] and not out["met"] and target_ms(recs) < bound * (1 - 1e-9)
    target = TARGET_MS.get(row)
    out["target"] = None if target is None else (target, fits and t <= target)
    return out


def finding(row: Row, recs: list[dict[str, Any]]) -> str:
    """What one row shows against the issue's targets (recs: its six columns' records, in order)."""
    chosen, plain, full_hand = recs[5], recs[0], recs[1]
    v, line = verdict(row, recs), f"- {row.label}: "
    if not v["fits"]:
        return line + f"recompute chosen found no plan ({chosen['note']})."
    t = ms_of(chosen)
    line += (f"per microbatch {t:,.1f} ms"
             + (f", slower than {', '.join(v['slower_than'])}" if v["slower_than"] else ", no column faster") + "; ")
    if v["no_fit_without"]:
        line += f"without recompute nothing fits ({plain['note'].removeprefix('infeasible: ')}); "
    else:
        line += (f"without recompute {ms_of(plain):,.1f} ms ({t / ms_of(plain) - 1:+.1%}), "
                 + (f"memory-throttled ({ms_of(plain, 'device_memory_ms'):,.1f} ms with the device's whole memory); "
                    if v["throttled"] else "not memory-throttled; "))
    if full_hand["fits"] == "yes":
        line += f"uniform full + handcrafted {ms_of(full_hand):,.1f} ms ({t / ms_of(full_hand) - 1:+.1%}); "
    if v["throttled"]:
        line += f"targets (5% under no recompute, 10% under uniform full) {'met' if v['met'] else 'not met'}"
        line += " (below the row's bound: out of reach); " if v["out_of_reach"] else "; "
    if v["target"] is not None:
        line += f"target {v['target'][0]:,.0f} ms {'met' if v['target'][1] else 'not met'}; "
    return line + f"gap {100 * float(chosen['gap_to_bound']):.2f}% to the bound; row {sum(float(r['seconds']) for r in recs):.0f} s."


def summary(verdicts: list[tuple[Row, dict[str, Any]]]) -> list[str]:
    """The targets over every row, counted."""
    throttled_rows = [(row, v) for row, v in verdicts if v["throttled"]]
    no_fit = [(row, v) for row, v in verdicts if v["no_fit_without"]]
    lines = ["", "## Targets, counted", "",
             f"- Recompute chosen (per microbatch) never slower than another column: "
             f"{sum(not v['slower_than'] for _, v in verdicts)} of {len(verdicts)} rows; never over the cap: "
             f"{sum(v['fits'] for _, v in verdicts)} of {len(verdicts)}.",
             f"- Memory-throttled rows (the plan without recompute over 1% slower than with the device's whole "
             f"memory): {len(throttled_rows)}; 5% under no recompute and 10% under uniform full + handcrafted on "
             f"{sum(v['met'] for _, v in throttled_rows)} of them"
             + (f" ({', '.join(row.label for row, v in throttled_rows if v['met'])})." if throttled_rows else "."),
             f"- Of the throttled rows that miss, {sum(v['out_of_reach'] for _, v in throttled_rows)} have a target "
             "below the row's lower bound (over every split, recompute choice and schedule on the study's "
             "placements), which no plan there meets"
             + (f" ({', '.join(row.label for row, v in throttled_rows if v['out_of_reach'])})."
                if any(v["out_of_reach"] for _, v in throttled_rows) else ".")]
    lines.append(f"- Rows where nothing fits without recompute: {len(no_fit)}; a plan found on "
                 f"{sum(v['fits'] for _, v in no_fit)} of them.")
    for row, v in verdicts:
        if v["target"] is not None:
            lines.append(f"- {row.label}: at most {v['target'][0]:,.0f} ms: {'met' if v['target'][1] else 'not met'}.")
    return lines


def figure(records: list[dict[str, Any]], stem: Path) -> None:
    """Each column's iteration time over the row's bound (missing bars: nothing fits the cap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys((r["model"], r["p"], r["cap_gib"], r["dp_shard"], r["memory_model"]) for r in records))
    fig, ax = plt.subplots(figsize=(14, 4.8))
    width = 0.8 / len(COLUMNS)
    for k, col in enumerate(COLUMNS):
        xs, ys = [], []
        for i, row in enumerate(rows):
            hit = [r for r in records if (r["model"], r["p"], r["cap_gib"], r["dp_shard"], r["memory_model"]) == row
                   and r["column"] == col and r["gap_to_bound"] not in ("", None)]
            if hit:
                xs.append(i + k * width)
                ys.append(1 / (1 - float(hit[0]["gap_to_bound"])))
        ax.bar(xs, ys, width, label=col, color=f"C{k}")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax.set_xticklabels([f"{m}\np={p} {float(c):g}G{' fsdp' + str(s) if s else ''}{' paper' if mm == 'paper' else ''}"
                        for m, p, c, s, mm in rows], fontsize=6)
    ax.set_ylabel("iteration time / bound over every split and recompute choice")
    ax.set_ylim(bottom=0.9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    save_figure(fig, stem)


def report(records: list[dict[str, Any]]) -> None:
    """results/memory_levers.{md,png,svg} from the study's records (a run's, or its CSV's)."""
    findings, verdicts = ["", "## Findings, row by row", ""], []
    for row in dict.fromkeys(row_of(r) for r in records):
        recs = [r for r in records if row_of(r) == row]
        findings.append(finding(row, recs))
        verdicts.append((row, verdict(row, recs)))
    write_text(RESULTS / "memory_levers.md", markdown(records, summary(verdicts) + findings))
    figure(records, RESULTS / "memory_levers")


def row_of(record: dict[str, Any]) -> Row:
    shard = record["dp_shard"]
    return Row(record["model"], int(record["p"]), float(record["cap_gib"]), int(shard) if shard not in ("", None) else None,
               record["memory_model"])


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--from-csv", action="store_true",
                    help="rewrite the report and the figure from results/memory_levers.csv")
    args = ap.parse_args(argv)
    if args.from_csv:
        report(list(read_csv(RESULTS / "memory_levers.csv")))
        return
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    records = []
    for row in ROWS:
        if wanted and row.model not in wanted:
            continue
        t0 = time.monotonic()
        plans = run_row(row, JOINT_SECONDS, WALK_SECONDS, ROOMY_SECONDS)
        m = study_profile(row).microbatches
        records += [record(row, m, plan) for plan in plans]
        log(finding(row, records[-len(plans):]) + f" ({time.monotonic() - t0:.0f} s)")
    RESULTS.mkdir(exist_ok=True)
    write_csv(RESULTS / "memory_levers.csv", COMMAND, records, CSV_COLUMNS)
    report(records)


if __name__ == "__main__":
    main(sys.argv[1:])
