"""The fidelity study as files: a markdown report, a CSV (one row per schedule) and a figure, each
written atomically (core.fileio, report.figure.save). matplotlib is needed only for the figure."""

from __future__ import annotations

import csv
import io
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from ..core.fileio import write_atomic
from .fidelity import Study
from .fidelity_analysis import Row, environment, measured_backwards
from ..report.figure import require_matplotlib
from ..report.figure import save

MB = 1e6


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _fits_measured(row: Row, limit: Sequence[float]) -> bool | None:
    mem = row.entry.memory
    return None if mem is None else all(x <= cap * (1 + 1e-9) for x, cap in zip(mem, limit))


def solved_against_best(study: Study, rows: Sequence[Row]) -> list[str]:
    """Per solved schedule: its measured time against the best measured fixed schedule whose measured
    memory fits the same limit."""
    out = []
    for row in rows:
        if row.entry.solved_for is None or row.measured is None:
            continue
        variant, limit = row.entry.solved_for
        cap = study.limits_bytes[limit]
        fixed = [(t, r) for r in rows if r.entry.source != "zbsearch" and (t := r.measured) is not None
                 and _fits_measured(r, cap) is not False]
        found = min(fixed, key=lambda tr: tr[0], default=None)
        own = _fits_measured(row, cap)
        held = "" if own is not False else " (its measured memory exceeds the limit)"
        if found is None:
            out.append(f"{row.label}: {_ms(row.measured)} ms{held}; no fixed schedule fits {limit} as measured")
            continue
        best_measured, best = found
        verdict = ("at or below" if row.measured <= best_measured else
                   "within the run-to-run spread of" if row.measured <= best_measured + max(row.spread, best.spread)
                   else "above")
        out.append(f"{row.label}: {_ms(row.measured)} ms{held}, {verdict} the best fixed schedule that fits {limit} "
                   f"as measured, {best.label} at {_ms(best_measured)} ms (spreads {_ms(row.spread)} / "
                   f"{_ms(best.spread)} ms)")
    return out


def _time_table(study: Study, rows: Sequence[Row]) -> list[str]:
    cal = "calibrated" in study.variants
    head = ["schedule", "placement", "predicted raw ms"] + (["predicted calibrated ms"] if cal else []) + \
        ["measured ms (median [min, max])", "spread ms", "measured / raw"] + (["measured / calibrated"] if cal else []) + \
        ["order vs raw"] + (["order vs calibrated"] if cal else []) + ["where the raw model errs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        e = r.entry
        cells = [e.label, e.schedule.placement.name, _ms(e.predicted.get("raw"))]
        cells += [_ms(e.predicted.get("calibrated"))] if cal else []
        cells += [f"{_ms(r.measured)} [{_ms(r.low)}, {_ms(r.high)}]", _ms(r.spread), _ratio(r.ratio.get("raw"))]
        cells += [_ratio(r.ratio.get("calibrated"))] if cal else []
        cells += [r.order.get("raw", "-")] + ([r.order.get("calibrated", "-")] if cal else []) + [r.term or "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _memory_table(study: Study, rows: Sequence[Row]) -> list[str]:
    limits = list(study.limits_bytes)
    head = ["schedule", "rank", "predicted, paper MB", "predicted, torch runtime MB", "measured MB",
            "error paper", "error torch runtime"] + [f"fits {x} (measured)" for x in limits]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        e = r.entry
        if e.memory is None:
            continue
        for rank, held in enumerate(e.memory):
            paper, torch_rt = e.peaks["paper"][rank], e.peaks["torch-runtime"][rank]
            cells = [e.label if rank == 0 else "", str(rank), f"{paper / MB:.2f}", f"{torch_rt / MB:.2f}",
                     f"{held / MB:.2f}", f"{paper / held - 1:+.1%}" if held else "-",
                     f"{torch_rt / held - 1:+.1%}" if held else "-"]
            cells += ["yes" if held <= study.limits_bytes[x][rank] * (1 + 1e-9) else "NO" for x in limits]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _summary(study: Study, rows: Sequence[Row]) -> list[str]:
    out = []
    measured = [r for r in rows if r.measured is not None]
    for v in study.variants:
        within = [r for r in measured if abs(r.ratio.get(v, 0) - 1) <= 0.25]
        worst = max(measured, key=lambda r: abs(r.ratio.get(v, 1) - 1), default=None)
        counts = study.details.get(f"order_{v}", {})
        out.append(f"- **{v}**: predicted within 25% of measured for {len(within)} of {len(measured)} schedules"
                   + (f"; the worst is {worst.label} (measured / predicted {worst.ratio.get(v, 0):.3f})" if worst else "")
                   + f". Pairs of schedules: {counts.get('agree', 0)} ordered alike, {counts.get('disagree', 0)} "
                   f"in opposite order beyond the spread, {counts.get('within spread', 0)} predicted apart but "
                   f"measured within the spread, {counts.get('predicted tie', 0)} predicted within the spread.")
    for model in ("paper", "torch-runtime"):
        errs = [r.memory_error[model] for r in rows if model in r.memory_error]
        if errs:
            ok = sum(x <= 0.10 for x in errs)
            out.append(f"- **memory, {model} accounting**: peak activation memory within 10% of what torch held on "
                       f"every rank for {ok} of {len(errs)} schedules; largest error {max(errs):.1%}.")
    spreads = [r.spread / r.measured for r in measured if r.measured]
    if spreads:
        out.append(f"- **run-to-run spread** (largest difference between the medians of a schedule's runs): up to "
                   f"{max(spreads):.1%} of the median, {statistics.median(spreads):.1%} typically.")
    return out


def markdown(study: Study, rows: Sequence[Row], command: str = "") -> str:
    req, prof = study.request, study.request.profile
    env = environment(study)
    cal = req.calibrated
    lines = [f"# Fidelity: predicted against measured on torch.distributed.pipelining ({prof.name})", "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M %Z')}" + (f" by `{command}`" if command else "") + ".", "",
             "## Setup", "",
             f"- model: {prof.details.get('model')}, dtype {prof.details.get('dtype')}; {prof.num_stages} ranks, "
             f"m = {prof.microbatches} microbatches; profile source: {prof.source.get('kind')} on "
             f"{prof.source.get('device', '-')} ({prof.source.get('date', '-')})",
             f"- machine: {env['cpus']} CPUs, this process may use {env['allowed_cpus']}; backend {env['backend']} on "
             f"{env['device']}; one torch thread per rank (torch.set_num_threads(1))"
             + ("; rank r pinned to the r-th allowed CPU (os.sched_setaffinity)" if env["pinned"] else "; not pinned"),
             f"- pass times: {env['timer']}; step time: time.perf_counter over the step (after a barrier)",
             f"- runs: every distinct schedule {req.repeats} times round robin, {req.warmup} warm-up + {req.steps} timed "
             f"steps each; measured = median over all timed steps (slowest rank per step); gradients not checked",
             f"- memory limits: {', '.join(f'{k} = {max(v) / MB:.2f} MB' for k, v in study.limits_bytes.items())} per rank "
             "(multiples of p x the stage's paper mem_B); solved with zbsearch solve's search, "
             f"{req.solve_seconds:g} s per solve, over placements linear and v"]
    if cal is not None:
        lines.append(f"- calibration: action overhead {cal.action_overhead:.1f} {cal.time_unit} per action; message "
                     "times (bytes: " + ", ".join(f"{b:.0f}: {t:.1f}" for b, t in cal.comm_table or ()) + f" {cal.time_unit})")
    lines += ["", "## Iteration time", ""] + _time_table(study, rows)
    lines += ["", "## Peak activation memory per rank", ""] + _memory_table(study, rows)
    split = measured_backwards(study.entries)
    if split:
        lines += ["", "## torch's split backward against its fused one (one chunk per rank, measured means)", "",
                  "| chunk | I + W ms | fused B ms | ratio |", "|---|---|---|---|"]
        lines += [f"| {c} | {v['split_s'] * 1e3:.2f} | {v['fused_s'] * 1e3:.2f} | {v['split_s'] / v['fused_s']:.3f} |"
                  for c, v in split.items() if v["fused_s"] > 0]
    lines += ["", "## Summary", ""] + _summary(study, rows)
    lines += ["", "## Solved schedules against the best fixed one", ""] + [f"- {x}" for x in solved_against_best(study, rows)]
    lines += ["", "## How to read it", "",
              "- raw: the profile as measured (each pass alone, one thread), no runtime overhead, its own comm, the "
              "paper's memory accounting. calibrated: plus the per-action overhead and message times measured by "
              "zbsearch calibrate, and torch's runtime memory (memory_model torch-runtime).",
              "- where the raw model errs: replay = the simulator on the measured mean time of every pass with free "
              "hops; `pass times` = replay - predicted (passes slower or faster than profiled: ranks sharing cores, the "
              "split backward), `between passes` = measured - replay (runtime overhead, communication, waits).",
              "- order: a pair counts where the predictions differ by more than the larger spread of the two.",
              "- memory measured: bytes of the tensors torch's runtime keeps for backward passes still to come "
              "(autograd's saved tensors while their graph holds them, the stage's forward cache and backward state), "
              "sampled after every action of one untimed step; receive buffers and parameters are left out.", ""]
    return "\n".join(lines)


def csv_text(study: Study, rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    header = ["schedule", "source", "placement", "solved_for"] + [f"predicted_{v}_s" for v in study.variants] + \
        ["measured_median_s", "measured_min_s", "measured_max_s", "spread_s", "replay_s"] + \
        [f"ratio_{v}" for v in study.variants] + [f"order_{v}" for v in study.variants] + \
        ["peak_paper_bytes", "peak_torch_runtime_bytes", "measured_peak_bytes", "term", "note"]
    out.writerow(header)
    for r in rows:
        e = r.entry
        out.writerow([e.label, e.source, e.schedule.placement.name, " ".join(e.solved_for or ())]
                     + [e.predicted.get(v) for v in study.variants]
                     + [r.measured, r.low, r.high, r.spread, e.replay] + [r.ratio.get(v) for v in study.variants]
                     + [r.order.get(v, "") for v in study.variants]
                     + [";".join(f"{x:.0f}" for x in e.peaks.get(m, [])) for m in ("paper", "torch-runtime")]
                     + [";".join(f"{x:.0f}" for x in e.memory or []), r.term, e.note])
    return buf.getvalue()


def figure(study: Study, rows: Sequence[Row]) -> Any:

    fig = require_matplotlib()(figsize=(max(8.0, 0.9 * len(rows) + 3), 8.5))
    top, bottom = fig.subplots(2, 1)
    xs = list(range(len(rows)))
    med = [(r.measured or 0) * 1e3 for r in rows]
    err = [[m - (r.low or 0) * 1e3 for m, r in zip(med, rows)], [(r.high or 0) * 1e3 - m for m, r in zip(med, rows)]]
    top.bar(xs, med, color="#9ecae1", label="measured (median, min-max)")
    top.errorbar(xs, med, yerr=err, fmt="none", ecolor="#333333", capsize=3)
    for v, marker in zip(study.variants, ("o", "D")):
        top.scatter(xs, [r.entry.predicted.get(v, 0) * 1e3 for r in rows], marker=marker, zorder=3, label=f"predicted, {v}")
    top.set_ylabel("iteration time (ms)")
    top.legend(fontsize=8)
    width = 0.27
    for k, (what, color) in enumerate((("paper", "#fdae6b"), ("torch-runtime", "#e6550d"), ("measured", "#31a354"))):
        vals = [(max(r.entry.memory) if what == "measured" and r.entry.memory else
                 max(r.entry.peaks.get(what, [0])) if what != "measured" else 0) / MB for r in rows]
        bottom.bar([x + (k - 1) * width for x in xs], vals, width, color=color,
                   label=f"predicted, {what}" if what != "measured" else "measured (torch runtime)")
    bottom.set_ylabel("peak activation memory, largest rank (MB)")
    bottom.legend(fontsize=8)
    for ax in (top, bottom):
        ax.set_xticks(xs)
        ax.set_xticklabels([r.label for r in rows], rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    return fig


def write_study(study: Study, rows: Sequence[Row], prefix: str | Path, command: str = "",
                figure_format: str = "png") -> list[Path]:
    """`prefix`.md, `prefix`.csv and `prefix`.png (or .svg), each whole or not at all."""

    base = Path(prefix)
    paths = [base.with_suffix(".md"), base.with_suffix(".csv"), base.with_suffix("." + figure_format)]
    fig = figure(study, rows)
    write_atomic(paths[0], markdown(study, rows, command))
    write_atomic(paths[1], csv_text(study, rows))
    save(fig, paths[2])
    return paths


__all__ = ["csv_text", "figure", "markdown", "solved_against_best", "write_study"]
