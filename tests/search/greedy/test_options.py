"""What a greedy variant is and what an engine hands back (zbsearch/search/greedy/options.py): the list
engine's per-rank policy a variant implies, the variant's label, a `Step` as the action it stands for,
an `EngineResult`'s cost under each objective, and `fits`, the one comparison of a level to a limit."""

from __future__ import annotations

import math

import pytest

from zbsearch.core.errors import PreconditionError
from zbsearch.core.ir import Action, B, F, Kind, dualpipe, overlap
from zbsearch.core.objective import Objective
from zbsearch.search.greedy.candidates import greedy_variants
from zbsearch.search.greedy.options import EngineResult, GreedyOptions, RankPolicy, Step, fits
from zbsearch.sim.rank_state import RankClock


@pytest.mark.parametrize("options,rank,position,p,policy", [
    # No warm-up cap: memory only; w_fill on means "fill", off means "fit".
    (GreedyOptions("list"), 2, 2, 4, RankPolicy(None, False, "fill")),
    (GreedyOptions("list", b_first=True, w_fill=False), 0, 0, 4, RankPolicy(None, True, "fit")),
    # warmup k: k x (p - position) in flight, the position where the route enters the rank (1F1B's p-r).
    (GreedyOptions("list", warmup=1), 0, 0, 4, RankPolicy(4, False, "fill")),
    (GreedyOptions("list", warmup=1), 3, 3, 4, RankPolicy(1, False, "fill")),
    (GreedyOptions("list", warmup=2), 1, 1, 4, RankPolicy(6, False, "fill")),
    # DualPipe's second route enters rank 0 at position p-1: 1F1B's depth there is 1.
    (GreedyOptions("list", warmup=1), 0, 3, 4, RankPolicy(1, False, "fill")),
    # Never below one microbatch in flight.
    (GreedyOptions("list", warmup=0), 0, 0, 4, RankPolicy(1, False, "fill")),
])
def test_policy_follows_the_variants_switches(options: GreedyOptions, rank: int, position: int, p: int,
                                              policy: RankPolicy) -> None:
    assert options.policy(rank, position, p) == policy


def test_per_rank_policies_override_the_switches() -> None:
    ranks = (RankPolicy(3, True, "eager"), RankPolicy(None, False, "fit"))
    options = GreedyOptions("list", b_first=False, w_fill=True, warmup=2, ranks=ranks)
    assert [options.policy(r, 0, 2) for r in range(2)] == list(ranks)
    assert options.policy(1, 1, 2) is ranks[1]          # the position does not matter then


@pytest.mark.parametrize("options,label", [
    (GreedyOptions(), "rounds,no-bubble,f-first,w-fill"),
    (GreedyOptions("rounds", True, True, False), "rounds,bubble-ok,b-first,w-fit"),
    (GreedyOptions("rounds", warmup=1), "rounds,no-bubble,f-first,w-fill,warmup=1"),
    # The list engine has no bubble switch to name.
    (GreedyOptions("list", True, b_first=True, w_fill=False, warmup=2), "list,b-first,w-fit,warmup=2"),
    (GreedyOptions("list", pairs=True, by_route=True), "list,f-first,w-fill,f&b-pairs,admit-by-route"),
    # Per-rank policies replace the uniform switches in the name; pairs and admission stay.
    (GreedyOptions("list", b_first=True, warmup=1, ranks=(RankPolicy(),)), "list,per-rank"),
    (GreedyOptions("list", pairs=True, ranks=(RankPolicy(),)), "list,per-rank,f&b-pairs"),
    (GreedyOptions("list", by_route=True, ranks=(RankPolicy(),)), "list,per-rank,admit-by-route"),
])
def test_label_names_every_switch_that_matters(options: GreedyOptions, label: str) -> None:
    assert options.label == label


def test_every_variant_candidates_tries_has_its_own_label() -> None:
    # Candidates are named greedy(<label>): two variants with one label would be two schedules under one name.
    variants = [o for o in greedy_variants(dualpipe(4), pairs=True) + greedy_variants(None)
                if isinstance(o, GreedyOptions)]
    assert len({o.label for o in variants}) == len(set(variants))


@pytest.mark.parametrize("step,action,text", [
    (Step(2, Kind.F, 5), Action(2, Kind.F, 5), "2F5"),
    (Step(0, Kind.B, 1), B(0, 1), "0I1"),
    (Step(3, Kind.W, 0), Action(3, Kind.W, 0), "3W0"),
    (Step(1, Kind.FULL_B, 4), Action(1, Kind.FULL_B, 4), "1B4"),
    # A pair: the F's chunk and microbatch first, then the B's.
    (Step(0, Kind.OVERLAP, 3, 1, 0), overlap(F(0, 3), B(1, 0)), "(0F3;1I0)OVERLAP_F_B"),
])
def test_step_action_is_the_pass_or_the_pair_it_stands_for(step: Step, action: Action, text: str) -> None:
    assert step.action() == action
    assert str(step.action()) == text
    assert Action.parse(text) == action


def test_a_step_is_a_single_pass_unless_it_names_a_pair() -> None:
    assert Step(1, Kind.F, 2) == (1, Kind.F, 2, -1, -1)
    assert Step(1, Kind.F, 2).action().pair == ()
    assert Step(0, Kind.OVERLAP, 3, 1, 0).action().passes() == (F(0, 3), B(1, 0))


def _result(first_start: list[float], last_end: list[float]) -> EngineResult:
    return EngineResult([[] for _ in first_start], first_start, last_end, [0.0] * len(first_start))


@pytest.mark.parametrize("first_start,last_end,makespan,span", [
    # By hand: makespan is the latest end; span the longest own first-start-to-last-end.
    ([0.0, 3.0], [10.0, 12.0], 12.0, 10.0),
    ([0.0, 1.0, 2.0], [9.0, 8.0, 14.0], 14.0, 12.0),
    ([5.0], [7.5], 7.5, 2.5),
])
def test_cost_is_the_makespan_or_the_largest_span(first_start: list[float], last_end: list[float],
                                                  makespan: float, span: float) -> None:
    res = _result(first_start, last_end)
    assert res.cost(Objective.MAKESPAN) == res.cost("makespan") == makespan
    assert res.cost(Objective.SPAN) == res.cost("span") == span


def test_cost_refuses_an_unknown_objective() -> None:
    with pytest.raises(PreconditionError, match="objective 'bubble' is not known"):
        _result([0.0], [1.0]).cost("bubble")


def test_from_clocks_reads_each_ranks_first_start_and_free_time() -> None:
    busy, idle = RankClock(), RankClock()
    busy.run(2.0, 3.0)        # runs [2, 5]
    busy.run(4.0, 1.0)        # its input is there, the rank is not: [5, 6]
    res = EngineResult.from_clocks([[Step(0, Kind.F, 0), Step(0, Kind.F, 1)], []], [busy, idle], [1.0, 0.0])
    assert res.first_start == [2.0, 0.0]      # a rank that ran nothing counts from 0
    assert res.last_end == [6.0, 0.0]
    assert res.cost("makespan") == 6.0 and res.cost("span") == 4.0


@pytest.mark.parametrize("level,cap,ok", [
    (1.0, 1.0, True),                        # exactly on the limit
    (0.1 + 0.2, 0.3, True),                  # 0.30000000000000004: one round-off past, still in
    (1.0 + 1e-13, 1.0, True),                # within the relative slack of 1e-12
    (1.0 + 1e-10, 1.0, False),               # far tighter than the validator's 1e-9
    (2.0, 1.5, False),
    (0.0, 0.0, True),
    (1e-14, 0.0, False),                     # the absolute slack is 1e-15
    (1e300, math.inf, True),                 # no limit
])
def test_fits_allows_round_off_and_nothing_more(level: float, cap: float, ok: bool) -> None:
    assert fits(level, cap) is ok
