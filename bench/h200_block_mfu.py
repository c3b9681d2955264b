"""The MFU a measured block reaches, by model, tensor-parallel share t and microbatch size b: every
`profiles/h200-*-measured.json`, its blocks' median F + B + W against the estimator's FLOP count of the same
block (profiling/transformer.py block_flops) over the GPU's dense bf16 peak. Writes results/h200_block_mfu.md.

    python bench/h200_block_mfu.py

The profiles were measured by bench/gpu_llama_profiles.sh and bench/gpu_extra_shapes.sh on one H200.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zbsearch.profiling.hardware import GPUS  # noqa: E402
from zbsearch.profiling.request import LlamaShape, MoeShape  # noqa: E402
from zbsearch.profiling.transformer import block_flops  # noqa: E402


def shape_of(model: dict[str, object]) -> LlamaShape:
    record = MoeShape if model.get("model") == "moe" else LlamaShape
    known = {f.name for f in fields(record)}
    return record(**{k: v for k, v in model.items() if k in known})  # type: ignore[arg-type]


def row(path: Path) -> dict[str, object]:
    data = json.loads(path.read_text())
    details = data["details"]
    shape = shape_of(details["model"])
    blocks = [layer for layer in data["layers"] if layer["kind"] == "decoder"]
    times = {k: statistics.median(layer[k] for layer in blocks) for k in ("F", "B", "W")}
    flops = block_flops(shape, len(blocks) // 2)
    peak = GPUS["h200"].peak_tflops["bf16"] * 1e6  # FLOP per microsecond
    mfu = {k: flops[k] / (peak * times[k]) for k in times}
    total = sum(flops.values()) / (peak * sum(times.values()))
    return {"file": path.name, "model": details["model"].get("preset", shape.model), "t": details.get("tensor_parallel", 1),
            "b": shape.micro_batch, "seq": shape.seq, "blocks": len(blocks), **{f"{k} ms": times[k] / 1e3 for k in times},
            **{f"MFU {k}": mfu[k] for k in mfu}, "MFU F+B+W": total, "date": data["source"].get("date", "")}


def main() -> None:
    rows = sorted((row(p) for p in (ROOT / "profiles").glob("h200-*-measured.json")),
                  key=lambda r: (str(r["model"]), int(r["t"]), int(r["b"]), -int(r["blocks"])))  # type: ignore[call-overload]
    head = ["model", "t", "b", "seq", "blocks", "F ms", "B ms", "W ms", "MFU F", "MFU B", "MFU W", "MFU F+B+W"]
    lines = ["# Block MFU measured on one H200, by tensor-parallel share and microbatch size", "",
             "Written by `python bench/h200_block_mfu.py` from the measured profiles under profiles/ "
             "(bench/gpu_llama_profiles.sh, bench/gpu_extra_shapes.sh; torch 2.11 + CUDA 13.0, bf16, CUDA events, "
             "median of 10 after 3 warm-up runs, measured 2026-12-04). MFU = the estimator's FLOP count of the block "
             "(profiling/transformer.py; attention's s^2 terms included, norms and activations not) over the "
             "989.4 TFLOP/s dense bf16 peak x the measured time. t: one of t tensor-parallel ranks' share of the block "
             "computed alone (no collectives). The median block of each profile.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [f"{r[h]:.3g}" if isinstance(r[h], float) else str(r[h]) for h in head]
        lines.append("| " + " | ".join(cells) + " |")
    (ROOT / "results" / "h200_block_mfu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
