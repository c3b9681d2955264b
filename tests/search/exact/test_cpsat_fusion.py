"""The CP-SAT model where a chunk holds more from I until W than from F until I (mem_W > mem_B, torch's
runtime memory): there a split B raises what a microbatch holds, and a fused backward (which frees mem_B
at its end) may fit a limit that no split order fits. The model may fuse those backwards
(cpsat.fusable_chunks); without that it called a limit 'infeasible' where the heuristics had a valid fused
schedule, and its 'optimal' covered split schedules only."""

from __future__ import annotations

import math
import random

import pytest

from zbsearch.core.ir import Kind
from zbsearch.core.objective import Status
from zbsearch.core.placement import parse_placement
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.search.options import SearchOptions
from zbsearch.search.bounds.analytic import lower_bound, objective_bound, rank_bounds
from zbsearch.search.exact import cpsat, run_model
from zbsearch.search.problem import make_problem, on_grid
from zbsearch.search.solve.grid import exact_step
from zbsearch.sim.validate import check

from random_pipelines import tell_cpsat_no_bounds

GiB = 2**30


def _repro_profile() -> Profile:
    """Four recomputed blocks (mem_W_torch 8 x mem_B) between an embedding and a head, on two ranks."""
    def block(i: int, F: float) -> dict:
        return {"name": f"layers.{i}", "kind": "decoder", "F": F, "B": F, "W": F, "mem_B": 0.5 * GiB,
                "mem_W": 0.5 * GiB, "mem_B_torch": 0.5 * GiB, "mem_W_torch": 4.0 * GiB, "static_bytes": 1.0 * GiB,
                "out_bytes": 1.0}
    ends = [{"name": "tok_embeddings", "kind": "embedding", "F": 0.1, "B": 0.0, "W": 0.1, "mem_B": 0.01 * GiB,
             "mem_W": 0.01 * GiB, "mem_W_torch": 0.01 * GiB, "static_bytes": 0.5 * GiB, "out_bytes": 1.0},
            {"name": "output", "kind": "output", "F": 0.2, "B": 0.2, "W": 0.2, "mem_B": 0.1 * GiB, "mem_W": 0.1 * GiB,
             "mem_W_torch": 0.2 * GiB, "static_bytes": 0.5 * GiB, "out_bytes": 1.0}]
    blocks = [block(i, F) for i, F in enumerate([1.5, 2.8, 2.0, 2.2])]
    return Profile.from_dict({
        "name": "memw", "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB}], "microbatches": 4,
        "time_unit": "unit", "memory_unit": "bytes", "comm": 0.0, "memory_model": "torch-runtime",
        "layers": [ends[0], *blocks, ends[1]], "source": {"kind": "estimated", "method": "repro"}})


# At 9GiB one microbatch's mem_W (8 GiB) exceeds the 6.5 GiB left for activations: only fused backwards
# fit (1F1B, 65.9). At 12GiB the split order of 61.5 fits and nothing beats it.
@pytest.mark.parametrize("cap,best", [("9GiB", 65.9), ("12GiB", 61.5)])
def test_cpsat_fuses_backwards_where_b_raises_memory(cap: str, best: float) -> None:
    from zbsearch.search.partition.search import SplitRequest, SplitSearch
    from zbsearch.search.solve.driver import solve

    search = SplitSearch(SplitRequest(_repro_profile(), 2, ("linear",), cap, "makespan"), math.inf)
    problem = search.problem(parse_placement("linear", 2), (3, 3))
    assert all(c.mem_W > 4 * c.mem_B for c in problem.chunk_costs)
    result = solve(problem, SearchOptions(time_limit=10))
    assert check(result.schedule, problem.profile, problem.limit).ok
    assert result.details.cpsat_status is not Status.INFEASIBLE
    assert all(r.rejected is None for r in result.details.grid_rounds)
    assert result.lower_bound <= result.objective + 1e-9
    assert result.objective == pytest.approx(best)
    # Every time sits on the grid, so CP-SAT's optimum is the problem's: the result says so.
    assert result.details.cpsat_status is Status.OPTIMAL
    assert result.status == "optimal" and result.lower_bound == pytest.approx(result.objective)


def test_a_fused_solution_is_written_as_full_backwards() -> None:
    # p=2, m=2, F = B = W = 1; mem_W 3 x mem_B and a limit of 2 x mem_B: a split B never fits.
    stage = {"F": 1, "B": 1, "W": 1, "mem_B": 1.0, "mem_W": 0.5, "mem_B_torch": 1.0, "mem_W_torch": 3.0}
    prof = Profile.from_dict({"stages": [stage] * 2, "microbatches": 2, "memory_model": "torch-runtime",
                              "source": {"kind": "estimated", "method": "test"}})
    problem = make_problem(prof, "1p", "makespan")  # 2 x mem_B
    grid = on_grid(problem, 1.0)
    assert cpsat.fusable_chunks(grid) == {0, 1}
    result = run_model.solve_grid(grid, hint=None, horizon=40, time_limit=10, workers=2, seed=0)
    assert result.status is Status.OPTIMAL
    assert len(result.fused) == 4  # every backward
    schedule = run_model.orders_from_starts(grid, result.starts, "t", result.fused)
    assert {a.kind for rank in schedule.ranks for a in rank} == {Kind.F, Kind.FULL_B}
    report = check(schedule, problem.profile, problem.limit)
    assert report.ok and report.timeline.makespan == pytest.approx(result.objective)


def test_nothing_fuses_where_b_frees_memory() -> None:
    """mem_W <= mem_B (the paper's): the model and the bounds it reads are what they were."""
    problem = make_problem(uniform_profile(1, 1, 1, 0.5, p=2, m=3), "1p", "makespan")
    grid = on_grid(problem, 1.0)
    assert cpsat.fusable_chunks(grid) == frozenset()
    assert cpsat.bound_passes_of(grid) is grid.passes
    _, v = cpsat.build_model(grid, 60)
    assert v.fused == {}


def _torch_instance(seed: int):
    """Small random pipelines whose split B raises memory 1.5x to 8x, on every placement the model handles."""
    rng = random.Random(seed)
    placement = rng.choice(["linear", "linear", "v", "interleaved:2"])
    p, m = rng.choice([2, 3]), rng.choice([2, 3, 4])
    kept = rng.random() < 0.3
    stages = []
    for _ in range(p):
        mb = rng.choice([1.0, 2.0])
        stages.append({"F": rng.randint(2, 6), "B": rng.randint(2, 7), "W": rng.randint(1, 5), "mem_B": mb,
                       "mem_W": 0.5, "mem_B_torch": mb, "mem_W_torch": mb * rng.choice([1.5, 2, 3, 4, 8]),
                       "mem_kept_torch": (rng.choice([0.0, 0.25, 0.5]) if kept else 0.0)})
    prof = Profile.from_dict({"stages": stages, "comm": rng.randint(0, 2), "microbatches": m,
                              "memory_model": "torch-runtime", "source": {"kind": "estimated", "method": "random test"}})
    objective = rng.choice(["makespan", "span"])
    limit = rng.choice(["0.5p", "1p", "2p", "3p", "4p", "6p"])
    return make_problem(prof, limit, objective, placement)


# Seeds where the split bounds exceed the optimum (fused backwards win) and CP-SAT proves it in seconds.
@pytest.mark.parametrize("seed", [6, 7, 16, 28, 30, 49, 83, 91])
def test_bounds_stay_below_the_optimum_cpsat_proves_without_them(monkeypatch, seed: int) -> None:
    """mem_W > mem_B: CP-SAT, told nothing by the analytic bounds, proves the optimum over split and
    fused schedules on the exact grid; the bounds it is otherwise told, and the reported lower bound, must
    not exceed it; told them, it finds the same optimum."""
    problem = _torch_instance(seed)
    step = exact_step(problem)
    grid = on_grid(problem, step)
    horizon = int(sum(ps.duration for ps in grid.passes) + 10 * len(grid.passes))
    told = objective_bound(rank_bounds(grid, cpsat.bound_passes_of(grid)), problem.objective)
    reported = lower_bound(problem)
    with_bounds = run_model.solve_grid(grid, hint=None, horizon=horizon, time_limit=20, workers=2, seed=0)
    tell_cpsat_no_bounds(monkeypatch)
    free = run_model.solve_grid(grid, hint=None, horizon=horizon, time_limit=20, workers=2, seed=0)
    assert free.status is Status.OPTIMAL, "the instance is meant to be small enough for CP-SAT to prove"
    assert told <= free.objective + 1e-9
    assert reported <= free.objective * step + 1e-9
    assert with_bounds.status is Status.OPTIMAL and with_bounds.objective == free.objective
    schedule = run_model.orders_from_starts(grid, free.starts, "t", free.fused)
    if not any(c.mem_kept for c in problem.chunk_costs):  # the grid drops what W keeps: only then exact
        report = check(schedule, problem.profile, problem.limit)
        assert report.ok
        assert problem.objective.of(report.timeline) == pytest.approx(free.objective * step)
