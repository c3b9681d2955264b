"""Where the V-shape's gap under a byte cap comes from: one split, solved at caps from none down to
the partition study's tight one, with its own bound beside each plan.

    python bench/v_cap_sweep.py                   # five caps, 60 s each: about 5 minutes on 2 cores
    python bench/v_cap_sweep.py --time-limit 180

The split is the one that sets the V-shape bound over every split in the partition study's
Llama-3-8B-like p=8 row at 49 GiB (bench/partition_study.py; estimated H100 profile, m=32). Without a
cap zbsearch proves its optimum; as the cap tightens the plans move away from the bound, which hardly
moves: the one-rank bounds (bounds.py) do not see what the cap costs this split. Writes
results/v_cap_sweep.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from partition_rows import GiB  # noqa: E402
from partition_study import study_profile  # noqa: E402
from results_common import RESULTS, log, write_text  # noqa: E402
from zbsearch.search.options import SearchOptions  # noqa: E402
from zbsearch.search.partition.search import SplitRequest, search_splits  # noqa: E402

MODEL, RANKS = "llama3-8b", 8
SPLIT = (3, 2, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 2)
CAPS = (None, "65GiB", "58GiB", "53GiB", "49GiB")
COMMAND = "python bench/v_cap_sweep.py"


def row(cap: str | None, time_limit: float) -> dict:
    prof = study_profile(MODEL, RANKS)
    rule = "fixed:" + ",".join(map(str, SPLIT))
    t0 = time.monotonic()
    res = search_splits(SplitRequest(prof, RANKS, ("v",), cap, "makespan", rule), SearchOptions(time_limit=time_limit))
    tl, limit = res.timeline, res.problem.limit.per_rank
    return {"cap": cap or "none", "plan_ms": res.objective / 1e3, "bound_ms": res.lower_bound / 1e3,
            "gap": res.gap, "status": res.status, "start": res.start_heuristic,
            "start_ms": res.heuristic_objective / 1e3, "seconds": time.monotonic() - t0,
            "idle_ms": [(tl.last_end(r) - tl.first_start(r) - tl.work(r)) / 1e3 for r in range(RANKS)],
            "peak_room": [(tl.peak_memory(r) / GiB, limit[r] / GiB) for r in range(RANKS)]}


def markdown(rows: list[dict], time_limit: float) -> str:
    lines = [
        "# The V-shape under a byte cap: one split, caps from none to tight\n",
        f"Regenerate: `{COMMAND}{'' if time_limit == 60 else f' --time-limit {time_limit:g}'}` "
        f"(one run, 2 cores, {time_limit:g} s per cap).\n",
        f"Split (layers per chunk, route order): {','.join(map(str, SPLIT))} of the estimated H100 profile of "
        f"a Llama-3-8B-like model at p={RANKS}, m={4 * RANKS} (bench/partition_study.py; estimates, not "
        "measurements). It is the split that sets the V-shape bound over every split in the partition "
        "study's 49 GiB row. 'bound' is the split's own proven lower bound (bounds.py and CP-SAT); 'gap' is "
        "(plan - bound) / plan; idle and peak per rank are the plan's.\n",
        "| cap | plan ms | bound ms | gap | status | start | start ms | idle ms per rank | "
        "peak / activation room GiB per rank | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        idle = " ".join(f"{x:.0f}" for x in r["idle_ms"])
        peaks = " ".join(f"{a:.1f}/{b:.1f}" if b != float("inf") else f"{a:.1f}/-" for a, b in r["peak_room"])
        lines.append(f"| {r['cap']} | {r['plan_ms']:.1f} | {r['bound_ms']:.1f} | {r['gap']:.2%} | {r['status']} | "
                     f"{r['start']} | {r['start_ms']:.1f} | {idle} | {peaks} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per cap (default 60)")
    args = ap.parse_args()
    rows = []
    for cap in CAPS:
        rows.append(row(cap, args.time_limit))
        r = rows[-1]
        log(f"cap {r['cap']}: plan {r['plan_ms']:.1f} ms, bound {r['bound_ms']:.1f} ms, gap {r['gap']:.2%} "
            f"({r['seconds']:.0f} s)")
    write_text(RESULTS / "v_cap_sweep.md", markdown(rows, args.time_limit))


if __name__ == "__main__":
    main()
