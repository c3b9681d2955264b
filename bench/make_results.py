"""Regenerate the research comparisons in results/: tables (Markdown and CSV) and figures (PNG and SVG).

    python bench/make_results.py                       # every section, about 25 minutes on 2 cores
    python bench/make_results.py --only unit,pareto    # some sections
    python bench/make_results.py --time-limit 20       # seconds per zbsearch solve (default 20)

Sections and the files each writes (every file starts with the command that regenerates it); each
section is a module beside this one (results_paper.py, results_unit.py, results_hetero.py,
results_pareto.py, sharing results_common.py):
- paper:  results/paper_reproduction.{md,csv}: the Zero Bubble paper's Table 5 (Qi et al., ICLR 2024,
          arXiv:2401.10241), all 12 setups (profiles/zb-paper-*.json), every handcrafted schedule and
          zbsearch at 1p and 2p under both objectives, next to the published figures.
- unit:   results/unit_time_p4_m8.{md,csv,png,svg}: every schedule at p=4, m=8, F=B=W=1, with idle
          time and peak memory per rank.
- hetero: results/hetero_study.{md,csv,png,svg} and results/pareto_hetero_p8_m24.{png,svg}: first stage
          1.2x, last stage 1.5x, comm 5% of F, M_W = M_B/2; where handcrafted schedules lose the most.
- pareto: results/pareto_1.5b_m24.{md,csv,png,svg}: bubble rate against peak activation memory for the
          paper's 1.5B, m=24 setup, zbsearch solved at a sweep of limits on two placements.

Solve times are wall-clock seconds on the machine that ran this, with other jobs sharing its 2 cores;
the bubble rates of zbsearch can differ slightly between runs when a solve stops on its time limit.
"""

from __future__ import annotations

import argparse
import sys
import time

from results_common import DEFAULT_TIME_LIMIT, RESULTS, log
from results_hetero import hetero_profile, hetero_section
from results_paper import paper_section
from results_pareto import pareto_section
from results_unit import unit_section

__all__ = ["SECTIONS", "hetero_profile", "main"]

SECTIONS = {"unit": unit_section, "pareto": pareto_section, "hetero": hetero_section, "paper": paper_section}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {', '.join(SECTIONS)}")
    ap.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, help="seconds per zbsearch solve")
    args = ap.parse_args(argv)
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        ap.error(f"unknown section(s) {unknown}: choose from {', '.join(SECTIONS)}")
    RESULTS.mkdir(exist_ok=True)
    for name in wanted:
        t0 = time.monotonic()
        SECTIONS[name](args)
        log(f"section {name}: {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
