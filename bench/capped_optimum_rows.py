"""One row of the capped-optimum study (bench/capped_optimum.py): an instance small enough for CP-SAT to
prove its optimum, and what zbsearch reports on it.

An instance is issue 39's example shrunk: the same layer shape (hidden 4096, 32 heads, sequence 4096,
vocabulary 128256, H100 at MFU 0.4), four decoder layers per rank as there (32 over 8 ranks), p ranks,
m microbatches, the split `balanced`, one placement, one memory accounting, one cap. Its layer times are
rounded to whole multiples of QUANTUM_US and its hop to one as well, so that every pass and hop sits on a
common grid: only there can CP-SAT's answer be proven optimal for the real times (search/solve/grid.py
goes straight to that grid, whose bound is exact). The example's plan and bound are on unrounded times;
rounding moves a layer's time by at most 1%.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.memory import no_limit, parse_mem_limit
from zbsearch.core.objective import Objective
from zbsearch.core.partition import partition_profile
from zbsearch.core.placement import parse_placement
from zbsearch.core.planned_profile import as_planned
from zbsearch.core.profile import Profile, load_profile
from zbsearch.search.bounds.analytic import RankBound, objective_bound, rank_bounds
from zbsearch.search.bounds.relaxations import bound_passes, fusion_saves
from zbsearch.search.entry.find_plan import find_plan
from zbsearch.search.entry.request import PlanRequest
from zbsearch.search.options import SearchOptions
from zbsearch.search.partition.candidates import parse_rule
from zbsearch.search.problem import Problem
from zbsearch.search.solve.driver import solve
from zbsearch.search.solve.report import SolveResult

QUANTUM_US = 100.0
LAYERS_PER_RANK = 4
SHAPE = ["--gpu", "h100", "--mfu", "0.4", "--hidden", "4096", "--heads", "32", "--seq", "4096", "--micro-batch", "1",
         "--vocab", "128256"]
DEFAULT = SearchOptions()  # what `zbsearch solve` runs without --time-limit
UNCAPPED_SECONDS = 60.0


@dataclass(frozen=True)
class Instance:
    """`family`: A, the example's cap (`--mem-limit auto` on the same GPU, the same layers per rank, so the same
    bytes per rank); B, the example's cap as a multiple of p (`limit`, e.g. 0.58p)."""

    family: str
    p: int
    m: int
    placement: str
    limit: str
    memory_model: str

    @property
    def layers(self) -> int:
        return LAYERS_PER_RANK * self.p

    @property
    def label(self) -> str:
        return f"{self.family} p={self.p} m={self.m} {self.placement} {self.limit} {self.memory_model}"


def load() -> float:
    return round(os.getloadavg()[0], 2)


def quantized_profile(p: int, m: int, out: Path, quantum: float | None = QUANTUM_US) -> Path:
    """`zbsearch profile --estimate` of the example's shape at p ranks (4p layers) and m microbatches, every
    layer and stage time rounded to `quantum` (full_backward kept B + W) and the hop time too (through
    link_bandwidth, from which a split's hops follow); None: not rounded."""
    args = ["profile", "--estimate", *SHAPE, "--layers", str(LAYERS_PER_RANK * p), "-p", str(p), "-m", str(m),
            "-o", str(out)]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    if quantum is None:
        return out
    data = json.loads(out.read_text())
    for record in data["layers"] + data["stages"]:
        for key in ("F", "B", "W"):
            record[key] = round(record[key] / quantum) * quantum
        record["full_backward"] = record["B"] + record["W"]
    hop = round(data["comm"][0] / quantum) * quantum
    data["comm"] = [hop] * (p - 1)
    data["link_bandwidth"] = data["layers"][1]["out_bytes"] / hop
    data["source"]["method"] += f"; every time rounded to {quantum:g} us (bench/capped_optimum_rows.py)"
    out.write_text(json.dumps(data, indent=1))
    return out


def problem_of(profile: Profile, inst: Instance) -> Problem:
    """The problem `solve --partition balanced --placement PLACEMENT --mem-limit LIMIT` solves (as
    partition/search.py's SplitSearch.problem builds it)."""
    planned = as_planned(profile, inst.memory_model)
    placement = parse_placement(inst.placement, inst.p)
    _, counts = parse_rule("balanced", planned.layers or (), placement)
    assert counts is not None
    split = partition_profile(planned, placement, counts)
    limit = parse_mem_limit(inst.limit, split, placement)
    return Problem(split, placement, inst.m, limit, Objective.MAKESPAN)


def cap_ratios(problem: Problem) -> list[float]:
    """Per rank: the activation cap over one microbatch's activations there (the mem_B of its chunks)."""
    costs, pl = problem.chunk_costs, problem.placement
    return [problem.limit.per_rank[r] / sum(costs[c].mem_B for c in pl.chunks_on(r)) for r in range(problem.num_ranks)]


def binding(bounds: list[RankBound]) -> str:
    """Which rank sets the analytic bound, and which of its parts: work + idle, memory-time, the rank on
    its own (sequence) or the nesting."""
    top = max(bounds, key=lambda b: b.end)
    idle = top.start_idle + top.end_idle if top.disjoint else max(top.start_idle, top.end_idle)
    trip = top.trip_idle + top.end_idle if top.trip_disjoint else max(top.trip_idle, top.end_idle)
    parts = {"work+idle": top.work + max(idle, trip), "memory-time": top.memory_time, "sequence": top.sequence,
             "nesting": top.nested}
    name = max(parts, key=lambda k: parts[k])
    return f"rank {top.rank}: {name} (work {top.work:.0f}, head {top.head:.0f})"


def analytic(problem: Problem) -> tuple[float, str]:
    """The analytic bound solve() starts from (driver._bounds: on the relaxed passes where a fused backward
    may beat the split one), without a deadline, and what binds it."""
    relaxed = problem.profile.gives_overlap or fusion_saves(problem.chunk_costs)
    bounds = rank_bounds(problem, bound_passes(problem) if relaxed else problem.passes)
    return objective_bound(bounds, problem.objective), binding(bounds)


def phase(result: SolveResult) -> str:
    """Where solve's answer came from: its start (heuristic, tuned, periodic) or CP-SAT on the grid or LNS."""
    d = result.details
    lns = d.lns.improved if d.lns is not None else 0
    if result.schedule.name != "zbsearch":
        found = f"start {result.start_heuristic}"
    else:
        found = "LNS" if lns else "CP-SAT grid"
    return f"{found}; grid {d.cpsat_status}; lns improved {lns}"


def prove(problem: Problem, seconds: float) -> dict[str, Any]:
    """solve() with a long limit: on the exact grid, CP-SAT either proves its answer optimal or stops."""
    before, t0 = load(), time.monotonic()
    result = solve(problem, SearchOptions(time_limit=seconds))
    return {"optimum_us": result.objective, "proof_bound_us": result.lower_bound, "proof_status": result.status.value,
            "proof_s": round(time.monotonic() - t0, 1), "proof_cpsat": str(result.details.cpsat_status),
            "proof_start": result.start_heuristic, "proof_start_us": result.heuristic_objective,
            "proof_load": f"{before}/{load()}"}


def uncapped(problem: Problem) -> dict[str, Any]:
    """The same pipeline without the cap: what the cap costs."""
    free = Problem(problem.profile, problem.placement, problem.num_microbatches, no_limit(problem.profile),
                   problem.objective)
    result = solve(free, SearchOptions(time_limit=UNCAPPED_SECONDS))
    return {"uncapped_us": result.objective, "uncapped_status": result.status.value}


def at_default(profile: Profile, inst: Instance, placement: str) -> dict[str, Any]:
    """`zbsearch solve --partition balanced --placement PLACEMENT --mem-limit LIMIT --memory-model MODEL`
    at the default time limit: the plan and the bound a user sees."""
    request = PlanRequest(inst.limit, placement=placement, partition="balanced", memory_model=inst.memory_model)
    before, t0 = load(), time.monotonic()
    result = find_plan(profile, request, DEFAULT)
    return {"solve_us": result.objective, "bound_us": result.lower_bound, "solve_status": result.status.value,
            "solve_placement": result.problem.placement.name, "solve_phase": phase(result),
            "solve_start_us": result.heuristic_objective, "solve_s": round(time.monotonic() - t0, 1),
            "solve_load": f"{before}/{load()}", "pair_bound": result.details.pair_bound}


def measure(profile_path: Path, inst: Instance, proof_seconds: float) -> dict[str, Any]:
    """One row: the proven optimum, the bounds, solve at the default time, the cap's cost."""
    profile = load_profile(str(profile_path))
    problem = problem_of(profile, inst)
    ratios = cap_ratios(problem)
    bound, binds = analytic(problem)
    row: dict[str, Any] = {
        "family": inst.family, "p": inst.p, "m": inst.m, "layers": inst.layers, "placement": problem.placement.name,
        "split": ",".join(str(len(names)) for names in problem.profile.partition or ()), "cap": inst.limit,
        "cap_ratio_min": round(min(ratios), 2), "cap_ratio_max": round(max(ratios), 2),
        "accounting": inst.memory_model, "analytic_bound_us": bound, "analytic_binds": binds}
    row.update(prove(problem, proof_seconds))
    row.update(uncapped(problem))
    row.update(at_default(profile, inst, inst.placement))
    return with_gaps(row)


def with_gaps(row: dict[str, Any]) -> dict[str, Any]:
    """(optimum - bound) / optimum for the bound solve reports and the analytic one, (solve - optimum) /
    optimum, and the cap's cost (optimum - uncapped) / uncapped."""
    opt = row["optimum_us"]
    row["gap_bound"] = (opt - row["bound_us"]) / opt
    row["gap_analytic"] = (opt - row["analytic_bound_us"]) / opt
    row["gap_solve"] = (row["solve_us"] - opt) / opt
    row["cap_cost"] = (opt - row["uncapped_us"]) / row["uncapped_us"] if row["uncapped_us"] else math.nan
    return row
