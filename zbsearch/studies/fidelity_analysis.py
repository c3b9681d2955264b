"""What the fidelity study's numbers say: per schedule the measured median with its spread, the ratio to
each prediction, whether the measured order agrees with the predicted one, and which term of the
model of time the error comes from.

Decomposition of a schedule's error against the raw profile, from its first run: `replay` is the
simulator on the measured mean time of every pass (each stage's own compute call, so waits are out)
with free hops. replay - predicted is what the pass times cost (they ran slower or faster than the
profile measured them alone: ranks sharing cores and memory bandwidth, torch's split backward costing
more than its fused one); measured - replay is what happens between the passes (the runtime's
per-action work, communication, waiting on stragglers). Spread: the largest difference between the
medians of one schedule's runs (with one run: the interquartile range of its steps).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..interop.run.result import PassTimes
from .fidelity import Entry, Study

KIND_WORDS = {"F": "F", "I": "I", "W": "W", "B": "fused B"}


def spread(entry: Entry) -> float:
    """Run-to-run spread in seconds (see the module docstring)."""
    medians = [statistics.median(r) for r in entry.rounds if r]
    if len(medians) >= 2:
        return max(medians) - min(medians)
    steps = sorted(entry.steps)
    if len(steps) < 4:
        return max(steps) - min(steps) if steps else 0.0
    q = statistics.quantiles(steps, n=4)
    return q[2] - q[0]


def inflation(passes: Sequence[PassTimes], kinds: Sequence[str] | None = None) -> float | None:
    """Measured over profiled time, summed over the passes (of `kinds`) that have a profile time."""
    rows = [r for r in passes if r.profile_s and (kinds is None or r.kind in kinds)]
    planned = sum(r.count * (r.profile_s or 0.0) for r in rows)
    return sum(r.count * r.mean_s for r in rows) / planned if planned > 0 else None


@dataclass
class Row:
    """One schedule's line of the study."""

    entry: Entry
    measured: float | None
    low: float | None
    high: float | None
    spread: float
    ratio: dict[str, float]  # variant -> measured / predicted
    order: dict[str, str] = field(default_factory=dict)  # variant -> agreement in words
    term: str = ""
    memory_error: dict[str, float] = field(default_factory=dict)  # memory model -> largest |pred/meas - 1|

    @property
    def label(self) -> str:
        return self.entry.label


def term(entry: Entry) -> str:
    """Which part of the model of time the raw prediction misses most, with the numbers."""
    measured, predicted = entry.measured, entry.predicted.get("raw")
    if measured is None or predicted is None or entry.replay is None:
        return ""
    pass_part, between = entry.replay - predicted, measured - entry.replay
    actions = sum(len(rank) for rank in entry.schedule.ranks)
    per_kind = ", ".join(f"{KIND_WORDS[k]} x{x:.2f}" for k in ("F", "I", "W", "B")
                         if (x := inflation(entry.passes, (k,))) is not None)
    if abs(pass_part) >= abs(between):
        return (f"pass times: {pass_part * 1e3:+.1f} ms (measured/profile {per_kind}; ranks sharing cores"
                f"{' and the split backward' if any(r.kind in 'IW' for r in entry.passes) else ''})")
    per_action = between / max(1, actions / entry.schedule.num_ranks)
    return (f"between passes: {between * 1e3:+.1f} ms (runtime overhead + communication + waits, "
            f"{per_action * 1e6:.0f} us per action on the busiest rank's count)")


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def agreement(rows: Sequence[Row], variant: str) -> tuple[dict[str, str], dict[str, int]]:
    """Per row: whether its measured order against every other row agrees with the prediction where the
    predictions differ by more than the larger of the two spreads; and counts (agree, disagree, within
    spread: predicted apart but measured within the spread)."""
    out: dict[str, str] = {}
    counts = {"agree": 0, "disagree": 0, "within spread": 0, "predicted tie": 0}
    measured = [r for r in rows if r.measured is not None and variant in r.entry.predicted]
    for a in measured:
        against = []
        for b in measured:
            if a is b:
                continue
            threshold = max(a.spread, b.spread)
            dp = a.entry.predicted[variant] - b.entry.predicted[variant]
            dm = a.measured - b.measured  # type: ignore[operator]  # both measured: `measured` keeps only those
            if abs(dp) <= threshold:
                verdict = "predicted tie"
            elif abs(dm) <= threshold:
                verdict = "within spread"
            else:
                verdict = "agree" if _sign(dp) == _sign(dm) else "disagree"
            if a.label < b.label:
                counts[verdict] += 1
            if verdict == "disagree":
                against.append(f"{b.label} (predicted {dp * 1e3:+.1f} ms, measured {dm * 1e3:+.1f} ms)")
        out[a.label] = "agrees" if not against else "disagrees with " + "; ".join(against)
    return out, counts


def memory_error(entry: Entry, model: str) -> float | None:
    if entry.memory is None or model not in entry.peaks:
        return None
    errors = [abs(p / m - 1) for p, m in zip(entry.peaks[model], entry.memory) if m > 0]
    return max(errors) if errors else None


def measured_backwards(entries: Sequence[Entry]) -> dict[int, dict[str, float]]:
    """Per chunk of the one-chunk-per-rank schedules: the measured mean I + W (split backward) and
    fused B, where both were run."""
    sums: dict[int, dict[str, list[float]]] = {}
    for e in entries:
        if e.schedule.placement.num_chunks != e.schedule.num_ranks:
            continue
        for r in e.passes:
            sums.setdefault(r.chunk, {}).setdefault(r.kind, []).append(r.mean_s)
    out = {}
    for chunk, kinds in sorted(sums.items()):
        if "B" in kinds and "W" in kinds:
            iw = statistics.fmean(kinds.get("I", [0.0])) + statistics.fmean(kinds["W"])
            out[chunk] = {"split_s": iw, "fused_s": statistics.fmean(kinds["B"])}
    return out


def environment(study: Study) -> dict[str, Any]:
    """The machine as the runs saw it: CPUs, those this process may use, ranks and threads per rank."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    req = study.request
    device = req.device or ("cuda" if req.backend == "nccl" else "cpu")
    out = {"cpus": os.cpu_count(), "allowed_cpus": allowed, "ranks": req.profile.num_stages,
           "threads_per_rank": 1, "pinned": req.pin_cpu and allowed is not None, "backend": req.backend,
           "device": device, "timer": "time.perf_counter around each stage call"}
    if device == "cuda":  # one GPU per rank: name each
        import torch

        out["device"] = ", ".join(f"cuda:{r} {torch.cuda.get_device_name(r)}" for r in range(req.profile.num_stages))
        out["timer"] = "CUDA events around each stage call, read after the step"
    return out


def analyse(study: Study) -> list[Row]:
    """The study's rows, with order agreement per variant and memory errors per model."""
    rows = []
    for e in study.entries:
        steps = e.steps
        measured = e.measured
        ratio = {v: measured / p for v, p in e.predicted.items() if measured and p > 0}
        row = Row(e, measured, min(steps) if steps else None, max(steps) if steps else None, spread(e), ratio,
                  term=term(e))
        for model in e.peaks:
            err = memory_error(e, model)
            if err is not None:
                row.memory_error[model] = err
        rows.append(row)
    for variant in study.variants:
        verdicts, counts = agreement(rows, variant)
        study.details[f"order_{variant}"] = counts
        for row in rows:
            if row.label in verdicts:
                row.order[variant] = verdicts[row.label]
    return rows
