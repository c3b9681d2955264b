"""Calibration put back into the model: the profile's action overhead, message table and torch-runtime
memory parse, validate and round-trip; the simulator adds the overhead exactly; the bounds stay valid
with it (brute force over split and fused backwards); the overhead fit inverts the simulator."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from zbsearch.core.calibration import comm_time, running_cost
from zbsearch.core.errors import ProfileError, ScheduleError
from zbsearch.core.ir import Action, Kind, build, linear
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.partition import partition_profile
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.core.stage_cost import StageCost
from zbsearch.search.options import SearchOptions
from zbsearch.search.bounds.analytic import lower_bound, objective_bound, rank_bounds
from zbsearch.search.bounds.relaxations import bound_passes, fusion_saves_time
from zbsearch.search.problem import Problem, make_problem
from zbsearch.search.solve.driver import solve
from zbsearch.sim.simulate import simulate
from zbsearch.sim.validate import memory_problems

SOURCE = {"kind": "estimated", "method": "test"}


def calibrated(**extra) -> dict:
    data = {"name": "cal", "num_stages": 2, "microbatches": 2, "time_unit": "us", "memory_unit": "bytes",
            "stages": [{"F": 10, "B": 10, "W": 10, "mem_B": 100, "mem_W": 50, "mem_B_torch": 90, "mem_W_torch": 160,
                        "mem_kept_torch": 20}] * 2,
            "comm": 1, "source": SOURCE, "action_overhead": 2.5, "memory_model": "torch-runtime",
            "comm_table": [{"bytes": 1000, "time": 5}, {"bytes": 9000, "time": 21}]}
    data.update(extra)
    return data


def test_calibration_fields_parse_and_round_trip() -> None:
    prof = Profile.from_dict(calibrated())
    assert prof.action_overhead == 2.5 and prof.memory_model == "torch-runtime"
    assert prof.comm_table == ((1000.0, 5.0), (9000.0, 21.0)) and prof.calibrated
    assert prof.stages[0].mem_W_torch == 160 and prof.stages[0].mem_kept_torch == 20
    again = Profile.from_dict(prof.to_dict())
    assert again == prof and again.to_dict() == prof.to_dict()
    plain = prof.uncalibrated()
    assert plain.action_overhead == 0 and plain.comm_table is None and plain.memory_model == "paper"
    assert "action_overhead" not in plain.to_dict() and "memory_model" not in plain.to_dict()


@pytest.mark.parametrize("change, field", [
    ({"action_overhead": -1}, "field action_overhead is -1"),
    ({"memory_model": "cuda"}, "field memory_model is 'cuda'"),
    ({"comm_table": [{"bytes": 10, "time": 1}, {"bytes": 10, "time": 2}]}, "field comm_table[1].bytes (10) is not above"),
    ({"comm_table": [{"bytes": 0, "time": 1}]}, "field comm_table[0].bytes is 0"),
    ({"comm_table": [{"bytes": 10, "time": -1}]}, "field comm_table[0].time is -1"),
    ({"comm_table": [{"bytes": 10, "time": 1, "latency": 2}]}, "unknown key 'latency' in comm_table[0]"),
    ({"comm_table": []}, "field comm_table is empty"),
    ({"action_overhead": float("nan")}, "field action_overhead is nan"),
])
def test_bad_calibration_fields_are_refused_naming_the_field(change, field) -> None:
    with pytest.raises(ProfileError) as err:
        Profile.from_dict(calibrated(**change), origin="p.json")
    assert field in str(err.value) and "--" not in str(err.value)


def test_message_times_interpolate_and_drive_the_hops_of_a_split() -> None:
    table = ((1000.0, 5.0), (9000.0, 21.0))
    assert [comm_time(table, b) for b in (10, 1000, 5000, 9000, 13000)] == [5.0, 5.0, 13.0, 21.0, 29.0]
    layers = [{"name": f"l{i}", "F": 1, "B": 1, "W": 1, "out_bytes": 5000} for i in range(4)]
    prof = Profile.from_dict(calibrated(layers=layers, link_bandwidth=1.0))
    assert partition_profile(prof, linear(2), [2, 2]).comm == (13.0,)  # the table wins over the bandwidth


def _two_ranks(overhead: float) -> Profile:
    return replace(uniform_profile(1, 1, 1, 0.5, p=2, m=1), action_overhead=overhead)


def test_the_simulator_adds_the_overhead_once_per_action() -> None:
    # 1F1B, m=1, F = B = W = 1, comm 0.5, overhead 0.25; the fused backward is one action (2 + 0.25):
    # rank 0 F [0, 1.25], rank 1 F [1.75, 3], rank 1 B [3, 5.25], rank 0 B [5.75, 8].
    fused = build("f", linear(2), 1, [[Action(0, Kind.F, 0), Action(0, Kind.FULL_B, 0)],
                                      [Action(1, Kind.F, 0), Action(1, Kind.FULL_B, 0)]])
    tl = simulate(fused, _two_ranks(0.25))
    assert [(s.start, s.end) for s in tl.slots[1]] == [(1.75, 3.0), (3.0, 5.25)]
    assert tl.makespan == 8.0 and simulate(fused, _two_ranks(0.0)).makespan == 7.0
    # Split: I and W each pay it; W leaves the critical path: rank 1 I [3, 4.25], W [4.25, 5.5];
    # rank 0 I [4.75, 6], W [6, 7.25].
    split = build("s", linear(2), 1, [[Action(0, k, 0) for k in (Kind.F, Kind.B, Kind.W)],
                                      [Action(1, k, 0) for k in (Kind.F, Kind.B, Kind.W)]])
    tl = simulate(split, _two_ranks(0.25))
    assert [(s.start, s.end) for s in tl.slots[0]] == [(0.0, 1.25), (4.75, 6.0), (6.0, 7.25)]


def test_torch_runtime_memory_rises_at_i_and_keeps_some_until_the_end() -> None:
    prof = Profile.from_dict(calibrated(action_overhead=0))
    cost = prof.chunk_cost(linear(2), 1)
    assert (cost.mem_B, cost.mem_W, cost.mem_kept) == (90, 160, 20)
    split = build("s", linear(2), 2, [[Action(0, k, i) for i in range(2) for k in (Kind.F, Kind.B, Kind.W)],
                                      [Action(1, k, i) for i in range(2) for k in (Kind.F, Kind.B, Kind.W)]])
    levels = [lvl for _, lvl, _ in simulate(split, prof).memory[1]]
    assert levels == [90, 160, 20, 110, 180, 40]  # F +90, I to 160, W down to the 20 kept; twice
    assert running_cost(StageCost(1, 1, 1, 100, 50), 0, "torch-runtime").mem_W == 150  # unmeasured: mem_B + mem_W
    paper = simulate(split, prof.uncalibrated())
    assert [lvl for _, lvl, _ in paper.memory[1]] == [100, 50, 0, 100, 50, 0]


def _chains(r: int, m: int, fused: tuple[bool, ...]) -> list[list[Action]]:
    return [[Action(r, Kind.F, i), Action(r, Kind.FULL_B, i)] if f else
            [Action(r, Kind.F, i), Action(r, Kind.B, i), Action(r, Kind.W, i)] for i, f in zip(range(m), fused)]


def _merges(chains: list[list[Action]]):
    if not any(chains):
        yield []
        return
    for i, chain in enumerate(chains):
        if chain:
            for tail in _merges(chains[:i] + [chain[1:]] + chains[i + 1:]):
                yield [chain[0]] + tail


def brute_force(problem: Problem) -> float:
    """The best makespan over every per-rank order, each backward split or fused."""
    p, m = problem.num_ranks, problem.num_microbatches
    per_rank = [[order for fused in itertools.product((False, True), repeat=m) for order in _merges(_chains(r, m, fused))]
                for r in range(p)]
    best = math.inf
    for orders in itertools.product(*per_rank):
        try:
            tl = simulate(build("bf", problem.placement, m, orders), problem.profile)
        except ScheduleError:
            continue
        if not memory_problems(tl, problem.limit):
            best = min(best, tl.makespan)
    return best


def tiny(overhead: float, fused_saves: float, torch_memory: bool) -> Profile:
    stage = {"F": 2, "B": 2, "W": 1, "full_backward": 3 - fused_saves, "mem_B": 1.0, "mem_W": 0.5}
    if torch_memory:
        stage.update(mem_B_torch=1.0, mem_W_torch=1.4, mem_kept_torch=0.2)
    return Profile.from_dict({"stages": [stage, dict(stage, F=3)], "comm": 0.5, "microbatches": 2,
                              "action_overhead": overhead, "memory_model": "torch-runtime" if torch_memory else "paper",
                              "source": SOURCE})


@pytest.mark.parametrize("overhead, saves, torch_memory, limit", [
    (0.5, 0.0, False, "1p"), (1.0, 0.5, False, "2p"), (0.5, 0.0, True, "2p"), (0.3, 0.2, True, "1.5p"), (0.0, 0.0, True, "1p"),
])
def test_bounds_stay_below_the_brute_force_optimum_with_overheads(overhead, saves, torch_memory, limit) -> None:
    prof = tiny(overhead, saves, torch_memory)
    problem = make_problem(prof, limit, "makespan")
    optimum = brute_force(problem)
    assert math.isfinite(optimum)
    assert lower_bound(problem) <= optimum + 1e-9
    result = solve(problem, SearchOptions(time_limit=10))
    assert result.lower_bound <= optimum + 1e-9 <= result.objective + 2e-9
    # CP-SAT's own bound is set aside only where a fused backward saves time: where it saves only memory
    # (mem_W > mem_B, a kept loss), its model may fuse that backward, and the brute force above checks it.
    if fusion_saves_time(problem.chunk_costs):
        assert result.details.cpsat_bound is not None and result.details.cpsat_bound.startswith("not used")


def test_the_split_passes_alone_would_bound_above_a_fused_schedule() -> None:
    # Overhead 1 per action and a measured fused backward of 1.2: fused (1.2 + 1) beats B then W (2 x 2);
    # the split model's own bound is above what fused 1F1B runs in, so the proven bound must read the
    # relaxed passes.
    prof = Profile.from_dict({"stages": [{"F": 1, "B": 1, "W": 1, "full_backward": 1.2}] * 2, "microbatches": 2,
                              "action_overhead": 1.0, "source": SOURCE})
    problem = make_problem(prof, "none", "makespan")
    split_only = objective_bound(rank_bounds(problem, problem.passes), "makespan")
    optimum = brute_force(problem)
    assert split_only > optimum and objective_bound(rank_bounds(problem, bound_passes(problem)), "makespan") <= optimum
    # CP-SAT places split passes; which backwards to fuse is not searched (adjacent B, W are fused after)
    assert optimum - 1e-9 <= solve(problem, SearchOptions(time_limit=5)).objective <= 1.05 * optimum


def test_the_overhead_fit_inverts_the_simulator() -> None:
    pytest.importorskip("torch")
    from zbsearch.interop.run.calibrate import fit_overhead
    from zbsearch.schedules import generate

    schedule = generate("zb-h1", 2, 8)
    compute = {"F": 1e-4, "I": 2e-4, "W": 1.5e-4, "B": 3e-4}
    first = StageCost(1e-4, 0.0, 3e-4, full_backward=3e-4)
    other = StageCost(1e-4, 2e-4, 1.5e-4, full_backward=3e-4)
    base = Profile("t", (first, other), (5e-5,), 8, SOURCE, time_unit="s")
    measured = simulate(schedule, replace(base, action_overhead=4e-4)).makespan
    assert fit_overhead(schedule, compute, 5e-5, measured) == pytest.approx(4e-4, rel=1e-6)
    assert fit_overhead(schedule, compute, 5e-5, 1e-6) == 0.0  # compute alone is slower: no overhead


def test_memory_limits_stay_in_paper_units_and_fused_backwards_meet_the_smallest() -> None:
    from zbsearch.core.memory import min_feasible_limit

    prof = Profile.from_dict(calibrated(action_overhead=0))
    assert parse_mem_limit("1p", prof).per_rank == (200.0, 200.0)  # p x the paper's stage mem_B
    assert min_feasible_limit(prof, linear(2)) == (90.0, 90.0)  # mem_B_torch: a fused backward frees all
    # 0.45p = 90 bytes: a split backward (I raises it to 160) cannot run, fused ones one at a time can
    result = solve(make_problem(prof, "0.45p", "makespan"), SearchOptions(time_limit=5))
    assert all(a.kind is not Kind.B for rank in result.schedule.ranks for a in rank)
    assert max(result.timeline.peak_memory(r) for r in range(2)) == 90.0
