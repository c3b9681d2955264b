"""Measured against estimated per-layer costs of the Llama-3-8B-like model, per tensor-parallel share.

For each t of --tp (default 1,2,4,8) it reads PROFILES/llama3-8b-tp{t}-measured.json (`zbsearch profile
--model llama3-8b --tp t --device cuda`) and PROFILES/llama3-8b-tp{t}-estimated.json (the same with
`--estimate --gpu h200`), as bench/gpu_llama_profiles.sh writes them, and writes OUT.md and OUT.csv
(default results/h200_llama3_8b): per t and layer kind (embedding, block, output) the measured F, B and W
against the estimate at its MFU and their ratio, the MFU the measurement implies (the estimate's FLOPs /
(dense peak x measured time); for the embedding, which does no matrix work, the share of the HBM bandwidth
its bytes imply), and activation memory per token, measured against estimated (mem_B, mem_W). A block's
numbers are the median over the model's blocks. It writes nothing when an input is missing or is not the
share it should be. Needs neither torch nor zbsearch:

    python bench/predicted_vs_measured.py --profiles DIR [--out results/h200_llama3_8b] [--tp 1,2,4,8] [--name N]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = (("embedding", "embedding"), ("decoder", "block"), ("output", "output"))
PASSES = ("F", "B", "W")
COLUMNS = ("t", "layer", "count", *(f"{p}_{w}" for p in PASSES for w in ("measured_us", "estimated_us", "ratio")),
           *(f"implied_mfu_{p}" for p in (*PASSES, "FBW")),
           *(f"{m}_{w}" for m in ("mem_B", "mem_W") for w in ("measured_per_token", "estimated_per_token", "ratio")),
           "F_min_us", "F_max_us")


class Refused(Exception):
    """An input that cannot be compared: missing, or not the share or model it should be."""


def paths(profiles: Path, t: int, name: str = "llama3-8b") -> tuple[Path, Path]:
    return profiles / f"{name}-tp{t}-measured.json", profiles / f"{name}-tp{t}-estimated.json"


def load_pair(profiles: Path, t: int, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    measured, estimated = (json.loads(p.read_text()) for p in paths(profiles, t, name))
    for data, kind in ((measured, "measured"), (estimated, "estimated")):
        share = data["details"].get("tensor_parallel", 1)
        if data["source"]["kind"] != kind or share != t:
            raise Refused(f"{data['name']}: a {data['source']['kind']} profile of tensor-parallel share {share}, "
                          f"expected a {kind} one of {t}")
    names = [[layer["name"] for layer in d["layers"]] for d in (measured, estimated)]
    if names[0] != names[1]:
        raise Refused(f"t={t}: the measured and estimated profiles list different layers")
    return measured, estimated


def _unraised_mem_B(layer: dict[str, Any]) -> float:
    """What the layer holds from F until B as measured or counted: build_profile may raise mem_B to mem_W
    (the format's mem_W <= mem_B) and keeps the value before in mem_B_torch."""
    return float(layer.get("mem_B_torch", layer["mem_B"]))


def _median(layers: list[dict[str, Any]], get: Any) -> float:
    return float(statistics.median(get(layer) for layer in layers))


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def kind_row(t: int, label: str, measured: list[dict[str, Any]], estimated: list[dict[str, Any]],
             est_profile: dict[str, Any], tokens: int) -> dict[str, Any]:
    """One row: the layers of one kind at one share, medians over them."""
    row: dict[str, Any] = {"t": t, "layer": label, "count": len(measured)}
    for p in PASSES:
        m, e = _median(measured, lambda layer: layer[p]), _median(estimated, lambda layer: layer[p])
        row.update({f"{p}_measured_us": m, f"{p}_estimated_us": e, f"{p}_ratio": _ratio(m, e)})
    details = est_profile["details"]
    peak = details["peak_tflops"] * 1e12  # FLOP/s
    bandwidth = details["memory_bandwidth"]  # bytes/s
    work = estimated[0]["details"].get("flops", {})
    moved = estimated[0]["details"].get("bytes_moved")
    for p in (*PASSES, "FBW"):
        passes = PASSES if p == "FBW" else (p,)
        seconds = sum(row[f"{q}_measured_us"] for q in passes) * 1e-6
        if moved is not None:  # the embedding: bytes over the bandwidth, not FLOPs over the peak
            amount, rate = sum(moved.get(q, 0) for q in passes), bandwidth
        else:
            amount, rate = sum(work.get(q, 0) for q in passes), peak
        row[f"implied_mfu_{p}"] = amount / (rate * seconds) if seconds and amount else None
    for key, get in (("mem_B", _unraised_mem_B), ("mem_W", lambda layer: float(layer["mem_W"]))):
        m, e = _median(measured, get) / tokens, _median(estimated, get) / tokens
        row.update({f"{key}_measured_per_token": m, f"{key}_estimated_per_token": e, f"{key}_ratio": _ratio(m, e)})
    fbw = [layer["F"] for layer in measured]
    row.update(F_min_us=min(fbw), F_max_us=max(fbw))
    return row


def rows_of(t: int, measured: dict[str, Any], estimated: dict[str, Any]) -> list[dict[str, Any]]:
    model = measured["details"]["model"]
    tokens = model["micro_batch"] * model["seq"]
    out = []
    for kind, label in KINDS:
        m = [layer for layer in measured["layers"] if layer["kind"] == kind]
        e = [layer for layer in estimated["layers"] if layer["kind"] == kind]
        if m:
            out.append(kind_row(t, label, m, e, estimated, tokens))
    return out


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)


def tables(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["## Time per microbatch (us; a block's: the median over the blocks)", "",
             "| t | layer | n | F measured | F estimated | ratio | B measured | B estimated | ratio | "
             "W measured | W estimated | ratio | F min..max |", "|---" * 13 + "|"]
    for r in rows:
        cells = [r["t"], r["layer"], r["count"]]
        for p in PASSES:
            cells += [_fmt(r[f"{p}_measured_us"], 4), _fmt(r[f"{p}_estimated_us"], 4), _fmt(r[f"{p}_ratio"])]
        cells.append(f"{_fmt(r['F_min_us'], 4)}..{_fmt(r['F_max_us'], 4)}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "## The MFU the measurement implies (the estimate's FLOPs / (dense peak x measured time); "
              "embedding: its bytes / (HBM bandwidth x measured time))", "",
              "| t | layer | F | B | W | F+B+W |", "|---" * 6 + "|"]
    for r in rows:
        cells = [r["t"], r["layer"], *(_fmt(r[f"implied_mfu_{p}"], 3) for p in (*PASSES, "FBW"))]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "## Activation memory (bytes per token; a block's: the median over the blocks)", "",
              "| t | layer | mem_B measured | mem_B estimated | ratio | mem_W measured | mem_W estimated | ratio |",
              "|---" * 8 + "|"]
    for r in rows:
        cells = [r["t"], r["layer"]]
        for key in ("mem_B", "mem_W"):
            cells += [_fmt(r[f"{key}_measured_per_token"], 6), _fmt(r[f"{key}_estimated_per_token"], 6),
                      _fmt(r[f"{key}_ratio"])]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def _trend(values: list[tuple[int, float | None]]) -> str:
    known = [(t, v) for t, v in values if v is not None]
    return ", ".join(f"{v:.3g} at t={t}" for t, v in known) if known else "-"


def findings(rows: list[dict[str, Any]], pairs: dict[int, tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    """What the tables show, in sentences built from their numbers."""
    by = {(r["t"], r["layer"]): r for r in rows}
    ts = sorted(pairs)
    first_m, first_e = pairs[ts[0]]
    mfu = first_e["source"]["mfu"]
    out = ["## What it shows", ""]
    block = by.get((ts[0], "block"))
    if block:
        total_m = sum(block[f"{p}_measured_us"] for p in PASSES)
        total_e = sum(block[f"{p}_estimated_us"] for p in PASSES)
        out.append(f"* A block at t={ts[0]}: F+B+W measured {total_m:,.0f} us against {total_e:,.0f} us estimated at "
                   f"MFU {mfu} (measured / estimated {total_m / total_e:.3g}); the measurement implies MFU "
                   f"{_fmt(block['implied_mfu_FBW'])} (F {_fmt(block['implied_mfu_F'])}, B "
                   f"{_fmt(block['implied_mfu_B'])}, W {_fmt(block['implied_mfu_W'])}).")
    for label in ("block", "output"):
        trend = _trend([(t, by[(t, label)]["implied_mfu_FBW"]) for t in ts if (t, label) in by])
        out.append(f"* Implied MFU of the {label}'s F+B+W by share: {trend}. A constant MFU, the estimate's "
                   "assumption, would keep these equal; smaller shares do smaller matrix multiplies.")
    emb = [(t, by[(t, "embedding")]["implied_mfu_FBW"]) for t in ts if (t, "embedding") in by]
    out.append(f"* The embedding reaches {_trend(emb)} of the datasheet HBM bandwidth over its F and W (the estimate "
               "assumes all of it); its times are tens of microseconds, where launch overheads dominate.")
    out += _memory_findings(by, pairs, ts)
    kernels = sorted({layer["details"].get("attention_kernel", "-") for layer in first_m["layers"]
                      if layer["kind"] == "decoder"})
    out.append(f"* The attention kernel torch chose (each sdpa block's backward node): {', '.join(kernels)}.")
    out.append("* Every number is one tensor-parallel rank's share computed alone on one GPU: the collectives that "
               "join the ranks (each block's all-reduces or reduce-scatters and all-gathers) are in none of them.")
    return out


def _memory_findings(by: dict[tuple[int, str], dict[str, Any]],
                     pairs: dict[int, tuple[dict[str, Any], dict[str, Any]]], ts: list[int]) -> list[str]:
    out = []
    ratios = _trend([(t, by[(t, "block")]["mem_B_ratio"]) for t in ts if (t, "block") in by])
    out.append(f"* A block's activations from F until B, measured / estimated: {ratios}.")
    for t in ts:
        r = by.get((t, "block"))
        if r is None:
            continue
        model = pairs[t][0]["details"]["model"]
        d = 2 if pairs[t][0]["details"]["dtype"] in ("bf16", "fp16") else 4
        extra = r["mem_B_measured_per_token"] - r["mem_B_estimated_per_token"]
        f, h = model["ffn"] * d, model["hidden"] * d
        rest = (extra - f) / h
        out.append(f"* t={t}: a block holds {extra:+,.0f} bytes per token beyond the estimate = f*d "
                   f"{'+' if rest >= 0 else '-'} {abs(rest):.3g} h*d (f = {model['ffn']}, h = {model['hidden']}, d = {d}): plain SwiGLU "
                   "keeps silu's output, the f*d the estimate does not count; nn.RMSNorm in its composite form "
                   "would add 2 h*d (its normalized inputs), an s x s attention matrix far more.")
    return out


def header(pairs: dict[int, tuple[dict[str, Any], dict[str, Any]]]) -> list[str]:
    ts = sorted(pairs)
    measured, estimated = pairs[ts[0]]
    src, timing = measured["source"], measured["details"]["timing"]
    whole = measured["details"].get("whole_model", measured["details"]["model"])
    name = measured["details"]["model"].get("preset", whole["model"])
    return [f"# {name}-like on {src['device']}: measured against estimated, per tensor-parallel share", "",
            f"Written by bench/predicted_vs_measured.py from bench/gpu_llama_profiles.sh's profiles. Measured "
            f"{src['date']} with zbsearch's profiler (torch {src['torch']}, CUDA {src['cuda']}, {src['dtype']}; "
            f"{timing['warmup']} warm-up runs, median of {timing['repeats']}, {timing['timer']}). Estimated for "
            f"the {estimated['source']['gpu']} at {estimated['details']['peak_tflops']} TFLOP/s dense peak and MFU "
            f"{estimated['source']['mfu']}. Model: {whole['layers']} blocks, hidden {whole['hidden']}, "
            f"{whole['heads']} heads, {whole['kv_heads']} key/value heads, FFN {whole['ffn']}, vocabulary "
            f"{whole['vocab']}, sequence {whole['seq']}, micro-batch {whole['micro_batch']}; t = {', '.join(map(str, ts))}: "
            "one of t ranks' share of each layer (heads, key/value heads, FFN and vocabulary divided by t).", ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, required=True, help="folder of the measured and estimated profiles")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "h200_llama3_8b", help="OUT.md and OUT.csv")
    parser.add_argument("--tp", default="1,2,4,8", help="the shares, comma-separated")
    parser.add_argument("--name", default="llama3-8b", help="the profiles' files start NAME-tp{t}-")
    args = parser.parse_args(argv)
    shares = [int(x) for x in args.tp.split(",")]
    missing = [str(p) for t in shares for p in paths(args.profiles, t, args.name) if not p.is_file()]
    if missing:
        print(f"refusing to write: missing {', '.join(missing)}", file=sys.stderr)
        return 1
    try:
        pairs = {t: load_pair(args.profiles, t, args.name) for t in shares}
    except Refused as exc:
        print(f"refusing to write: {exc}", file=sys.stderr)
        return 1
    rows = [row for t in shares for row in rows_of(t, *pairs[t])]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = header(pairs) + tables(rows) + [""] + findings(rows, pairs)
    args.out.with_suffix(".md").write_text("\n".join(text) + "\n")
    with args.out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out.with_suffix('.md')} and {args.out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
