"""Where a search spends its time (zbsearch/search/budget.py): the worst case its docstring states is
what the default shares add up to, every share leaves CP-SAT and the polish some time, and `solve`
spends the tuning share it is given (none given, none found past the tuning's uniform starts)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from zbsearch.core.ir import linear
from zbsearch.core.memory import parse_mem_limit
from zbsearch.search import budget as budget_module
from zbsearch.search.options import SearchOptions
from zbsearch.search.budget import BUDGET, Budget
from zbsearch.search.greedy.options import GreedyOptions
from zbsearch.search.greedy.tune import uniform_starts
from zbsearch.search.problem import Problem
from zbsearch.search.solve.driver import solve
from zbsearch.sim.validate import check
from random_pipelines import integer_stages


@pytest.mark.parametrize("budget,relaxed,worst", [
    # By hand: nest x (2 when relaxed, else 1) + tune + periodic + reserve.
    (Budget(), True, 2 * 0.30 + 0.15 + 0.10 + 0.10),
    (Budget(), False, 0.30 + 0.15 + 0.10 + 0.10),
    (Budget(nest_share=0.2, tune_share=0.1, periodic_share=0.05, reserve=0.05), True, 0.4 + 0.1 + 0.05 + 0.05),
    (Budget(nest_share=0.2, tune_share=0.1, periodic_share=0.05, reserve=0.05), False, 0.2 + 0.1 + 0.05 + 0.05),
    (Budget(nest_share=0, tune_share=0, periodic_share=0, reserve=0), True, 0.0),
    # Fields that are not shares of the phases before CP-SAT do not count.
    (Budget(split_search_share=0.9, split_bound_share=0.9, cpsat_seconds_per_pass=5.0), True, 0.95),
])
def test_worst_before_cpsat_adds_the_shares_before_it(budget: Budget, relaxed: bool, worst: float) -> None:
    assert budget.worst_before_cpsat(relaxed) == pytest.approx(worst, abs=1e-12)
    # The pair phase, where a small capped problem runs it, adds its share.
    assert budget.worst_before_cpsat(relaxed, pair=True) == pytest.approx(worst + budget.pair_share, abs=1e-12)


def test_the_docstring_states_the_default_shares_worst_case() -> None:
    # "2 x 0.30 + 0.15 + 0.10 + 0.20 + 0.10 = 1.15 of T ...; with the bound taken once and no pair phase,
    # 0.65": the figures the module's docstring gives are the defaults', so changing a share without the
    # docstring fails here.
    doc = " ".join((budget_module.__doc__ or "").split())
    x = r"([\d.]+)"
    stated = re.search(rf"2 x {x} \+ {x} \+ {x} \+ {x} \+ {x} = {x} of T.*?no pair phase, {x}\.", doc)
    assert stated is not None
    nest, tune, periodic, pair, reserve, twice, once = (float(x) for x in stated.groups())
    assert (nest, tune, periodic, pair, reserve) == (BUDGET.nest_share, BUDGET.tune_share, BUDGET.periodic_share,
                                                     BUDGET.pair_share, BUDGET.reserve)
    assert twice == pytest.approx(BUDGET.worst_before_cpsat(relaxed=True, pair=True), abs=5e-3)
    assert once == pytest.approx(BUDGET.worst_before_cpsat(relaxed=False), abs=5e-3)


def test_the_default_shares_leave_time_for_cpsat_and_the_partition_polish() -> None:
    assert BUDGET == Budget()
    assert BUDGET.worst_before_cpsat(relaxed=True) < 1
    assert BUDGET.worst_before_cpsat(relaxed=False) < BUDGET.worst_before_cpsat(relaxed=True)
    # A partition search scores splits, polishes the best, then bounds: the first and last leave a middle.
    assert BUDGET.split_search_share + BUDGET.split_bound_share < 1
    shares = [f.name for f in dataclasses.fields(Budget) if f.name.endswith("_share") or f.name == "reserve"]
    assert all(0 < getattr(BUDGET, name) < 1 for name in shares)
    # Caps are counts, and the partition search's walk is the larger (each rank is walked once there).
    assert BUDGET.split_rank_walk_states > BUDGET.rank_walk_states > 0


def test_a_budget_is_a_frozen_record() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        BUDGET.tune_share = 0.5  # type: ignore[misc]
    assert dataclasses.replace(BUDGET, tune_share=0.5).tune_share == 0.5 and BUDGET.tune_share == 0.15


def test_solve_spends_the_tuning_share_it_is_given() -> None:
    # Random pipeline 23 (p=4, m=8) at 0.75p: the best heuristic spans 3,694 and the bound is 3,662. The
    # tuning's descent finds a per-rank policy at 3,662 on its 27th engine run, after its 18 uniform starts
    # (which a zero share still evaluates, but none of which beats the heuristic here). Both budgets skip
    # CP-SAT, and 2 s leaves the grid and the large-neighbourhood search too little time to run, so the
    # tuning share is the only difference. The tuning gets 0.6 s of the 2 s, twice the default share: about 30
    # runs of a few ms each; with the default 0.3 s it failed once in a full-suite run (not reproduced alone).
    profile = integer_stages(23, 4, 8)
    problem = Problem(profile, linear(4), 8, parse_mem_limit("0.75p", profile), "span")
    assert len(uniform_starts(problem.placement, GreedyOptions("list"))) == 18
    base = Budget(cpsat_seconds_per_pass=1e6, tune_share=2 * BUDGET.tune_share)

    tuned = solve(problem, SearchOptions(time_limit=2, workers=1, budget=base))
    assert tuned.details.tuned_start is not None
    assert tuned.details.tuned_start.found_at_evaluation > 18
    assert tuned.start_heuristic == "greedy(list,per-rank)"
    assert check(tuned.schedule, profile, problem.limit).ok

    untuned = solve(problem, SearchOptions(time_limit=2, workers=1, budget=dataclasses.replace(base, tune_share=0.0)))
    assert untuned.details.tuned_start is None
    assert not untuned.start_heuristic.startswith("greedy(list,per-rank")
    assert untuned.objective > tuned.objective
    assert tuned.details.tuned_start.replaced == untuned.start_heuristic  # it improved on the same start
    assert untuned.lower_bound == tuned.lower_bound      # the bounds do not depend on the tuning share
