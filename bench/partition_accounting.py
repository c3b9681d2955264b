"""The partition study under the two memory accountings side by side: which rows torch's runtime accounting
(every estimate's default since issue 28) throttles, i.e. makes slower than the paper's accounting did.

    python bench/partition_accounting.py     # reads results/partition_study.csv and partition_study_paper.csv

Prints a markdown table (pasted into results/partition_study.md and results/memory_levers.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_common import RESULTS, read_csv  # noqa: E402

THROTTLED = 0.01  # slower by more than the run-to-run noise of these time-limited searches (about 1-2%)


def joint_rows(name: str) -> dict[tuple[str, str, str], dict[str, str]]:
    return {(r["model"], r["p"], r["cap_gib"]): r for r in read_csv(RESULTS / name) if r["column"] == "joint search"}


def main() -> None:
    torch, paper = joint_rows("partition_study.csv"), joint_rows("partition_study_paper.csv")
    print("| model | p | cap GiB | joint ms, paper | joint ms, torch-runtime | change | peak GiB, torch-runtime | "
          "throttled |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, row in torch.items():
        old = paper.get(key)
        if old is None or not row["iteration_ms"] or not old["iteration_ms"]:
            continue
        a, b = float(old["iteration_ms"]), float(row["iteration_ms"])
        change = b / a - 1
        print(f"| {key[0]} | {key[1]} | {key[2]} | {a:,.1f} | {b:,.1f} | {change:+.1%} | {row['peak_gib']} | "
              f"{'yes' if change > THROTTLED else 'no'} |")


if __name__ == "__main__":
    main()
