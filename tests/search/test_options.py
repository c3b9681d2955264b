"""search/options.py: every share of the time limit and every state cap a phase uses comes from the
Budget of the SearchOptions the search was given, never from the module-level default.

Two kinds of check. With the clock of the phase that hands out the shares frozen, each phase is recorded
and must get exactly its share of a Budget whose shares all differ from the defaults. And with every read
of a Budget's fields recorded, real searches given such a Budget must read every share and cap they use
from it and none from `BUDGET`."""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Iterator

import pytest

from zbsearch.core.errors import InfeasibleError
from zbsearch.core.objective import Objective
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.search import budget as budget_module
from zbsearch.search.budget import BUDGET, Budget
from zbsearch.search import options as options_module
from zbsearch.search.options import Progress, SearchOptions
from zbsearch.search.partition import polish as polish_module, search
from zbsearch.search.recompute import search as recompute
from zbsearch.search.partition.search import SplitRequest
from zbsearch.search.problem import Problem, make_problem
from zbsearch.search.solve import driver
from zbsearch.search.solve import starts as starts_module
from zbsearch.search.solve.grid import GridRun
from zbsearch.search.solve.starts import Improved

GiB = 2**30
NOW = 1000.0
T = 40.0


def _other_budget() -> Budget:
    """Every field of the default Budget changed (shares stay below one, caps stay positive)."""
    changed: dict[str, Any] = {}
    for f in dataclasses.fields(Budget):
        value = getattr(BUDGET, f.name)
        changed[f.name] = value * 0.5 + 0.01 if isinstance(value, float) else value + 7
    other = Budget(**changed)
    assert all(getattr(other, f.name) != getattr(BUDGET, f.name) for f in dataclasses.fields(Budget))
    return other


OTHER = _other_budget()


def _frozen_clock() -> types.SimpleNamespace:
    return types.SimpleNamespace(monotonic=lambda: NOW)


def _v_problem() -> Problem:
    """A V-shape under a limit: the periodic start applies, so every phase of a solve runs."""
    return make_problem(uniform_profile(1, 1, 1, p=2, m=4), "1p", "makespan", "v")


def test_each_phase_of_a_solve_gets_its_share_of_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, Any] = {}

    def bounds(problem: Problem, passes: Any, **kwargs: Any) -> Any:
        calls["bounds"] = kwargs
        return real_bounds(problem, passes, chains=False, nesting=False)

    def tuned(problem: Problem, start: Any, deadline: float, seed: int) -> Improved:
        calls["tune"], calls["seed"] = deadline, seed
        return Improved(start)

    def periodic(problem: Problem, start: Any, deadline: float) -> Improved:
        calls["periodic"] = deadline
        return Improved(start)

    def refine(grid: Any, start: Any, lb: float) -> GridRun:
        calls["grid"] = grid
        return GridRun(start, lb, (), "not run")

    def lns(problem: Problem, best: Any, until: float, options: SearchOptions) -> Any:
        calls["lns"], calls["lns_options"] = until, options
        return best, None, None

    real_bounds = driver.rank_bounds
    monkeypatch.setattr(driver, "time", _frozen_clock())
    monkeypatch.setattr(options_module, "time", _frozen_clock())
    monkeypatch.setattr(driver, "rank_bounds", bounds)
    monkeypatch.setattr(driver, "objective_bound", lambda bounds, objective: 0.0)  # keeps every phase running
    monkeypatch.setattr(starts_module, "time", _frozen_clock())  # the better starts run in solve/starts.py
    monkeypatch.setattr(starts_module, "tuned_start", tuned)
    monkeypatch.setattr(starts_module, "periodic_start", periodic)
    monkeypatch.setattr(driver, "refine", refine)
    monkeypatch.setattr(driver, "_improve_by_lns", lns)
    options = SearchOptions(time_limit=T, workers=3, seed=5, resolution=11, budget=OTHER)
    driver.solve(_v_problem(), options)
    assert calls["bounds"] == {"deadline": pytest.approx(NOW + OTHER.nest_share * T), "budget": OTHER}
    assert calls["tune"] == pytest.approx(NOW + OTHER.tune_share * T) and calls["seed"] == 5
    assert calls["periodic"] == pytest.approx(NOW + OTHER.periodic_share * T)
    grid = calls["grid"]
    assert grid.options is options and grid.deadline == pytest.approx(T * (1 - OTHER.reserve) - 0.5)
    assert calls["lns"] == pytest.approx(NOW + T * (1 - OTHER.reserve) - 0.5) and calls["lns_options"] is options


def test_the_recompute_phases_end_at_their_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recompute, "time", _frozen_clock())
    for per_microbatch, walk, kept in ((True, OTHER.recompute_choice_walk_share, OTHER.recompute_choice_share),
                                       (False, OTHER.recompute_walk_share, 0.0)):
        walk_end, polish_end = recompute._phase_ends(NOW + T, per_microbatch, OTHER)
        assert walk_end == pytest.approx(NOW + walk * T)
        assert polish_end == pytest.approx(NOW + T - (OTHER.split_bound_share + kept) * T)


def test_the_joint_searches_before_recompute_get_the_plain_share(monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[SearchOptions] = []

    def joint(request: SplitRequest, options: SearchOptions) -> InfeasibleError:
        given.append(options)
        return InfeasibleError("no split fits")

    monkeypatch.setattr(recompute, "joint", joint)
    with pytest.raises(InfeasibleError):
        recompute.search_with_recompute(_request(("linear",)), SearchOptions(time_limit=T, seed=3, budget=OTHER))
    assert [o.time_limit for o in given] == pytest.approx([OTHER.recompute_plain_share * T] * 2)
    assert all(o.budget is OTHER and o.seed == 3 for o in given)


def test_the_split_search_scores_and_polishes_for_its_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    searches: list[Any] = []
    polished: list[SearchOptions] = []
    real_search, real_solve = search.SplitSearch, polish_module.solve

    def split_search(*args: Any) -> Any:
        searches.append(real_search(*args))
        return searches[-1]

    def solve(problem: Problem, options: SearchOptions, starts: Any = None, bounds: Any = None,
              first: Any = None) -> Any:
        polished.append(options)
        return real_solve(problem, options.with_time(0.0), starts, bounds, first)

    def go_on(result: Any, options: SearchOptions, bounds: Any = None) -> Any:  # a second split that cannot win leaves it its time
        polished.append(options)
        return result

    monkeypatch.setattr(search, "time", _frozen_clock())
    monkeypatch.setattr(polish_module, "time", _frozen_clock())
    monkeypatch.setattr(options_module, "time", _frozen_clock())
    monkeypatch.setattr(search, "SplitSearch", split_search)
    monkeypatch.setattr(polish_module, "solve", solve)
    monkeypatch.setattr(polish_module, "go_on", go_on)
    search.search_splits(_request(("linear",)), SearchOptions(time_limit=T, budget=OTHER))
    assert searches[0].deadline == pytest.approx(NOW + OTHER.split_search_share * T)
    assert all(s.budget is OTHER for s in searches)
    # With the clock frozen, the last split polished is given all the time left before the bound's share.
    assert polished and polished[-1].time_limit == pytest.approx((1 - OTHER.split_bound_share) * T)
    assert all(o.budget is OTHER for o in polished)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, set[str]]]:
    """Every field read on the default Budget and on OTHER while the test runs."""
    seen: dict[str, set[str]] = {"default": set(), "other": set()}
    names = {f.name for f in dataclasses.fields(Budget)}
    plain = object.__getattribute__

    def spy(self: Budget, name: str) -> Any:
        if name in names:
            if self is budget_module.BUDGET:
                seen["default"].add(name)
            elif self is OTHER:
                seen["other"].add(name)
        return plain(self, name)

    monkeypatch.setattr(Budget, "__getattribute__", spy)
    yield seen


def _request(placements: tuple[str, ...], cap: str = "24GiB") -> SplitRequest:
    return SplitRequest(_layered(), 2, placements, cap, Objective.MAKESPAN, "auto")


def _layered() -> Profile:
    """Six blocks of unequal cost, each with a full recompute option, and the two end layers."""
    def layer(name: str, kind: str, F: float, option: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "kind": kind, "F": F, "B": F, "W": F, "mem_B": 3.0 * GiB,
                               "mem_W": 3.0 * GiB, "mem_W_torch": 3.0 * GiB, "static_bytes": 1.0 * GiB,
                               "out_bytes": 1.0}
        if option:
            out["recompute"] = [{"level": "full", "time": F / 2, "mem_B": 0.5 * GiB, "mem_W": 3.0 * GiB}]
        return out

    blocks = [layer(f"layers.{i}", "decoder", 1.0 + 0.25 * (i % 3)) for i in range(6)]
    return Profile.from_dict({
        "name": "options-toy", "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB}], "microbatches": 4,
        "time_unit": "unit", "memory_unit": "bytes", "comm": 0.0, "memory_model": "torch-runtime",
        "layers": [layer("tok_embeddings", "embedding", 0.1, False), *blocks, layer("output", "output", 0.2, False)],
        "source": {"kind": "estimated", "method": "hand-made for tests"}})


def test_a_solve_reads_its_budget_and_never_the_default(reads: dict[str, set[str]]) -> None:
    heard: list[Progress] = []
    result = driver.solve(_v_problem(), SearchOptions(time_limit=2, workers=1, progress=heard.append, budget=OTHER))
    assert result.objective > 0 and heard
    assert reads["default"] == set()
    # The heuristic start meets the bound here: the bound's shares and caps are read, no later phase's.
    assert {"nest_share", "reserve", "rank_walk_states", "exact_combinations", "nesting_walk_states",
            "deepest_walk_states"} <= reads["other"]


def test_every_search_reads_every_field_of_its_budget_and_never_the_default(reads: dict[str, set[str]]) -> None:
    options = SearchOptions(time_limit=4, workers=1, budget=OTHER)
    driver.solve_placements([_v_problem()], options)
    recompute.search_with_recompute(_request(("linear", "interleaved:2")), options)
    recompute.search_with_recompute(_request(("v",)), options, per_microbatch=False)
    assert reads["default"] == set()
    assert reads["other"] == {f.name for f in dataclasses.fields(Budget)}
