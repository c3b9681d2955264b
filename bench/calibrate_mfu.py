"""Calibrate whole-run planning's MFU input against torchtitan's published Llama 3.1 8B run (issue 41,
deliverable 3). Writes results/calibrate_mfu.md.

    python bench/calibrate_mfu.py

The run (torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, December 2024, Table 1): Llama 3.1 8B on 8
H100 (96 GB HBM2e, 500 W) with FSDP 8 and no other parallelism, local batch 2 x sequence 8,192, selective
activation checkpointing, bf16, no torch.compile, no Float8: 5,762 tokens/s/GPU, 82.4 GiB; "33% to 39% MFU"
(eager and compiled). Table 3, the same on 128 GPUs (global batch 256): 5,605 tokens/s/GPU, 67.0 GiB.

How it is evaluated in our cost model (zbsearch/plan/wholerun):

- shape t = 1, p = 1, d = 8, b = 2, m = 1 (no gradient accumulation), sharding `fsdp-reshard`: without
  pipelining torchtitan's `apply_fsdp` (torchtitan/models/llama/parallelize_llama.py, policy "default")
  reshards every block after forward but the last (and the root), so the weights are gathered again for the
  backward: our `fsdp-reshard` (each layer's gather per pass, prefetched behind the previous layer). `fsdp`
  (gathered once and kept, torchtitan's default under pipelining only) is shown beside it;
- recompute: torchtitan's llama3_8b.toml runs `selective` with `selective_ac_option = 'op'`: inside every
  block it saves the outputs of the matrix multiplies and of SDPA, except every second `aten.mm` of the
  block's forward (`_save_list` and `_custom_policy` in parallelize_llama.py), and recomputes the rest
  (pointwise ops, norms). The estimate with SDPA attention lists only `full` per block (profiling/estimate.py:
  `selective` exists for naive attention only), so the step is computed with recompute none and full, and
  op-level selective recompute as none plus the share of `full`'s recompute time that the recomputed matrix
  multiplies take: the 2nd, 4th and 6th of wq, wk, wv, wo, w1, w3, w2 (forward order: wk, wo, w3) over the
  block's forward FLOPs (its recompute option times the whole forward at the MFU; pointwise and norm
  recompute, memory-bound, left out);
- the cluster: h100 (989.4 TFLOP/s dense bf16, the SXM datasheet peak torchtitan's MFU uses too), 96 GB per
  GPU as the run's, NVLink 4 inside a node, 400 Gb/s per GPU between nodes, link efficiency 0.8.

The MFU input that reproduces 5,762 tokens/s/GPU is found by bisection (the step falls as the input rises).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zbsearch.plan.wholerun.cluster import make_cluster  # noqa: E402
from zbsearch.plan.wholerun.cost import PlanChoices, shape_costs  # noqa: E402
from zbsearch.plan.wholerun.evaluate import mfu as reported_mfu  # noqa: E402
from zbsearch.plan.wholerun.shape import RunShape  # noqa: E402
from zbsearch.plan.wholerun.single import best_single, single_step  # noqa: E402
from zbsearch.plan.wholerun.step import StepTime  # noqa: E402
from zbsearch.plan.wholerun.workload import DEFAULT_RUN_MFU, Workload  # noqa: E402
from zbsearch.profiling.presets import PRESETS  # noqa: E402
from zbsearch.profiling.request import LlamaShape  # noqa: E402
from zbsearch.profiling.transformer import block_flops  # noqa: E402

OUT = ROOT / "results" / "calibrate_mfu.md"
GPU_MEMORY = 96e9  # torchtitan's H100s: 96 GB HBM2e
LOCAL_BATCH = 2
PUBLISHED = {8: (5762.0, 82.4), 128: (5605.0, 67.0)}  # GPUs: (tokens/s/GPU, memory GiB), Tables 1 and 3
RECOMPUTE = ("none", "selective-op", "full")
SHARDINGS = ("fsdp-reshard", "fsdp")
GIB = 2**30


@dataclass(frozen=True)
class Point:
    """One evaluation: the step and its terms, tokens/s/GPU, our MFU accounting, the rank's peak bytes."""

    step: StepTime
    tokens: float
    mfu: float
    peak_bytes: float


def sac_share(shape: LlamaShape) -> float:
    """The share of a block's forward FLOPs that torchtitan's op-level selective recompute runs again: every
    second `aten.mm` of the forward (wk, wo, w3 of wq, wk, wv, wo, w1, w3, w2)."""
    h, q, kv = shape.hidden, shape.heads * shape.dh, shape.kv * shape.dh
    recomputed = h * kv + q * h + h * shape.ffn  # wk, wo, w3
    tokens = shape.micro_batch * shape.seq
    return 2.0 * tokens * recomputed / block_flops(shape, 0)["F"]


def evaluate(mfu: float, gpus: int, recompute: str, sharding: str = "fsdp-reshard") -> Point:
    """The published run's step in our cost model at MFU input `mfu` (see the module)."""
    model = PRESETS["llama3-8b"].shape
    assert isinstance(model, LlamaShape)
    workload = Workload(model, LOCAL_BATCH * gpus, mfu=mfu, preset="llama3-8b")
    cluster = make_cluster("h100", gpus, memory_bytes=GPU_MEMORY)
    shape = RunShape(1, 1, gpus, LOCAL_BATCH, 1, sharding)

    def at(level: str) -> tuple[StepTime, float, float]:
        costs = shape_costs(workload, cluster, shape, PlanChoices(recompute=level))
        plan = best_single(costs)  # a fixed level: the plan as it is, fitting or not
        step = single_step(costs, plan)
        return step, reported_mfu(costs, step.step_us), plan.peak_bytes

    if recompute != "selective-op":
        step, ours, peak = at(recompute)
    else:
        none, full = at("none"), at("full")
        extra = sac_share(workload.at_micro_batch(LOCAL_BATCH)) * (full[0].makespan_us - none[0].makespan_us)
        step = StepTime(none[0].makespan_us + extra, none[0].exposed_start_us, none[0].exposed_end_us,
                        none[0].optimizer_us, none[0].ranks)
        ours, peak = none[1] * none[0].step_us / step.step_us, math.nan  # memory: between none's and full's
    tokens = workload.tokens_per_step / (step.step_seconds * gpus)
    return Point(step, tokens, ours, peak)


def solve_for(target: float, tokens_at: Callable[[float], float], low: float = 0.05, high: float = 1.0) -> float:
    """The MFU input at which tokens_at reaches `target` (bisection; tokens rise with the input)."""
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if tokens_at(mid) < target else (low, mid)
    return (low + high) / 2


def calibrations() -> list[dict[str, object]]:
    """Per sharding and recompute variant: the input reproducing the 8-GPU run, and what it gives on 128."""
    rows = []
    target, _ = PUBLISHED[8]
    for sharding in SHARDINGS:
        for recompute in RECOMPUTE:
            value = solve_for(target, lambda x: evaluate(x, 8, recompute, sharding).tokens)
            eight, wide = evaluate(value, 8, recompute, sharding), evaluate(value, 128, recompute, sharding)
            rows.append({"sharding": sharding, "recompute": recompute, "input": value, "eight": eight,
                         "wide": wide})
    return rows


def chosen_value(rows: list[dict[str, object]]) -> float:
    """The calibrated input: the fsdp-reshard, op-level selective row (the run as torchtitan configured it)."""
    return next(float(r["input"]) for r in rows  # type: ignore[arg-type]
                if r["sharding"] == "fsdp-reshard" and r["recompute"] == "selective-op")


def _ms(us: float) -> str:
    return f"{us / 1e3:,.1f}"


def table(rows: list[dict[str, object]]) -> list[str]:
    head = ["sharding", "recompute", "MFU input for 5,762", "our MFU (accounting)", "step s (8)", "peak GiB (8)",
            "tokens/s/GPU at 128", "vs 5,605", "exposed end ms (128)"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        eight, wide = r["eight"], r["wide"]
        assert isinstance(eight, Point) and isinstance(wide, Point)
        peak = "-" if math.isnan(eight.peak_bytes) else f"{eight.peak_bytes / GIB:.1f}"
        out.append(f"| {r['sharding']} | {r['recompute']} | {float(r['input']):.4f} | {eight.mfu:.4f} | "  # type: ignore[arg-type]
                   f"{eight.step.step_seconds:.3f} | {peak} | {wide.tokens:,.0f} | "
                   f"{wide.tokens / PUBLISHED[128][0] - 1:+.1%} | {_ms(wide.step.exposed_end_us)} |")
    return out


def sweep(value: float) -> list[str]:
    """tokens/s/GPU on 8 GPUs as a function of the input (fsdp-reshard), for each recompute variant."""
    inputs = sorted({0.30, 0.35, 0.40, 0.45, 0.50, round(value, 4)})
    out = ["| MFU input | " + " | ".join(f"tokens/s/GPU, {r}" for r in RECOMPUTE) + " |",
           "|" + "---|" * (len(RECOMPUTE) + 1)]
    for x in inputs:
        out.append(f"| {x:.4g} | " + " | ".join(f"{evaluate(x, 8, r).tokens:,.0f}" for r in RECOMPUTE) + " |")
    return out


def breakdown(value: float) -> list[str]:
    """The step's terms at the calibrated input, 8 and 128 GPUs (fsdp-reshard, op-level selective)."""
    out = ["| GPUs | step s | makespan ms | exposed start ms | exposed end ms | optimizer ms | tokens/s/GPU | "
           "published |", "|---|---|---|---|---|---|---|---|"]
    for gpus in (8, 128):
        p = evaluate(value, gpus, "selective-op")
        s = p.step
        out.append(f"| {gpus} | {s.step_seconds:.3f} | {_ms(s.makespan_us)} | {_ms(s.exposed_start_us)} | "
                   f"{_ms(s.exposed_end_us)} | {_ms(s.optimizer_us)} | {p.tokens:,.0f} | {PUBLISHED[gpus][0]:,.0f} |")
    return out


ROUNDED = 0.37  # DEFAULT_RUN_MFU (plan/wholerun/workload.py): the calibrated input to two places


def narrative(rows: list[dict[str, object]], value: float) -> list[str]:
    """What the tables say, with the numbers of this run."""
    eight, wide = evaluate(value, 8, "selective-op"), evaluate(value, 128, "selective-op")
    at_default = evaluate(ROUNDED, 8, "selective-op")
    lo = min(float(r["input"]) for r in rows if r["sharding"] == "fsdp-reshard")  # type: ignore[arg-type]
    hi = max(float(r["input"]) for r in rows if r["sharding"] == "fsdp-reshard")  # type: ignore[arg-type]
    share = sac_share(replace(PRESETS["llama3-8b"].shape, micro_batch=LOCAL_BATCH))  # type: ignore[type-var]
    return [
        f"**Calibrated MFU input: {value:.4f}** (fsdp-reshard, op-level selective recompute); `DEFAULT_RUN_MFU` "
        f"= {ROUNDED} (the code's default now: {DEFAULT_RUN_MFU}). At {value:.4f} our own accounting (model FLOPs "
        f"of the step, no recompute, over 8 x 989.4 TFLOP/s x the step) reports **MFU {eight.mfu:.1%}**, inside "
        "torchtitan's 33-39% (its 33% is this eager run: 5,762 / 6,667 compiled x 39%). At the rounded "
        f"{ROUNDED}: {at_default.tokens:,.0f} tokens/s/GPU ({at_default.tokens / PUBLISHED[8][0] - 1:+.1%}), "
        f"MFU {at_default.mfu:.1%}.",
        "",
        f"The recompute torchtitan ran brackets the value: charged as none it is {lo:.4f}, as full {hi:.4f}; "
        f"op-level selective recomputes {share:.1%} of a block's forward FLOPs (wk, wo, w3 at b = 2, s = 8,192), "
        "which puts it between. The input is the share of the dense peak the estimator's matrix work runs at, "
        "recompute charged apart, so the selective row is the one to use: with recompute none the input would "
        "also absorb the recompute the run paid, and a plan the search gives recompute would pay it twice.",
        "",
        f"**Check, 128 GPUs (Table 3, 5,605 tokens/s/GPU):** {wide.tokens:,.0f} at the calibrated input, "
        f"{wide.tokens / PUBLISHED[128][0] - 1:+.1%}. The makespan grows {_ms(wide.step.makespan_us - eight.step.makespan_us)} "
        "ms (fsdp-reshard's gathers of the embedding, the first block and the head, the vocabulary-sized layers "
        "1 GB each, over the 400 Gb/s link exceed the passes they hide behind), and the final "
        f"gradient reduce-scatter, {_ms(wide.step.exposed_end_us)} ms over the link between nodes, is exposed whole: "
        "our rule for p = 1 (single.py) puts the whole data-parallel sync after the last pass, where FSDP2 "
        "reduce-scatters each block's gradients as its backward ends, overlapped with the backward of the blocks "
        "before it (only the first layers' are exposed). torchtitan lost 2.7% from 8 to 128 GPUs; our model "
        f"loses {1 - wide.tokens / eight.tokens:.1%}. The cost model is left as it is (reported, not changed); "
        "it over-charges data-parallel traffic of unpipelined shapes on many nodes, which the study's shapes "
        "with p = 1 share.",
        "",
        "Not modelled, and absorbed in the input: the run's 500 W power limit and HBM2e (torchtitan: its peak lies "
        "between the SXM and NVL figures; MFU is taken against the SXM peak, as ours is), pointwise and norm "
        "recompute, the fp32 gradient reduction (torchtitan's `mixed_precision_reduce` default; ours sends "
        "bf16), kernel launch gaps. The memory column is ours with the whole gradients fsdp-reshard keeps "
        "(docs/whole-run.md): torchtitan measured 82.4 GiB with selective recompute, between our none and full.",
    ]


def main() -> None:
    rows = calibrations()
    value = chosen_value(rows)
    lines = ["# MFU calibration: torchtitan's Llama 3.1 8B on 8 H100 in zbsearch's whole-run cost model", "",
             "Written by `python bench/calibrate_mfu.py` (its docstring says how the run is evaluated). Source: "
             "torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (December 2024), Table 1: Llama 3.1 8B, 8 H100 "
             "(96 GB HBM2e, 500 W), FSDP 8, local batch 2 x 8,192, selective activation checkpointing (op), eager: "
             "**5,762 tokens/s/GPU**, 82.4 GiB, 33-39% MFU; Table 3: the same on 128 GPUs, **5,605**.", "",
             *narrative(rows, value), "",
             "## The input that reproduces 5,762 tokens/s/GPU, per sharding and recompute charged", "",
             *table(rows), "",
             "## tokens/s/GPU on 8 GPUs as a function of the input (fsdp-reshard)", "", *sweep(value), "",
             "## The step's terms at the calibrated input (fsdp-reshard, op-level selective)", "",
             *breakdown(value), ""]
    OUT.write_text("\n".join(lines))
    print(f"calibrated MFU input {value:.4f}; wrote {OUT.relative_to(ROOT)} (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
