"""search/problem.py: placements from the strings users type, the list of passes every model reads, the
problem's own checks, and the integer grid the CP-SAT model runs on."""

from __future__ import annotations

import math

import pytest

from zbsearch.core.errors import InfeasibleError, ProfileError, ZbsearchError
from zbsearch.core.ir import Action, Kind, interleaved, linear, vshape
from zbsearch.core.memory import no_limit
from zbsearch.core.objective import OBJECTIVES
from zbsearch.core.placement import parse_placement
from zbsearch.core.plan_record import PlanRecord
from zbsearch.search.problem import Problem, make_problem, make_problems, on_grid
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.schedules import generate
from zbsearch.sim.simulate import simulate


def hetero(p: int = 3, m: int = 4) -> Profile:
    """Stages that differ in every cost, with a different hop per link."""
    stages = [{"F": 1.0 + r, "B": 2.0 + r / 2, "W": 0.5 + r / 4, "mem_B": 1.0 + r, "mem_W": 0.25 + r / 8}
              for r in range(p)]
    return Profile.from_dict({"stages": stages, "comm": [0.1 * (r + 1) for r in range(p - 1)], "microbatches": m,
                              "source": {"kind": "estimated", "method": "test"}})


# -- placements ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("linear", linear(4)), (" Linear ", linear(4)), ("v", vshape(4)), ("v-shape", vshape(4)), ("VSHAPE", vshape(4)),
    ("interleaved", interleaved(4, 2)), ("interleaved:3", interleaved(4, 3)), ("interleaved:1", interleaved(4, 1)),
])
def test_parse_placement(text: str, expected) -> None:
    assert parse_placement(text, 4) == expected


@pytest.mark.parametrize("text,message", [
    ("interleaved:0", "placement 'interleaved:0' needs V >= 1 chunks per rank: write interleaved:V, "
                      "e.g. interleaved:2"),
    ("interleaved:x", "placement 'interleaved:x' needs V >= 1 chunks per rank: write interleaved:V, "
                      "e.g. interleaved:2"),
    ("zigzag", "placement 'zigzag' is not known: use one of linear, interleaved:V, v, dualpipe, auto"),
])
def test_parse_placement_refuses_with_the_fix(text: str, message: str) -> None:
    with pytest.raises(ZbsearchError) as err:
        parse_placement(text, 4)
    assert str(err.value) == message


# -- the problem's checks -----------------------------------------------------------------------

def test_objective_must_be_known() -> None:
    prof = uniform_profile(1, 1, 1, p=2, m=2)
    with pytest.raises(ZbsearchError, match=r"^objective 'latency' is not known: use one of makespan, span$"):
        Problem(prof, linear(2), 2, no_limit(prof), "latency")
    assert OBJECTIVES == ("makespan", "span")


def test_placement_and_profile_must_have_as_many_ranks_as_stages() -> None:
    prof = uniform_profile(1, 1, 1, p=2, m=2)
    with pytest.raises(ProfileError) as err:
        Problem(prof, linear(3), 2, no_limit(prof))
    assert str(err.value) == (f"profile {prof.label} has 2 stages but placement 'linear' has 3 ranks: use a profile "
                              "with one stage per rank")


def test_make_problem_reads_the_strings_users_type() -> None:
    prof = hetero(3, 6)
    problem = make_problem(prof, "1.5p", "span", "v")
    assert (problem.placement, problem.num_microbatches, problem.objective) == (vshape(3), 6, "span")
    assert problem.limit.per_rank == pytest.approx(tuple(1.5 * 3 * prof.stage_mem_B(r) for r in range(3)))
    assert problem.num_ranks == 3
    assert make_problem(prof, None).limit.unlimited and make_problem(prof, None).placement == linear(3)


def test_make_problems_tries_each_placement_of_auto() -> None:
    prof = hetero(2, 4)
    assert [p.placement.name for p in make_problems(prof, "2p", "makespan", "auto")] == ["linear", "v"]
    assert [p.placement.name for p in make_problems(prof, "2p", "makespan", "AUTO", auto=("v",))] == ["v"]
    assert [p.placement for p in make_problems(prof, "2p", "makespan", "interleaved:2")] == [interleaved(2, 2)]


def test_check_feasible_refuses_a_limit_below_one_microbatch() -> None:
    prof = hetero(3, 4)
    make_problem(prof, "0.34p").check_feasible()   # one stage's mem_B per rank: just enough
    with pytest.raises(InfeasibleError, match=r"the minimum is 0\.3334p per rank"):
        make_problem(prof, "0.3p").check_feasible()


# -- the passes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("placement", ["linear", "v", "interleaved:2"])
def test_every_pass_once_with_its_rank_cost_and_memory(placement: str) -> None:
    prof = hetero(3, 4)
    problem = make_problem(prof, None, placement=placement)
    pl, m = problem.placement, 4
    actions = [ps.action for ps in problem.passes]
    assert len(actions) == len(set(actions)) == 3 * pl.num_chunks * m
    assert set(actions) == {Action(c, k, i) for c in range(pl.num_chunks) for k in (Kind.F, Kind.B, Kind.W)
                            for i in range(m)}
    for ps in problem.passes:
        a, cost = ps.action, prof.chunk_cost(pl, ps.action.chunk)
        assert ps.rank == pl.chunk_to_rank[a.chunk]
        assert ps.duration == {Kind.F: cost.F, Kind.B: cost.B, Kind.W: cost.W}[a.kind]
        assert (ps.alloc, ps.free) == {Kind.F: (cost.mem_B, 0.0), Kind.B: (0.0, cost.mem_B - cost.mem_W),
                                       Kind.W: (0.0, cost.mem_W)}[a.kind]
    for r in range(3):  # what a rank allocates it frees
        mine = [ps for ps in problem.passes if ps.rank == r]
        allocated = sum(ps.alloc for ps in mine)
        assert allocated > 0 and sum(ps.free for ps in mine) == pytest.approx(allocated)


@pytest.mark.parametrize("placement", ["linear", "v", "interleaved:2"])
def test_inputs_follow_the_route_with_its_hop_times(placement: str) -> None:
    prof = hetero(3, 4)
    problem = make_problem(prof, None, placement=placement)
    pl = problem.placement
    seen: set[Action] = set()
    for ps in problem.passes:
        a = ps.action
        route = pl.route(a.microbatch, 4)
        k = route.index(a.chunk)
        if a.kind is Kind.F:
            expected = [(Action(route[k - 1], Kind.F, a.microbatch), prof.hop(pl, route[k - 1], a.chunk))] if k else []
        elif a.kind is Kind.B:
            expected = [(Action(a.chunk, Kind.F, a.microbatch), 0.0)]
            if k + 1 < len(route):
                expected.append((Action(route[k + 1], Kind.B, a.microbatch), prof.hop(pl, route[k + 1], a.chunk)))
        else:
            expected = [(Action(a.chunk, Kind.B, a.microbatch), 0.0)]
        assert list(ps.inputs) == expected, a
        # Producers are listed before consumers.
        assert all(src in seen for src, _ in ps.inputs), a
        seen.add(a)


def test_hops_cost_the_link_between_ranks_and_nothing_on_one_rank() -> None:
    prof = hetero(3, 2)
    problem = make_problem(prof, None, placement="v")
    hops = {(src.chunk, ps.action.chunk): hop for ps in problem.passes if ps.action.kind is Kind.F
            for src, hop in ps.inputs}
    # V-shape route 0..5 on ranks 0,1,2,2,1,0: the turn on rank 2 is free.
    assert hops == {(0, 1): 0.1, (1, 2): 0.2, (2, 3): 0.0, (3, 4): 0.2, (4, 5): 0.1}


# -- the grid -----------------------------------------------------------------------------------

@pytest.mark.parametrize("step", [0.1, 0.25, 0.3, 1.0])
def test_on_grid_rounds_every_time_down_and_keeps_the_rest(step: float) -> None:
    problem = make_problem(hetero(3, 4), "2p", "span", "v")
    grid = on_grid(problem, step)
    assert (grid.placement, grid.limit, grid.objective, grid.num_microbatches) == \
        (problem.placement, problem.limit, problem.objective, problem.num_microbatches)
    assert grid.profile.time_unit == f"{step:g} us"
    for real, rounded in zip(problem.passes, grid.passes):
        assert real.action == rounded.action and real.rank == rounded.rank
        assert rounded.duration == math.floor(real.duration / step + 1e-9) and rounded.duration.is_integer()
        assert (rounded.alloc, rounded.free) == pytest.approx((real.alloc, real.free))
        for (src, hop), (gsrc, ghop) in zip(real.inputs, rounded.inputs):
            assert src == gsrc and ghop == math.floor(hop / step + 1e-9)
    assert grid.profile.comm == tuple(math.floor(c / step + 1e-9) for c in problem.profile.comm)


def test_the_grid_is_a_relaxation() -> None:
    """A real schedule's times, floored onto the grid, never run longer than the grid allows."""
    problem = make_problem(hetero(3, 6), None)
    step = 0.3
    grid = on_grid(problem, step)
    schedule = generate("1f1b", 3, 6)
    real = simulate(schedule, problem.profile).makespan
    gridded = simulate(schedule, grid.profile).makespan
    assert gridded * step <= real + 1e-9


def test_empty_schedule_builds_on_the_problem_placement() -> None:
    problem = make_problem(uniform_profile(1, 1, 1, p=2, m=2), None)
    schedule = problem.empty_schedule("s", [[Action(0, Kind.F, 0)], []], note="x")
    assert schedule.placement == problem.placement and schedule.num_microbatches == 2
    assert schedule.ranks == ((Action(0, Kind.F, 0),), ()) and schedule.meta == {"note": "x"}


def test_the_plan_a_problem_records_is_its_accounting_limit_and_choice() -> None:
    """The record a schedule made for the problem carries: on a stage-level profile no split and no levels,
    but the memory accounting and the limit as written; with a choice, that choice."""
    from dataclasses import replace
    problem = make_problem(replace(uniform_profile(1, 1, 1, p=2, m=2), memory_model="torch-runtime"), "2p")
    assert problem.plan == PlanRecord(memory_model="torch-runtime", mem_limit=problem.limit.text)
    assert problem.limit.text == "2p"
    chosen = (frozenset({1}), None)
    assert problem.with_choice(chosen).recompute_microbatches == chosen
    assert problem.with_choice(chosen).plan == replace(problem.plan, recompute_microbatches=chosen)
    assert problem.recompute_microbatches is None  # the problem itself is unchanged
