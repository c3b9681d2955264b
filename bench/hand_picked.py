"""Whether `--recompute auto-layers` is at least as fast as a fixed choice a user picks by hand (issue 39,
deliverable 5: "a fixed choice that beats it is within its reach").

The case: the 80-layer Llama-3-70B-like profile of bench/time_limit.py (estimates; every time and byte
divided by 8 to emulate tensor parallelism 8) with four sequences per microbatch, p=2, m=8, FSDP over 8
data-parallel ranks, a 40 GiB cap: nothing fits without recompute (the least cap is 46.1 GiB). The searched
rows run `zbsearch solve` at the default 30 s; the hand-picked grid solves the split 41,41 on the linear
placement with the first k0 layers of rank 0 and the first k1 of rank 1 recomputed (k0, k1 = 8, 12, ..., 40)
at 10 s each, as a user trying the tool's own options would.

    python bench/hand_picked.py              # about 4 minutes on 2 cores
    python bench/hand_picked.py --cap 44GiB

Writes results/hand_picked.md and results/hand_picked.csv. One run each on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_common import RESULTS, log, write_csv, write_text  # noqa: E402
from time_limit import _zbsearch, tp_profile  # noqa: E402

P, M, MICRO_BATCH = 2, 8, 4
COMMON = ["-p", str(P), "-m", str(M), "--dp-shard", "8", "--sharding", "fsdp", "--json"]
SEARCHED = (("auto-layers", ["--partition", "auto", "--recompute", "auto-layers"]),
            ("auto (per microbatch)", ["--partition", "auto", "--recompute", "auto"]),
            ("auto-layers, linear only", ["--partition", "auto", "--placement", "linear", "--recompute", "auto-layers"]))
GRID = range(8, 41, 4)
SPLIT = (41, 41)  # tok_embeddings + layers.0-39, layers.40-79 + output


def solve(profile: Path, cap: str, args: list[str]) -> dict[str, Any]:
    """One solve as the CLI runs it: the plan's facts, or the one-line error."""
    t0 = time.monotonic()
    done = _zbsearch("solve", "--profile", str(profile), *COMMON, "--mem-limit", cap, *args)
    wall = round(time.monotonic() - t0, 1)
    if done.returncode != 0:
        return {"makespan_s": None, "wall_s": wall, "error": done.stderr.strip().splitlines()[-1][:200]}
    report = json.loads(done.stdout)
    partition = report.get("partition") or {}
    return {"makespan_s": report["makespan"] / 1e6, "bound_s": report["lower_bound"] / 1e6, "wall_s": wall,
            "placement": report["placement"], "split": ",".join(map(str, partition.get("layers_per_chunk", []))),
            "recomputed": ",".join(str(len(r.get("recomputed", []))) for r in partition.get("ranks", [])),
            "start": report.get("start_heuristic"), "error": ""}


def hand_args(k0: int, k1: int) -> list[str]:
    first = SPLIT[0] - 1  # rank 0's layers after the embedding
    chosen = f"layers.0..layers.{k0 - 1},layers.{first}..layers.{first + k1 - 1}"
    return ["--partition", f"fixed:{SPLIT[0]},{SPLIT[1]}", "--placement", "linear", "--recompute", f"fixed:{chosen}",
            "--time-limit", "10"]


def markdown(cap: str, searched: list[dict[str, Any]], hand: list[dict[str, Any]]) -> str:
    fits = [h for h in hand if h["makespan_s"] is not None]
    best = min(fits, key=lambda h: h["makespan_s"]) if fits else None
    lines = ["# Searched recompute against a hand-picked fixed choice (issue 39, deliverable 5)\n",
             "Regenerate: `python bench/hand_picked.py` (one run per row, a shared 2-core machine). The profile: "
             "bench/time_limit.py's 80-layer Llama-3-70B-like estimate (not a measurement), every time and byte over "
             f"8 (tensor parallelism 8 emulated), --micro-batch {MICRO_BATCH}; every solve adds "
             f"`{' '.join(COMMON)} --mem-limit {cap}`. Seconds are the plan's iteration time.\n",
             "| search | iteration s | bound s | wall s | placement | layers per chunk | layers recomputed per rank | "
             "start | error |", "|---|---|---|---|---|---|---|---|---|"]
    for row in searched + ([{**best, "name": f"best hand-picked (k0={best['k0']}, k1={best['k1']})"}] if best else []):
        it = "-" if row["makespan_s"] is None else f"{row['makespan_s']:.3f}"
        bound = f"{row['bound_s']:.3f}" if row.get("bound_s") is not None else "-"
        lines.append(f"| {row['name']} | {it} | {bound} | {row['wall_s']} | {row.get('placement', '')} | "
                     f"{row.get('split', '')} | {row.get('recomputed', '')} | {row.get('start', '')} | {row['error']} |")
    lines.append(f"\nHand-picked grid: split {SPLIT[0]},{SPLIT[1]} on the linear placement, the first k0 layers of "
                 f"rank 0 and the first k1 of rank 1 recomputed, k0 and k1 in {GRID.start}..{GRID.stop - 1} by "
                 f"{GRID.step}, 10 s each: {len(fits)} of {len(hand)} fit.")
    if best:
        for row in searched:
            if row["makespan_s"] is not None:
                lines.append(f"- {row['name']}: {row['makespan_s'] / best['makespan_s'] - 1:+.2%} against the best "
                             "hand-picked choice.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cap", default="40GiB", help="the per-rank memory limit")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        profile = tp_profile(P, M, Path(tmp) / "l70-mb4.json", micro_batch=MICRO_BATCH)
        searched = []
        for name, extra in SEARCHED:
            searched.append({"name": name, **solve(profile, args.cap, extra)})
            log(f"{name}: {searched[-1]['makespan_s']} s in {searched[-1]['wall_s']} s")
        hand = [{"name": f"hand k0={k0} k1={k1}", "k0": k0, "k1": k1, **solve(profile, args.cap, hand_args(k0, k1))}
                for k0 in GRID for k1 in GRID]
    write_text(RESULTS / "hand_picked.md", markdown(args.cap, searched, hand))
    columns = ["name", "k0", "k1", "makespan_s", "bound_s", "wall_s", "placement", "split", "recomputed", "start", "error"]
    write_csv(RESULTS / "hand_picked.csv", "python bench/hand_picked.py", [
        {c: row.get(c, "") for c in columns} for row in searched + hand], columns)


if __name__ == "__main__":
    main()
