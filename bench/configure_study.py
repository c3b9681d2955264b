"""The whole-run planning study (issue 41, deliverable 8): three runs planned with `configure`, each with the
chosen plan, the best plan when only 1F1B-family schedules are allowed (what Mist- and Megatron-style planners
search), and torchtitan's published configuration where there is one, evaluated in the same cost model.
Writes results/configure.md, .csv and .json.

    python bench/configure_study.py                   # every case, both modes, then the report
    python bench/configure_study.py --case llama3-8b --mode all    # one search (resumes its results file)
    python bench/configure_study.py --report          # the report from finished results files only

Each search appends every finished shape to its results file under --work (default /tmp/configure_study), so
an interrupted run resumes where it stopped; a rerun with everything finished reads it back in seconds. The
wall time and load of every search run are appended to the work folder's timing.jsonl and reported. The files
of the run behind results/configure.md are kept in results/configure_runs/ (gzip): unpack them into --work
(`mkdir -p W && for f in results/configure_runs/*.gz; do gunzip -c $f > W/$(basename $f .gz); done`) and
`--report --work W` writes the report again without solving anything.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zbsearch.plan.wholerun.cluster import Cluster, make_cluster  # noqa: E402
from zbsearch.plan.wholerun.configure import configure  # noqa: E402
from zbsearch.plan.wholerun.cost import PlanChoices  # noqa: E402
from zbsearch.plan.wholerun.evaluate import evaluate_shape  # noqa: E402
from zbsearch.plan.wholerun.outcome import Outcome  # noqa: E402
from zbsearch.plan.wholerun.search import Settings  # noqa: E402
from zbsearch.plan.wholerun.shape import RunShape, Space  # noqa: E402
from zbsearch.plan.wholerun.shape_result import ShapeResult  # noqa: E402
from zbsearch.plan.wholerun.workload import Workload  # noqa: E402
from zbsearch.profiling.presets import PRESETS  # noqa: E402
from zbsearch.search.options import SearchOptions  # noqa: E402

MODES = ("all", "1f1b-family")
JOBS = 2  # shapes solved at once
CPSAT_WORKERS = 1  # CP-SAT threads per shape: two shapes at once on the two cores this ran on


@dataclass(frozen=True)
class Case:
    """One study case: a preset on `gpus` H100 with a global batch of `batch` sequences of the preset's
    length, the shapes searched (`space`, `narrowed`: why, where narrowed), the per-shape time limit, and
    torchtitan's configuration (`torchtitan`, its recompute, what it is, the published tokens/s/GPU)."""

    name: str
    preset: str
    gpus: int
    batch: int
    time_limit: float
    space: Space = Space()
    narrowed: str = ""
    torchtitan: RunShape | None = None
    torchtitan_recompute: str = "full"
    torchtitan_note: str = ""
    published: float | None = None

    def workload(self) -> Workload:
        return Workload(PRESETS[self.preset].shape, self.batch, preset=self.preset).check()

    def cluster(self) -> Cluster:
        return make_cluster("h100", self.gpus).check()

    @property
    def seq(self) -> int:
        return PRESETS[self.preset].shape.seq


CASES = (
    Case("llama3-8b", "llama3-8b", 64, 512, 30.0,
         torchtitan=RunShape(1, 1, 64, 2, 4, "fsdp-reshard"), torchtitan_recompute="full",
         torchtitan_note="torchtitan's published 8B recipe (Tables 1 and 3: FSDP only, local batch 2, selective "
                         "recompute) at this batch: 4 accumulation steps of 2 sequences per GPU; selective (op) "
                         "recompute has no block option on an SDPA estimate, so full is charged"),
    Case("llama3-70b", "llama3-70b", 256, 512, 30.0,
         space=Space(tp=(4, 8)),
         narrowed="tensor-parallel degrees 4 and 8 (of 1, 2, 4, 8): 228 shapes of 488. The whole space (488 shapes, "
                  "30 s) took 16.1 minutes on 2026-12-04 and chose the same plan, with a certificate of 8.4%: its "
                  "least bounds are t = 1 and 2 shapes (33 below the chosen plan, at 22.7-24.6 s) whose plans took "
                  "30.7-41.7 s, where 70B per GPU leaves little activation room and the capped bound is weak (issue 39)",
         torchtitan=RunShape(8, 1, 32, 16, 1, "fsdp-reshard"), torchtitan_recompute="full",
         torchtitan_note="torchtitan's published 70B run (Table 4: FSDP 32 x TP 8, local batch 16, full recompute; "
                         "torch.compile and Float8, which this model does not have: 829 tokens/s/GPU)",
         published=829.0),
    Case("mixtral-8x7b", "mixtral-8x7b", 64, 512, 20.0),
)


def choices(mode: str) -> PlanChoices:
    return PlanChoices(schedules=mode)


def results_path(work: Path, case: Case, mode: str) -> Path:
    return work / f"{case.name}.{mode}.jsonl"


def search(case: Case, mode: str, work: Path) -> Outcome[ShapeResult]:
    """One case's search in one mode, resuming its results file; its wall time and load are logged."""
    work.mkdir(parents=True, exist_ok=True)
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    settings = Settings(workers=JOBS, results=results_path(work, case, mode),
                        fixed=case.torchtitan if mode == "all" else None)
    outcome = configure(case.workload(), case.cluster(), case.space, choices(mode),
                        SearchOptions(time_limit=case.time_limit, workers=CPSAT_WORKERS, seed=0), settings)
    record = {"case": case.name, "mode": mode, "wall_s": time.monotonic() - t0, "jobs_ran": outcome.ran,
              "load_start": load0, "load_end": os.getloadavg()[0], "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    if outcome.ran:  # a search read back whole from its results file ran nothing: not a run
        with open(work / "timing.jsonl", "a") as out:
            out.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)
    return outcome


def torchtitan_fixed(case: Case) -> ShapeResult | None:
    """torchtitan's configuration with its own recompute (no search: p = 1 has no schedule)."""
    if case.torchtitan is None:
        return None
    return evaluate_shape(case.workload(), case.cluster(), case.torchtitan, SearchOptions(time_limit=case.time_limit),
                          PlanChoices(recompute=case.torchtitan_recompute))


def timings(work: Path) -> list[dict[str, Any]]:
    path = work / "timing.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=[c.name for c in CASES])
    parser.add_argument("--mode", action="append", choices=MODES)
    parser.add_argument("--work", type=Path, default=Path("/tmp/configure_study"))
    parser.add_argument("--report", action="store_true", help="only write the report (every search resumed)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.case or c.name in args.case]
    if not args.report:
        for case in cases:
            for mode in args.mode or MODES:
                search(case, mode, args.work)
    if args.report or (not args.case and not args.mode):
        from configure_report import write_report  # noqa: E402 (bench/, beside this script)
        write_report(CASES, args.work)


if __name__ == "__main__":
    main()
