"""What the memory-levers study's throttled rows would reach if recompute cost no time: the joint search
(split, placement and schedule) on every layer at its least time (no recompute) with its least memory
(the option holding least from F until I, and from I until W). That is the relaxation the bound over
every recompute choice is taken on, searched for a plan here: where even this plan misses a row's target,
the target needs more than choosing recompute well (or a better schedule search); where it meets it,
what separates the study's plan from the target is recompute's time and the search.

    python bench/free_recompute.py              # the study's throttled rows, about 25 s each on 2 cores
    python bench/free_recompute.py --from-csv   # rewrite the report from the CSV

Reads results/memory_levers.csv (which rows are throttled, their targets and the study's plans; run
bench/memory_levers.py first), writes results/free_recompute.{md,csv}. Estimated profiles, as the study's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_levers import ms_of, row_of, target_ms, throttled  # noqa: E402
from memory_levers_rows import COLUMNS, PLACEMENTS, study_profile  # noqa: E402
from results_common import RESULTS, log, read_csv, write_csv, write_text  # noqa: E402

from zbsearch.core.errors import InfeasibleError  # noqa: E402
from zbsearch.search.options import SearchOptions  # noqa: E402
from zbsearch.search.recompute.search import joint, least_memory  # noqa: E402
from zbsearch.search.partition.search import SplitRequest  # noqa: E402

COMMAND = "python bench/free_recompute.py"
SECONDS = 25.0  # as the study's joint searches
CSV_COLUMNS = ("row", "no_recompute_ms", "target_ms", "per_microbatch_ms", "free_ms", "free_placement",
               "free_bound_ms", "free_meets_target", "target_below_free_bound", "seconds")


def study_rows() -> list[list[dict[str, Any]]]:
    """The study's records, six columns a row, in its order."""
    records = read_csv(RESULTS / "memory_levers.csv")
    return [records[k:k + len(COLUMNS)] for k in range(0, len(records), len(COLUMNS))]


def free_row(recs: list[dict[str, Any]]) -> dict[str, Any]:
    row = row_of(recs[0])
    prof = study_profile(row)
    relaxed = replace(prof, layers=least_memory(prof.layers or ()))
    t0 = time.monotonic()
    found = joint(SplitRequest(relaxed, row.p, PLACEMENTS, f"{row.cap_gib:g}GiB", "makespan"), SearchOptions(time_limit=SECONDS))
    goal = target_ms(recs)
    out = {"row": row.label, "no_recompute_ms": ms_of(recs[0]), "target_ms": round(goal, 1),
           "per_microbatch_ms": ms_of(recs[5]), "seconds": round(time.monotonic() - t0, 1)}
    if isinstance(found, InfeasibleError):
        return {**out, "free_ms": "", "free_placement": f"infeasible: {found}", "free_bound_ms": "",
                "free_meets_target": "no", "target_below_free_bound": ""}
    free, bound = found.objective / 1e3, found.lower_bound / 1e3
    return {**out, "free_ms": round(free, 1), "free_placement": found.problem.placement.name,
            "free_bound_ms": round(bound, 1), "free_meets_target": "yes" if free <= goal else "no",
            "target_below_free_bound": "yes" if goal < bound * (1 - 1e-9) else "no"}


def _number(x: Any) -> str:
    return "" if x in ("", None) else f"{float(x):,.1f}"


def markdown(records: list[dict[str, Any]]) -> str:
    met = [r["row"] for r in records if r["free_meets_target"] == "yes"]
    lines = [
        "# The study's throttled rows with recompute at no time cost", "",
        f"Regenerate: `{COMMAND}` (joint search {SECONDS:g} s a row; one run, 2 cores; reads "
        "results/memory_levers.csv).", "",
        "Each memory-throttled row of results/memory_levers.md, searched again with every layer at its least "
        "time (no recompute) and its least memory (full recompute's): recompute that costs nothing. This is "
        "the relaxation the study's bound over every recompute choice is taken on; here the joint search "
        "looks for a plan of it too. A target the free plan misses needs more than a good recompute choice "
        "(or a better schedule search); a target below its bound, which holds for every split, recompute "
        "choice and schedule on the study's placements, is out of reach. Targets: 5% under the plan without "
        "recompute and 10% under uniform full + handcrafted. Estimated profiles; every search time-limited "
        "(cells move by about 2% between runs).", "",
        "| row | no recompute ms | target ms | per microbatch ms | free recompute ms (placement) | its bound ms "
        "| free meets target | target below its bound |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        cells = [r["row"]] + [_number(r[k]) for k in ("no_recompute_ms", "target_ms", "per_microbatch_ms")]
        cells += [f"{_number(r['free_ms'])} ({r['free_placement']})", _number(r["free_bound_ms"]),
                  r["free_meets_target"], r["target_below_free_bound"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Free recompute meets the target on {len(met)} of {len(records)} throttled rows"
              + (f" ({'; '.join(met)})." if met else "."), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv == ["--from-csv"]:  # rewrite the report from the CSV
        write_text(RESULTS / "free_recompute.md", markdown(read_csv(RESULTS / "free_recompute.csv")))
        return
    rows = [recs for recs in study_rows() if recs[0]["fits"] == "yes" and throttled(recs[0])]
    records = []
    for recs in rows:
        records.append(free_row(recs))
        r = records[-1]
        log(f"{r['row']}: free {r['free_ms']} ms, bound {r['free_bound_ms']}, target {r['target_ms']}, "
            f"per microbatch {r['per_microbatch_ms']} ({r['seconds']:.0f} s)")
    write_csv(RESULTS / "free_recompute.csv", COMMAND, records, CSV_COLUMNS)
    write_text(RESULTS / "free_recompute.md", markdown(records))


if __name__ == "__main__":
    main(sys.argv[1:])
