"""partition/polish.py: which splits the solver polishes, and where a later one cannot win, that its time goes
on solving the best further (driver.go_on), and that go_on's record is one solve's: its start, both bounds."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from zbsearch.core.ir import vshape
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.placement import parse_placement
from zbsearch.core.profile import uniform_profile
from zbsearch.search.options import SearchOptions
from zbsearch.search.partition import polish as polish_module
from zbsearch.search.partition.scored import Scored
from zbsearch.search.problem import Problem
from zbsearch.search.solve.driver import go_on, solve
from zbsearch.sim.validate import check


@dataclass
class _Answer:  # what polish reads of a solve's answer
    problem: Any
    objective: float
    lower_bound: float


class _Search:
    proven: dict = {}

    def leaf_bound(self, placement, chains=False):
        return lambda counts: 50.0


@pytest.mark.parametrize("runner_up_bound, solved, went_on", [
    (95.0, ["best"], True),                   # above the best's plan (90): it cannot win
    (85.0, ["best", "runner-up"], False),
])
def test_a_split_that_cannot_beat_the_plan_in_hand_leaves_its_time_to_the_best(
        monkeypatch: pytest.MonkeyPatch, runner_up_bound: float, solved: list[str], went_on: bool) -> None:
    placement = parse_placement("linear", 3)
    problems = {name: SimpleNamespace(placement=placement, name=name) for name in ("best", "runner-up")}
    ranked = [Scored(placement, (3, 3, 3), "balanced", 100.0, 1.0, problems["best"], start=object()),
              Scored(placement, (4, 3, 2), "even", 110.0, 1.0, problems["runner-up"], start=object())]
    calls: list[tuple[str, float]] = []

    def fake_solve(problem, options, given, bounds, first):
        calls.append((problem.name, options.time_limit))
        return _Answer(problem, 90.0 if problem.name == "best" else 92.0, 80.0)

    def fake_go_on(result, options, bounds):
        calls.append(("go on " + result.problem.name, options.time_limit))
        return _Answer(result.problem, 88.0, 80.0)

    monkeypatch.setattr(polish_module, "solve", fake_solve)
    monkeypatch.setattr(polish_module, "go_on", fake_go_on)
    monkeypatch.setattr(polish_module, "problem_bounds",
                        lambda problem, options: SimpleNamespace(lower=runner_up_bound))
    results, origins = polish_module.polish(_Search(), ranked, SearchOptions(), time.monotonic() + 10.0)
    assert [name for name, _ in calls if not name.startswith("go on")] == solved
    assert any(name == "go on best" for name, _ in calls) is went_on
    if went_on:
        # the best's share is 50/110 of the 10 s (its start's distance to its bound against both's); the fakes
        # take no time, so going on gets the rest: the runner-up's share too
        assert calls[0][1] == pytest.approx(10.0 * 50 / 110, abs=0.5) and calls[-1][1] == pytest.approx(10.0, abs=0.5)
        assert [r.objective for r in results] == [88.0] and origins[id(results[0])] == "balanced"
    else:
        assert sorted(r.objective for r in results) == [90.0, 92.0]


def test_going_on_from_an_answer_keeps_its_start_and_never_gets_worse() -> None:
    prof = uniform_profile(1.0, 2.0, 1.0, 0.0, p=4, m=8)
    placement = vshape(4)
    # the heuristic start 52.5 against a bound 37.7; CP-SAT took it to 50.5 in 3 s here
    problem = Problem(prof, placement, 8, parse_mem_limit("0.6p", prof, placement), "makespan")
    first = solve(problem, SearchOptions(time_limit=0.0, workers=1))
    further = go_on(first, SearchOptions(time_limit=3.0, workers=1))
    assert further.objective <= first.objective
    assert further.start_heuristic == first.start_heuristic
    assert further.heuristic_objective == first.heuristic_objective
    assert further.lower_bound >= first.lower_bound and further.lower_bound <= further.objective
    assert further.solve_seconds >= first.solve_seconds
    assert check(further.schedule, problem.profile, problem.limit).ok
    if further.objective < first.objective:
        assert further.schedule.name == "zbsearch" and further.details.grid_rounds


def test_a_split_with_no_better_starts_is_solved_from_its_scored_heuristic_schedule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A split found by the layer moves has its heuristic schedule but no tuned or periodic start; solve goes on
    from that schedule. Run again inside the polish's few seconds, the heuristics tried one greedy variant:
    deepseek-v2-lite p=8 at 80 s polished a split scored 840,359 us into a 909,520 us plan."""
    placement = parse_placement("linear", 3)
    start = object()
    ranked = [Scored(placement, (3, 3, 3), "least-bound + layer moves", 100.0, 1.0,
                     SimpleNamespace(placement=placement, name="moved"), start=start)]
    seen: list[Any] = []

    def fake_solve(problem, options, given, bounds, first):
        seen.append((given, first))
        return _Answer(problem, 90.0, 80.0)

    monkeypatch.setattr(polish_module, "solve", fake_solve)
    monkeypatch.setattr(polish_module, "problem_bounds", lambda problem, options: SimpleNamespace(lower=50.0))
    polish_module.polish(_Search(), ranked, SearchOptions(), time.monotonic() + 10.0)
    assert seen == [(None, start)]


def test_solve_goes_on_from_the_heuristic_start_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from zbsearch.search.solve import driver

    prof = uniform_profile(1.0, 2.0, 1.0, 0.0, p=4, m=8)
    placement = vshape(4)
    problem = Problem(prof, placement, 8, parse_mem_limit("0.6p", prof, placement), "makespan")
    first = solve(problem, SearchOptions(time_limit=0.0, workers=1))
    given = driver.Start(first.start_heuristic, first.schedule, first.timeline, first.objective)

    def no_heuristics(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the heuristics ran again")

    monkeypatch.setattr(driver, "heuristic_start", no_heuristics)
    again = solve(problem, SearchOptions(time_limit=1.0, workers=1), first=given)
    assert again.objective <= first.objective
    check(again.schedule, problem.profile, problem.limit)
