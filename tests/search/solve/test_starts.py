"""solve/starts.py: the solver's starts. one_at_a_time fits the smallest feasible limit on every
placement; heuristic_start is a valid schedule on the problem's placement, no worse than any handcrafted
one there, and falls back to one microbatch at a time (fused where it must); valid_start refuses what
the validator refuses; the tuned and periodic starts keep the start unless they beat it."""

from __future__ import annotations

import time

import pytest

import zbsearch.search.solve.starts as starts_module
from zbsearch.core.errors import ZbsearchError
from zbsearch.core.ir import Kind, Placement, build, dualpipe, interleaved, linear, vshape
from zbsearch.core.memory import MemoryLimit, min_feasible_limit, parse_mem_limit
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.schedules import generate
from zbsearch.search.bounds.analytic import lower_bound
from zbsearch.search.greedy.candidates import handcrafted
from zbsearch.search.problem import Problem
from zbsearch.search.solve.starts import (Start, heuristic_start, one_at_a_time, periodic_applies, periodic_start,
                                          tuned_start, valid_start)
from zbsearch.sim.simulate import simulate
from zbsearch.sim.validate import check

SOURCE = {"kind": "estimated", "method": "start tests"}


def _hetero(p: int, m: int) -> Profile:
    stages = [{"F": 2 + r % 2, "B": 3 - r % 2, "W": 1 + (r % 3) / 2, "mem_B": 1.0 + r / 4, "mem_W": 0.4}
              for r in range(p)]
    return Profile.from_dict({"stages": stages, "comm": 0.5, "microbatches": m, "source": SOURCE})


def _at_least_limit(prof: Profile, placement: Placement, scale: float = 1.0) -> MemoryLimit:
    need = min_feasible_limit(prof, placement)
    return MemoryLimit(f"{scale:g} x least", tuple(x * scale for x in need))


@pytest.mark.parametrize("placement", [linear(3), vshape(2), interleaved(2, 2), dualpipe(2)], ids=lambda pl: pl.name)
@pytest.mark.parametrize("options", [{}, {"weights_at_once": True}, {"fused": True}],
                         ids=["apart", "at-once", "fused"])
def test_one_at_a_time_fits_the_smallest_feasible_limit(placement: Placement, options: dict[str, bool]) -> None:
    prof, m = _hetero(placement.num_ranks, 4), 4
    problem = Problem(prof, placement, m, _at_least_limit(prof, placement), "makespan")
    schedule = one_at_a_time(problem, **options)
    report = check(schedule, prof, problem.limit)
    assert report.ok, report.problems
    # Each rank holds one microbatch's forwards on it at once: its peak is exactly the smallest limit.
    assert report.timeline is not None
    need = min_feasible_limit(prof, placement)
    assert [report.timeline.peak_memory(r) for r in range(placement.num_ranks)] == pytest.approx(list(need))
    # Strictly one microbatch after another on every rank; fused backwards only where asked.
    for rank in schedule.ranks:
        assert [a.microbatch for a in rank] == sorted(a.microbatch for a in rank)
        assert all(a.kind is Kind.FULL_B for a in rank if a.kind is not Kind.F) is options.get("fused", False)
    below = Problem(prof, placement, m, _at_least_limit(prof, placement, 0.99), "makespan")
    assert not check(schedule, prof, below.limit).ok


@pytest.mark.parametrize("options,makespan", [
    # Per microbatch: F on rank 0 and 1, B on rank 1 and 0 (a round trip of 4), then rank 0's W: 5 each.
    ({}, 10.0), ({"weights_at_once": True}, 10.0),
    # Fused: F, F, then BW (2) on rank 1 and rank 0: 6 each.
    ({"fused": True}, 12.0),
])
def test_one_at_a_time_times_by_hand(options: dict[str, bool], makespan: float) -> None:
    prof = uniform_profile(1, 1, 1, p=2, m=2)
    problem = Problem(prof, linear(2), 2, parse_mem_limit("1p", prof), "makespan")
    assert simulate(one_at_a_time(problem, **options), prof).makespan == pytest.approx(makespan)


def test_weights_at_once_puts_each_w_right_after_its_b() -> None:
    prof = uniform_profile(1, 1, 1, p=2, m=2)
    problem = Problem(prof, vshape(2), 2, parse_mem_limit("1p", prof, vshape(2)), "makespan")
    apart, at_once = one_at_a_time(problem), one_at_a_time(problem, weights_at_once=True)
    # Rank 0 holds chunks 0 and 3 of the V: apart, both Bs come before both Ws of a microbatch.
    kinds = [(a.chunk, a.kind.label) for a in apart.ranks[0] if a.microbatch == 0]
    assert kinds == [(0, "F"), (3, "F"), (3, "B"), (0, "B"), (0, "W"), (3, "W")]
    kinds = [(a.chunk, a.kind.label) for a in at_once.ranks[0] if a.microbatch == 0]
    assert kinds == [(0, "F"), (3, "F"), (3, "B"), (3, "W"), (0, "B"), (0, "W")]


@pytest.mark.parametrize("placement,limit", [(linear(3), "1p"), (vshape(3), "1p"), (interleaved(3, 2), "2p")],
                         ids=["linear", "v", "interleaved"])
@pytest.mark.parametrize("objective", ["makespan", "span"])
def test_heuristic_start_is_valid_on_its_placement_and_timed_by_the_simulator(placement: Placement, limit: str,
                                                                              objective: str) -> None:
    prof = _hetero(3, 6)
    problem = Problem(prof, placement, 6, parse_mem_limit(limit, prof, placement), objective)
    start = heuristic_start(problem)
    assert isinstance(start, Start) and start.schedule.placement == placement
    report = check(start.schedule, prof, problem.limit)
    assert report.ok, report.problems
    tl = simulate(start.schedule, prof)
    assert start.objective == pytest.approx(tl.makespan if objective == "makespan" else tl.span)
    assert start.objective == pytest.approx(problem.objective.of(start.timeline))
    # The best of the family: no handcrafted schedule on this placement that fits does better.
    compared = 0
    for name, schedule in handcrafted(3, 6, {placement.name}):
        if schedule.placement == placement and check(schedule, prof, problem.limit).ok:
            assert start.objective <= problem.objective.of(simulate(schedule, prof)) + 1e-9, name
            compared += 1
    assert compared > 0


def test_with_no_heuristic_the_start_is_one_at_a_time_fused_where_b_raises_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Torch's runtime memory: B raises what a microbatch holds (1.0 after F, 1.4 after B) so at the
    # smallest limit (1.0) only a fused backward fits after the forward.
    stage = {"F": 2, "B": 2, "W": 1, "mem_B": 1.0, "mem_W": 0.5, "mem_B_torch": 1.0, "mem_W_torch": 1.4,
             "mem_kept_torch": 0.2}
    prof = Profile.from_dict({"stages": [stage] * 2, "microbatches": 3, "memory_model": "torch-runtime",
                              "source": SOURCE})
    monkeypatch.setattr(starts_module, "candidates", lambda *args, **kwargs: [])
    problem = Problem(prof, linear(2), 3, _at_least_limit(prof, linear(2)), "span")
    start = heuristic_start(problem)
    assert start.name == "one-at-a-time"
    assert check(start.schedule, prof, problem.limit).ok
    assert {a.kind for rank in start.schedule.ranks for a in rank} == {Kind.F, Kind.FULL_B}
    assert start.objective == pytest.approx(simulate(start.schedule, prof).span)
    # Roomier, the plain order fits and is kept.
    roomy = heuristic_start(Problem(prof, linear(2), 3, _at_least_limit(prof, linear(2), 2.0), "span"))
    assert Kind.FULL_B not in {a.kind for rank in roomy.schedule.ranks for a in rank}
    # Below the smallest limit nothing fits: an error, not a schedule.
    with pytest.raises(ZbsearchError, match="no heuristic produced a valid schedule"):
        heuristic_start(Problem(prof, linear(2), 3, _at_least_limit(prof, linear(2), 0.9), "span"))


def test_valid_start_refuses_a_schedule_over_the_limit_or_incomplete() -> None:
    prof = uniform_profile(1, 2, 1, 0.5, p=2, m=4)
    gpipe = generate("gpipe", 2, 4)
    # GPipe runs every forward first: rank 0 holds all four microbatches (4 x mem_B), twice 1p's 2.
    tight = Problem(prof, linear(2), 4, parse_mem_limit("1p", prof), "makespan")
    assert valid_start(tight, gpipe) is None
    roomy = Problem(prof, linear(2), 4, parse_mem_limit("2p", prof), "span")
    found = valid_start(roomy, gpipe)
    assert found is not None and found.name == gpipe.name and found.schedule is gpipe
    assert found.objective == pytest.approx(simulate(gpipe, prof).span)
    incomplete = build("short", gpipe.placement, 4, [gpipe.ranks[0][:-1], gpipe.ranks[1]])
    assert valid_start(roomy, incomplete) is None


@pytest.mark.parametrize("placement,limit,applies", [
    (linear(2), "1p", False),  # one chunk per rank
    (vshape(2), "1p", True), (interleaved(2, 2), "1p", True),
    (vshape(2), None, False),  # no limit
    (dualpipe(2), "1p", False),  # two routes
])
def test_the_periodic_start_applies_to_one_route_of_chunks_under_a_limit(placement: Placement, limit: str | None,
                                                                         applies: bool) -> None:
    prof = uniform_profile(1, 1, 1, p=2, m=4)
    problem = Problem(prof, placement, 4, parse_mem_limit(limit, prof, placement), "makespan")
    assert periodic_applies(problem) is applies


@pytest.mark.parametrize("placement", [linear(2), vshape(2)], ids=lambda pl: pl.name)
def test_an_optimal_start_is_kept_by_the_tuned_and_periodic_starts(placement: Placement) -> None:
    """Where the heuristic start meets the lower bound, nothing is shorter: both keep the start itself."""
    prof = uniform_profile(1, 1, 1, p=2, m=4)
    problem = Problem(prof, placement, 4, parse_mem_limit("1p", prof, placement), "makespan")
    start = heuristic_start(problem)
    assert start.objective == pytest.approx(lower_bound(problem))  # the premise: proven optimal
    kept = tuned_start(problem, start, time.monotonic() + 5, seed=0)
    assert kept.start is start and kept.origin is None
    if periodic_applies(problem):
        kept = periodic_start(problem, start, time.monotonic() + 5)
        assert kept.start is start and kept.origin is None
