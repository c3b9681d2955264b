"""The memory-levers study: what choosing activation recompute (per layer, rank and microbatch) with the
split, the placement and the schedule gains over no recompute and over recomputing every block, on
estimated H100 profiles of real model shapes, under torch's runtime accounting, with and without FSDP.

    python bench/memory_levers.py                      # every row, about 30 minutes on 2 cores
    python bench/memory_levers.py --only llama3-8b     # rows of some models
    python bench/memory_levers.py --figure-only        # redraw the figure from the CSV

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
from partition_rows import Plan  # noqa: E402
from results_common import RESULTS, log, save_figure, write_csv, write_text  # noqa: E402

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
        "recompute (of m per chunk).", "",
        "| row | column | schedule (placement) | layers per chunk | iteration ms | gap | peak GiB | "
        "layers per rank | passes per rank |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        sched = f"{r['schedule']} ({r['placement']})" if r["schedule"] != "-" else (r["note"] or "-")
        gap = f"{100 * r['gap_to_bound']:.2f}%" if r["gap_to_bound"] != "" else "-"
        row = Row(r["model"], int(r["p"]), float(r["cap_gib"]), int(r["dp_shard"]) if r["dp_shard"] else None,
                  r["memory_model"]).label
        lines.append(f"| {row} | {r['column']} | {sched} | {r['layers_per_chunk'] or '-'} | "
                     f"{r['iteration_ms'] or '-'} | {gap} | {r['peak_gib'] or '-'} | "
                     f"{r['layers_recomputed_per_rank'] or '-'} | {r['microbatches_recomputed_per_rank'] or '-'} |")
    return "\n".join(lines + findings) + "\n"


def throttled(plain: Plan) -> bool:
    """Whether the cap costs the plan without recompute more than 1% against the device's whole memory."""
    return plain.fits and plain.time > plain.extra.get("roomy", math.inf) * 1.01


def finding(row: Row, plans: list[Plan]) -> str:
    """What one row shows against the issue's targets."""
    chosen, plain, full_hand = plans[5], plans[0], plans[1]
    line = f"- {row.label}: "
    if not chosen.fits:
        return line + f"recompute chosen found no plan ({chosen.note})."
    others = [pl for pl in plans[:5] if pl.fits]
    slower = [pl.label for pl in others if pl.time < chosen.time * (1 - 1e-9)]
    line += (f"per microbatch {chosen.time / 1e3:,.1f} ms"
             + (f", slower than {', '.join(slower)}" if slower else ", no column faster") + "; ")
    if not plain.fits:
        line += f"without recompute nothing fits ({plain.note.removeprefix('infeasible: ')}); "
    else:
        roomy = plain.extra.get("roomy", math.nan)
        line += (f"without recompute {plain.time / 1e3:,.1f} ms ({chosen.time / plain.time - 1:+.1%}), "
                 + (f"memory-throttled ({roomy / 1e3:,.1f} ms with the device's whole memory); "
                    if throttled(plain) else "not memory-throttled; "))
    if full_hand.fits:
        line += f"uniform full + handcrafted {full_hand.time / 1e3:,.1f} ms ({chosen.time / full_hand.time - 1:+.1%}); "
    if throttled(plain):
        met = chosen.time <= 0.95 * plain.time and (not full_hand.fits or chosen.time <= 0.9 * full_hand.time)
        line += f"targets (5% under no recompute, 10% under uniform full) {'met' if met else 'not met'}; "
    target = TARGET_MS.get(row)
    if target is not None:
        line += f"target {target:,.0f} ms {'met' if chosen.time / 1e3 <= target else 'not met'}; "
    gap = (chosen.time - chosen.extra["row_bound"]) / chosen.time
    return line + f"gap {gap:.2%} to the bound; row {sum(pl.seconds for pl in plans):.0f} s."


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
        ax.bar(xs, ys, width, label=col)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))])
    ax.set_xticklabels([f"{m}\np={p} {float(c):g}G{' fsdp' + str(s) if s else ''}{' paper' if mm == 'paper' else ''}"
                        for m, p, c, s, mm in rows], fontsize=6)
    ax.set_ylabel("iteration time / bound over every split and recompute choice")
    ax.set_ylim(bottom=0.9)
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    save_figure(fig, stem)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated model names (default: all)")
    ap.add_argument("--figure-only", action="store_true", help="redraw the figure from results/memory_levers.csv")
    args = ap.parse_args(argv)
    if args.figure_only:
        import csv

        lines = [ln for ln in (RESULTS / "memory_levers.csv").read_text().splitlines() if not ln.startswith("#")]
        figure(list(csv.DictReader(lines)), RESULTS / "memory_levers")
        return
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    records, findings = [], ["", "## Findings, row by row", ""]
    for row in ROWS:
        if wanted and row.model not in wanted:
            continue
        t0 = time.monotonic()
        plans = run_row(row, JOINT_SECONDS, WALK_SECONDS, ROOMY_SECONDS)
        m = study_profile(row).microbatches
        records += [record(row, m, plan) for plan in plans]
        findings.append(finding(row, plans))
        log(findings[-1] + f" ({time.monotonic() - t0:.0f} s)")
    RESULTS.mkdir(exist_ok=True)
    write_csv(RESULTS / "memory_levers.csv", COMMAND, records, CSV_COLUMNS)
    write_text(RESULTS / "memory_levers.md", markdown(records, findings))
    figure(records, RESULTS / "memory_levers")


if __name__ == "__main__":
    main(sys.argv[1:])
