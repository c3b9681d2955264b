"""The report of bench/configure_study.py: results/configure.md, .csv and .json from each case's searches (read
back from their results files) and torchtitan's configuration evaluated in the same cost model."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Sequence

from configure_study import MODES, Case, results_path, search, timings, torchtitan_fixed

from zbsearch.plan.wholerun.outcome import Failed, Outcome
from zbsearch.plan.wholerun.shape import Refused, RunShape
from zbsearch.plan.wholerun.shape_result import ShapeResult
from zbsearch.plan.wholerun.workload import DEFAULT_RUN_MFU

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "configure"
GIB = 2**30
COLUMNS = ["case", "row", "shape", "schedule", "placement", "recompute", "step_s", "tokens_per_s_per_gpu", "mfu",
           "bubble", "peak_gib", "cap_gib", "certificate_gap", "vs_chosen"]


def recompute_words(result: ShapeResult, blocks: int) -> str:
    full = sum(1 for level in result.recompute.values() if level == "full")
    return "none" if not full else ("full" if full >= blocks else f"full on {full} of {blocks} blocks")


def row(case: Case, kind: str, result: ShapeResult | Failed | Refused | None, gap: float | None,
        chosen: ShapeResult | None) -> dict[str, Any]:
    """One table row; a missing or failed result says why."""
    out: dict[str, Any] = {"case": case.name, "row": kind}
    if not isinstance(result, ShapeResult) or result.timing is None:
        why = getattr(result, "reason", None) or "no result"
        return {**out, "shape": getattr(result, "what", "") or "", "schedule": f"({why})"}
    blocks = PRESETS_BLOCKS[case.preset]
    tokens = result.tokens_per_s_per_gpu or 0.0
    base = chosen.tokens_per_s_per_gpu if chosen is not None else None
    return {**out, "shape": result.shape.label(), "schedule": result.schedule_name or "(no pipeline)",
            "placement": result.placement or "-", "recompute": recompute_words(result, blocks),
            "step_s": result.timing.step_seconds, "tokens_per_s_per_gpu": tokens, "mfu": result.mfu,
            "bubble": result.bubble_fraction, "peak_gib": max(result.peak_bytes) / GIB if result.peak_bytes else None,
            "cap_gib": (result.capacity_bytes or 0) / GIB, "certificate_gap": gap,
            "vs_chosen": None if not base else tokens / base - 1}


PRESETS_BLOCKS = {"llama3-8b": 32, "llama3-70b": 80, "mixtral-8x7b": 32}


def case_rows(case: Case, work: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A case's rows (chosen, best 1F1B-family, torchtitan's as planned and with its recompute) and its record."""
    outcomes: dict[str, Outcome[ShapeResult]] = {mode: search(case, mode, work) for mode in MODES}
    best, family = outcomes["all"], outcomes["1f1b-family"]
    chosen = best.chosen
    gap = {mode: (o.certificate.gap if o.certificate else None) for mode, o in outcomes.items()}
    rows = [row(case, "chosen (every schedule)", chosen, gap["all"], chosen),
            row(case, "best 1F1B-family", family.chosen, gap["1f1b-family"], chosen)]
    if case.torchtitan is not None:
        rows.append(row(case, f"torchtitan, recompute {case.torchtitan_recompute}", torchtitan_fixed(case), None,
                        chosen))
        rows.append(row(case, "torchtitan's shape, planned by zbsearch", best.fixed, None, chosen))
    record = {"case": case.name, "limiting": limiting(work, case, best),
              "family_shape_in_joint_search": _joint_of(best, family.chosen), "preset": case.preset,
              "gpus": case.gpus, "global_batch": case.batch,
              "seq": case.seq, "time_limit_s": case.time_limit, "space": case.space.to_dict(),
              "narrowed": case.narrowed, "torchtitan_note": case.torchtitan_note, "published": case.published,
              "certificates": {m: (o.certificate.to_dict() if o.certificate else None) for m, o in outcomes.items()},
              "counts": {m: _counts(o) for m, o in outcomes.items()}, "rows": rows}
    return rows, record


def limiting(work: Path, case: Case, outcome: Outcome[ShapeResult]) -> dict[str, Any] | None:
    """The shape whose lower bound is the certificate's (its cheap bound from the results file, raised by what its
    solve proved where the table keeps it), with its plan's step where it was solved."""
    cheap: dict[str, float] = {}
    for line in results_path(work, case, "all").read_text().splitlines()[1:]:
        entry = json.loads(line)
        record = entry.get("record") or {}
        if entry["kind"] == "bound" and record.get("refused") is None and record.get("step_bound_us") is not None:
            cheap[RunShape.from_dict(entry["shape"]).label()] = record["step_bound_us"]
    solved = {r.shape.label(): r for r in outcome.ranked}
    pruned = {p.shape.label() for p in outcome.pruned}
    lows = {label: max(bound, solved[label].bound) if label in solved else bound for label, bound in cheap.items()
            if label in solved or label in pruned}
    if not lows:
        return None
    label = min(lows, key=lambda k: lows[k])
    plan = solved.get(label)
    return {"shape": label, "bound_s": lows[label] / 1e6, "plan_s": None if plan is None else plan.step / 1e6}


def _joint_of(outcome: Outcome[ShapeResult], family: ShapeResult | None) -> dict[str, Any] | None:
    """What the joint search found on the shape the 1F1B family chose, where it solved it."""
    found = next((r for r in outcome.ranked if family is not None and r.shape == family.shape), None)
    if found is None or found.timing is None:
        return None
    return {"shape": found.shape.label(), "schedule": found.schedule_name, "placement": found.placement,
            "step_s": found.timing.step_seconds, "tokens_per_s_per_gpu": found.tokens_per_s_per_gpu}


def notes(record: dict[str, Any]) -> list[str]:
    """What a case's rows say, in words, from its numbers."""
    chosen, family = record["rows"][0], record["rows"][1]
    gap = record["certificates"]["all"]["gap"] if record["certificates"]["all"] else None
    out = []
    low = record["limiting"]
    if gap is not None and low is not None:
        plan = f", whose plan took {low['plan_s']:.2f} s" if low["plan_s"] is not None else " (pruned)"
        out.append(f"Certificate {gap:.1%} ({'within' if gap <= 0.05 else 'above'} the 5% target): the least lower "
                   f"bound is {low['shape']}'s, {low['bound_s']:.2f} s{plan}.")
    joint = record["family_shape_in_joint_search"]
    if family.get("tokens_per_s_per_gpu") and chosen.get("tokens_per_s_per_gpu"):
        gain = chosen["tokens_per_s_per_gpu"] / family["tokens_per_s_per_gpu"] - 1
        out.append(f"Every schedule against the 1F1B family: {gain:+.1%} tokens/s/GPU.")
        if gain < 0 and joint is not None:
            out.append(f"The 1F1B family's plan is faster: {family['schedule']} on the {family['placement']} placement "
                       f"at {family['shape']}; the joint search solved that shape to {joint['step_s']:.2f} s "
                       f"({joint['schedule']} on {joint['placement']}) within its time limit, and its automatic "
                       "placements (linear, V) leave the looped placement out.")
    return out


def _counts(outcome: Outcome[ShapeResult]) -> dict[str, int]:
    return {"solved": len(outcome.ranked), "pruned": len(outcome.pruned), "refused": len(outcome.refused),
            "failed": len(outcome.failed)}


def _cell(value: Any, kind: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if kind == "pct":
        return f"{value:+.1%}" if value != 0 else "0"
    if kind == "share":
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return str(value)


def markdown_rows(rows: Sequence[dict[str, Any]]) -> list[str]:
    head = ["row", "shape", "schedule (placement)", "recompute", "step s", "tokens/s/GPU", "MFU", "bubble",
            "peak/cap GiB", "certificate", "vs chosen"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        peak = f"{r['peak_gib']:.1f}/{r['cap_gib']:.1f}" if r.get("peak_gib") is not None else "-"
        sched = f"{r['schedule']} ({r['placement']})" if r.get("placement") not in (None, "-") else r["schedule"]
        out.append("| " + " | ".join([r["row"], r.get("shape", ""), sched, r.get("recompute", "-"),
                                      _cell(r.get("step_s")), _cell(r.get("tokens_per_s_per_gpu")),
                                      _cell(r.get("mfu"), "share"), _cell(r.get("bubble"), "share"), peak,
                                      _cell(r.get("certificate_gap"), "share"), _cell(r.get("vs_chosen"), "pct")])
                   + " |")
    return out


def case_section(record: dict[str, Any], runs: list[dict[str, Any]]) -> list[str]:
    c = record
    mine = [t for t in runs if t["case"] == c["case"]]
    ran = "; ".join(f"{t['mode']}: {t['wall_s'] / 60:.1f} min, {t['jobs_ran']} jobs, load {t['load_start']:.1f}"
                    f"-{t['load_end']:.1f} ({t['when']})" for t in mine) or "no run logged"
    counts = "; ".join(f"{m}: " + ", ".join(f"{v} {k}" for k, v in n.items()) for m, n in c["counts"].items())
    lines = [f"## {c['case']}: {c['gpus']} H100, {c['global_batch']} x {c['seq']:,} tokens", "",
             f"Space: {c['narrowed'] or 'every shape (t inside a node, p up to the blocks, b 1-8, all shardings)'}. "
             f"Per-shape time limit {c['time_limit_s']:g} s (the most promising shape; others down to a quarter). "
             f"Shapes: {counts}. Runs: {ran}.", ""]
    if c["torchtitan_note"]:
        lines += [f"torchtitan: {c['torchtitan_note']}.", ""]
    return lines + markdown_rows(c["rows"]) + [""] + [f"- {line}" for line in notes(c)] + [""]


def summary(records: Sequence[dict[str, Any]]) -> list[str]:
    """One line per case: the chosen plan's tokens/s/GPU, the gains over the 1F1B family's and torchtitan's."""
    head = ["case", "chosen tokens/s/GPU", "best 1F1B-family", "chosen vs it", "torchtitan (its recompute)",
            "chosen vs it", "certificate", "certificate (1F1B family)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in records:
        rows = c["rows"]
        chosen, family = rows[0], rows[1]
        titan = rows[2] if len(rows) > 2 else {}
        tokens = [r.get("tokens_per_s_per_gpu") for r in (chosen, family, titan)]
        gains = [None if not t or not tokens[0] else tokens[0] / t - 1 for t in tokens[1:]]
        out.append("| " + " | ".join([c["case"], _cell(tokens[0]), _cell(tokens[1]), _cell(gains[0], "pct"),
                                      _cell(tokens[2]), _cell(gains[1], "pct"),
                                      _cell(chosen.get("certificate_gap"), "share"),
                                      _cell(family.get("certificate_gap"), "share")]) + " |")
    return out


def write_report(cases: Sequence[Case], work: Path) -> None:
    records, rows = [], []
    for case in cases:
        mine, record = case_rows(case, work)
        rows += mine
        records.append(record)
    runs = timings(work)
    lines = ["# Whole-run planning study: chosen plan, best 1F1B-family plan, torchtitan's configuration", "",
             f"Written by `python bench/configure_study.py` (bench/configure_report.py). Cost model of "
             f"docs/whole-run.md at MFU {DEFAULT_RUN_MFU} (calibrated: results/calibrate_mfu.md), H100 80 GB, 8 per "
             "node, NVLink 4 inside a node and 400 Gb/s per GPU between nodes at 0.8 efficiency, bf16, Adam. "
             "Certificate: under the cost model no shape of the space (of the 1F1B family, for its row) is more "
             "than that much faster than the row's plan. vs chosen: tokens/s/GPU against the chosen plan's.", "",
             "Rows: *chosen*, `configure` over every schedule (the joint search per shape: placement linear or V, "
             "split, schedule, recompute per layer; or the shape's best 1F1B-family plan where that is faster, "
             "so never slower than the family on any shape); *best 1F1B-family*, `configure --schedules 1f1b-family` over the "
             "same shapes (per shape the best of 1F1B and interleaved 1F1B, v 2-4, at an even or balanced split "
             "with recompute none or full, enumerated whole and simulated, docs/whole-run.md: its certificate is 0 by "
             "construction, every shape whose bound is below its plan being evaluated exactly); *torchtitan*, the "
             "published configuration at its recompute (no search: p = 1), and the same shape as `configure "
             "--current` plans it (recompute per layer). torchtitan's own runs used torch.compile and Float8 on "
             "70B; this model has neither. Shapes without pipelining pay their whole data-parallel sync after the "
             "last pass (results/calibrate_mfu.md: about 10% too slow at 128 GPUs for 8B under FSDP).", ""]
    lines += summary(records) + [""]
    for record in records:
        lines += case_section(record, runs)
    OUT.with_suffix(".md").write_text("\n".join(lines))
    with open(OUT.with_suffix(".csv"), "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    OUT.with_suffix(".json").write_text(json.dumps({"cases": records, "runs": runs}, indent=1, allow_nan=False))
    print(f"wrote {OUT.with_suffix('.md').relative_to(ROOT)}, .csv, .json")
