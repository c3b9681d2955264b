"""Where a search spends its time: every share of the time limit and every state cap, in one record.

A solve (search/solve/driver.py) with time limit T, in order:

1. the heuristic start: every greedy variant and handcrafted schedule on the placement, no more greedy
   variants than one that fits past `start_share` x T (a dozen take 2.5 s on the V-shape at p=8, m=128);
2. the rank bounds, whose deepest-rank window walk may take `nest_share` x T (no chain walk starts past
   it); where the profile lets passes pair or fuse, the bound is taken a second time on the relaxed
   passes, with another `nest_share` x T;
3. better starts, only while the start is above the bound: the per-rank tuned list greedy for
   `tune_share` x T, then on chunked placements under a limit the periodic start for
   `periodic_share` x T;
4. on a small problem under a limit, the pair phase (solve/pair_phase.py) for `pair_share` x T;
5. CP-SAT on a refining grid, then the large-neighbourhood search, until (1 - `reserve`) x T - 0.5 s;
   a model is skipped when fewer than `cpsat_seconds_per_pass` seconds per pass are left; on a capped
   chunked model too large for the pair phase, a grid round that has proven nothing beyond the bound after
   `grid_give_up_share` of the time left (`coarse_give_up_share` on a coarse grid) hands the rest to the
   large-neighbourhood search;
6. the last `reserve` x T: re-timing and validating what CP-SAT returned.

Each phase stops early when it settles, and what it leaves goes to the next. In the worst case (a
relaxed bound walked to its deadline twice, both starts running out, the pair phase on a small capped
problem) 2 x 0.30 + 0.15 + 0.10 + 0.20 + 0.10 = 1.15 of T is spoken for before CP-SAT starts (the phases
then leave it none); with the bound taken once and no pair phase, 0.65.

A partition search (search/partition/search.py) with time limit T over P placements first scores every
placement's named splits (balanced, then even: past `split_search_share` x T with one greedy variant each),
then the other seeds (the least-bound seed's DP included) and one-layer moves from each placement's best
(for at most `split_moves_share` x T) until `split_search_share` x T; gives the named
splits the tuned and periodic starts for `tune_share` and `periodic_share` x T / P, as `--partition NAME`
gives them, until (1 - `split_bound_share`) x T; polishes the best with `solve` until (1 - `split_bound_share`)
x T (a second split only while time is left and its bound could beat the plan in hand, else the best again;
with less than a second, from its heuristic schedule as it is), and
takes the bound over every split in what is left: its DPs, tables and walks stop there, and one cut short is
a weaker bound that still holds over every split (walk_complete False). Not timed: one greedy variant per
named split and a walk already running at a deadline (`python bench/time_limit.py`, results/time_limit.md).

Every share below names the command that measured it; run it on another machine to check the share
holds there. Every phase reads the Budget of the SearchOptions it is given (search/options.py);
`BUDGET` is only their default.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """Shares are fractions of the caller's time limit; caps are counts of states or seconds."""

    # Kept back for re-timing and validating CP-SAT's answer at the end.
    reserve: float = 0.10
    # CP-SAT cannot stop before its presolve and first full-model search are done: about 2.9 ms per
    # pass (26.6 s at p=32, m=96: 9,216 passes; `python bench/solve_bench.py --only v-large`). With
    # less time left than this per pass, the model is skipped rather than overrun.
    cpsat_seconds_per_pass: float = 0.003
    # The heuristic start: past this share, no more greedy variants than one that fits (at p=8, m=128 on
    # the V-shape a split's dozen variants took 2.5 s of a 10 s limit; `python bench/time_limit.py`).
    start_share: float = 0.10
    # The per-rank tuning of the list greedy (greedy/tune.py); it stops sooner when its search
    # settles, in about a second on p=8, m=25 (`python bench/solve_bench.py --only hetero-random`).
    tune_share: float = 0.15
    # The periodic start (greedy/modulo.py), where it applies (chunked placements under a limit).
    periodic_share: float = 0.10
    # The pair phase (solve/pair_phase.py): where memory binds on a small problem, the bound with two
    # ranks kept whole, before the grid rounds (`python bench/capped_pair_bound.py`: pairs proven in 2-50 s
    # on 96-192 passes).
    pair_share: float = 0.20
    # A grid round on a small model under a memory limit (solve/grid.py's _give_up) stops after this share
    # of the time left unless CP-SAT has proven more than the bound it started from; the large-neighbourhood
    # search takes the rest (`python bench/capped_optimum.py --family B --p 4`).
    grid_give_up_share: float = 0.3
    # The same on a model large enough to start on a coarse grid (more than 600 passes), whose orders the
    # windows re-time exactly (issue 39's example, results/never_worse.md).
    coarse_give_up_share: float = 0.5
    # The deepest rank's window walk (bounds/window_nesting.py): on the paper's V-shape at 1p it proves
    # the start optimal in 0.1 s (p=16, m=48) to about 5 s (p=32, m=256) (`python bench/solve_bench.py
    # --only v-large`).
    nest_share: float = 0.30
    # The partition search's scoring of splits before the best go to the solver, and the share kept for
    # the bound over every split at the end (`python bench/partition_study.py`).
    split_search_share: float = 0.45
    # Of that share, what the one-layer moves may take before the named splits' starts (the rest of the
    # moves come after them): at 25 s on p=8, m=32 the starts outlast the scoring share, and moves after
    # them got none (results/memory_levers.md: llama3-8b at 49 GiB 6,726.7 ms with no moves, 6,384.3 at
    # 0.1, 6,325.2 at 0.2; deepseek-v2-lite at 42 GiB, every block recomputed, 1,271.4 at 0.1 and 1,165.3
    # at 0.25). At 80 s, moves without a cap took 30 s and left the polish 5 s (deepseek-v2-lite,
    # results/partition_study.md: 835.4 and 836.3 ms at 0.1, 836.1 at 0.2); issue 39's example at 120 s,
    # 3,011,600 us at 0.1 and 3,042,156 at 0.25, inside the spread of single runs (results/never_worse.md).
    split_moves_share: float = 0.25
    split_bound_share: float = 0.15
    # --recompute auto and auto-layers (search/recompute/search.py): the joint searches without recompute
    # and with every layer recomputed (each `recompute_plain_share` x T, unless the caller ran them); the
    # shares below are of the time left after them. Per rank (auto-layers) the walks over recompute levels
    # take `recompute_walk_share`, the polish of the best end the rest but `split_bound_share`, kept for the
    # bound over every choice. Set by hand.
    recompute_plain_share: float = 0.25
    recompute_walk_share: float = 0.50
    # Per microbatch (auto), the walks take `recompute_choice_walk_share`, and the polish stops
    # `recompute_choice_share` (besides split_bound_share) before the end; the bound then takes about a
    # second, and the best plan's CP-SAT windows that choose the order and which microbatches recompute
    # (recompute/microbatches.choose_by_windows) take the rest. The windows find more than the walks
    # and the polish in the same seconds: on eight rows of `python bench/memory_levers.py` (T = 25 s),
    # a walk of 0.2 and windows of about 0.7 against the earlier 0.5 and 0.35 moved the plan by -5.3%
    # (llama3-8b p=8 36 GiB) to +0.4% (gemma2-2b p=4 25 GiB), -1.8% on mean (one run each against the
    # committed study; cells move by about 2% between runs). A walk of 0.3 with 0.45 of windows did no
    # better (deepseek-v2-lite p=8 42 GiB, paper accounting: 1,042.2 against 1,016.8 ms).
    recompute_choice_walk_share: float = 0.20
    recompute_choice_share: float = 0.55
    # States one rank's exact walk (bounds/rank_sequence.py) may expand in a solve before it gives up (no
    # bound): well under a second per rank in CPython. Tight limits keep the count small (few forwards in
    # flight); a rank with room for many, where the analytic start and end idle are already close, may run out.
    rank_walk_states: int = 20_000
    # The same walk in the partition search, ten times solve's: each rank is walked once however many
    # splits hold it. On the partition study's V-shapes it raised the bound over every split
    # (deepseek-v2-lite 42 GiB 911.0 -> 947.2 ms; `python bench/partition_study.py`).
    split_rank_walk_states: int = 200_000
    # The window nesting's walk of each rank but the deepest, and of the deepest: a chain of several
    # chunks (bounded by the caller's deadline, else `deepest_seconds`) or one chunk (no deadline).
    nesting_walk_states: int = 10_000
    deepest_walk_states: int = 50_000_000
    deepest_one_chunk_states: int = 100_000
    deepest_seconds: float = 3.0
    # The exact start- and end-idle combinations a rank bound enumerates before it falls back to the
    # per-chunk relaxation (bounds/analytic.py).
    exact_combinations: int = 2_000
    # The chunk ranges of an interleaved placement's first and last rank the bound over every split
    # tries one by one (partition/bounds.py); 30 layers at p=8, v=2 give about 2,000 per rank.
    end_rank_ranges: int = 20_000
    # Cells (about p x (layers - 2p) x (layers - p)^2) of one feasibility test of the interleaved two-round
    # DP, tested about 30 times: 30 layers at p=8 take 0.03 s, 62 at p=16 (1.1 M cells) 0.5 s; 100 at
    # p=16 (8 M) would take 4.5 s and is left to the other relaxations (timed on random layers).
    two_round_cells: int = 6_000_000

    def worst_before_cpsat(self, relaxed: bool, pair: bool = False) -> float:
        """The share of the time limit the phases before CP-SAT and the reserve may take at most (with the
        pair phase where `pair`).

        >>> b = Budget()
        >>> round(b.worst_before_cpsat(True, pair=True), 2), round(b.worst_before_cpsat(False), 2)
        (1.15, 0.65)
        """
        nest = self.nest_share * (2 if relaxed else 1)
        return nest + self.tune_share + self.periodic_share + (self.pair_share if pair else 0.0) + self.reserve


BUDGET = Budget()


def past(deadline: float | None) -> bool:
    """Whether `deadline` (a time.monotonic(); None: none) has passed: how every phase checks its share."""
    return deadline is not None and time.monotonic() >= deadline
