"""Whether `zbsearch solve` keeps its time limit on a deep model (issue 39, deliverable 4).

The case: an estimated Llama-3-70B-like profile (80 layers, hidden 8192, 64 heads, 8 key/value heads,
sequence 8192, vocabulary 128256; H100 at MFU 0.4), with tensor parallelism 8 emulated by dividing every
time and byte of every layer, stage and recompute option by 8. Three solves, each at time limits 10, 60 and
120 s, run as the CLI (a fresh process each, so the wall time includes Python's and OR-Tools' start-up):

    solve -p 4 -m 64  --dp-shard 8 --partition auto --mem-limit auto
    solve -p 8 -m 128 --dp-shard 8 --partition auto --mem-limit auto
    solve -p 4 -m 64  --dp-shard 8 --partition auto --mem-limit auto --recompute auto-layers

    python bench/time_limit.py                      # every row: about 10 minutes
    python bench/time_limit.py --limits 10,60       # fewer limits
    python bench/time_limit.py --profile-only l70.json   # just write the p=4 profile

Writes results/time_limit.md and results/time_limit.csv: per row the limit, the wall time, their ratio,
the objective, the bound, whether each bound over every split completed and the load average before the
run. One run each: the machine is shared, and wall times move by a few per cent between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_common import RESULTS, ROOT, log, write_csv, write_text  # noqa: E402

TP = 8  # tensor parallelism emulated: every time and byte divided by this
SHAPE = ["--model", "llama", "--layers", "80", "--hidden", "8192", "--heads", "64", "--kv-heads", "8",
         "--seq", "8192", "--micro-batch", "1", "--vocab", "128256"]
# Every field that is a time or a byte count, on a layer, a stage and a recompute option.
LAYER_FIELDS = ("F", "B", "W", "full_backward", "mem_B", "mem_W", "static_bytes", "mem_kept_torch",
                "mem_kept_loss_torch", "mem_B_torch", "mem_W_torch", "out_bytes", "gather_bytes")
STAGE_FIELDS = ("F", "B", "W", "full_backward", "mem_B", "mem_W", "static_bytes", "mem_B_torch", "mem_W_torch",
                "mem_kept_torch", "overlap_f_b")
OPTION_FIELDS = ("time", "mem_B", "mem_W", "peak")
CASES = (("p=4 m=64", 4, 64, []), ("p=8 m=128", 8, 128, []),
         ("p=4 m=64 auto-layers", 4, 64, ["--recompute", "auto-layers"]))
LIMITS = (10.0, 60.0, 120.0)
COMMAND = "python bench/time_limit.py"


def _zbsearch(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "zbsearch", *args], env=env, capture_output=True, text=True,
                          check=False)


def _divide(record: dict[str, Any], fields: tuple[str, ...]) -> None:
    for key in fields:
        if isinstance(record.get(key), (int, float)):
            record[key] = record[key] / TP


def tp_profile(p: int, m: int, out: Path, micro_batch: int = 1) -> Path:
    """The estimated 80-layer profile at p stages and m microbatches of `micro_batch` sequences, every time
    and byte divided by TP."""
    shape = [str(micro_batch) if SHAPE[k - 1] == "--micro-batch" else x for k, x in enumerate(SHAPE)]
    done = _zbsearch("profile", "--estimate", "--gpu", "h100", "--mfu", "0.4", *shape, "-p", str(p), "-m", str(m),
                     "-o", str(out))
    if done.returncode != 0:
        raise SystemExit(f"zbsearch profile failed: {done.stderr}")
    prof = json.loads(out.read_text())
    for layer in prof["layers"]:
        _divide(layer, LAYER_FIELDS)
        for option in layer.get("recompute", []):
            _divide(option, OPTION_FIELDS)
    for stage in prof["stages"]:
        _divide(stage, STAGE_FIELDS)
    prof["comm"] = [c / TP for c in prof["comm"]]
    for row in prof.get("comm_table", []):
        row["bytes"] /= TP
        row["time"] /= TP
    prof["name"] += f"-tp{TP}"
    prof["source"]["method"] += (f"; then every time and byte of every layer, stage and recompute option divided by "
                                 f"{TP} to emulate tensor parallelism {TP} (bench/time_limit.py)")
    out.write_text(json.dumps(prof, indent=1))
    return out


def run_case(profile: Path, p: int, m: int, extra: list[str], limit: float) -> dict[str, Any]:
    """One solve as the CLI runs it, timed on the wall clock."""
    load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
    t0 = time.monotonic()
    done = _zbsearch("solve", "--profile", str(profile), "-p", str(p), "-m", str(m), "--dp-shard", "8",
                     "--partition", "auto", "--mem-limit", "auto", "--time-limit", f"{limit:g}", *extra, "--json")
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"zbsearch solve failed: {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    by_placement = report.get("any_split_bound_by_placement") or {}
    complete = {name: how.get("walk_complete") for name, how in by_placement.items()}
    return {"limit_s": limit, "wall_s": round(wall, 1), "ratio": round(wall / limit, 3),
            "objective": report.get("objective_value"), "bound": report.get("lower_bound"),
            "gap": report.get("gap"), "solve_seconds": report.get("solve_seconds"),
            "cpsat": report.get("cpsat_status"),
            "bounds_complete": ";".join(f"{k}={v}" for k, v in complete.items()), "load": load}


def markdown(rows: list[dict[str, Any]], missing: list[str]) -> str:
    lines = [
        "# The time limit on an 80-layer model\n",
        f"Regenerate: `{COMMAND}` (one run per row, on a shared 2-core machine: the load average before each run "
        "is given; wall times move by a few per cent between runs).\n",
        "The profile: `zbsearch profile --estimate --gpu h100 --mfu 0.4 --model llama --layers 80 --hidden 8192 "
        "--heads 64 --kv-heads 8 --seq 8192 --micro-batch 1 --vocab 128256` (a Llama-3-70B-like shape; estimates, "
        f"not measurements), every time and byte divided by {TP} to emulate tensor parallelism {TP}. Every solve "
        "adds `--dp-shard 8 --partition auto --mem-limit auto --json`. 'wall' is the whole process, start-up "
        "included (about 1 s of Python and OR-Tools imports); objective and bound in the profile's unit (us); "
        "'CP-SAT': the answer's cpsat_status; 'bounds complete': per placement, whether the bound over every split finished its walk "
        "(False: cut short at its deadline, still a valid bound).\n",
        "| case | limit s | wall s | wall / limit | objective | bound | gap | CP-SAT | bounds complete | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        gap = "" if r["gap"] is None else f"{r['gap']:.2%}"
        lines.append(f"| {r['case']} | {r['limit_s']:g} | {r['wall_s']:.1f} | {r['ratio']:.2f} | "
                     f"{r['objective']:.0f} | {r['bound']:.0f} | {gap} | {r['cpsat']} | {r['bounds_complete']} | {r['load']} |")
    if missing:
        lines.append("\nNot run: " + ", ".join(missing) + ".")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limits", default=",".join(f"{x:g}" for x in LIMITS), help="time limits in seconds")
    ap.add_argument("--cases", default="", help="comma list of case indices (0, 1, 2); default all")
    ap.add_argument("--profile-only", type=Path, help="write the p=4 profile here and stop")
    args = ap.parse_args()
    if args.profile_only:
        tp_profile(4, 64, args.profile_only)
        return
    limits = [float(x) for x in args.limits.split(",")]
    picked = [CASES[int(k)] for k in args.cases.split(",")] if args.cases else list(CASES)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        profiles = {(p, m): tp_profile(p, m, Path(tmp) / f"l70-p{p}.json") for _, p, m, _ in picked}
        for limit in limits:
            for name, p, m, extra in picked:
                row = {"case": name, **run_case(profiles[(p, m)], p, m, extra, limit)}
                log(f"{name} limit {limit:g}: wall {row['wall_s']} s ({row['ratio']}x), bounds {row['bounds_complete']}")
                rows.append(row)
    missing = [f"{name} at {limit:g} s" for limit in LIMITS if limit not in limits for name, *_ in picked]
    names = {name for name, *_ in picked}
    missing += [name for name, *_ in CASES if name not in names]
    write_text(RESULTS / "time_limit.md", markdown(rows, missing))
    write_csv(RESULTS / "time_limit.csv", COMMAND, rows, list(rows[0]))


if __name__ == "__main__":
    main()
