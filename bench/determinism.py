"""Record the deterministic parts of the search on a fixed set of instances, so that a refactor which must not
change plans or numbers can be checked: run this before it (results/determinism.json), run it again after
with --check, and every entry that differs is printed.

What it records, per instance (the 1.5B paper profile on linear and V at 1p and 2p, the H100 profile at 2p on
linear and V, a uniform profile on linear, V and interleaved, and a small layered Llama-style profile
estimated by `zbsearch profile --estimate`; bench/solve_bench.py's hetero-random #12, where the tuned start
wins):

1. the heuristic start: its name, objective and a hash of its per-rank action strings;
2. every candidate the heuristics rank on the problem's placement, in order: name, objective, peak, hash;
3. the analytic bounds: each rank's bound and the objective bound (walks given no deadline, so they run to
   their state caps: deterministic);
4. the tuned list greedy, with an evaluation budget and no deadline (deterministic for a seed), and whether
   it would replace the heuristic start;
5. the periodic start on chunked placements under a memory limit, swept with no deadline;
6. on the layered profile: the seed splits with their heuristic scores and cheap bounds, the one-layer moves
   from the best seed, and the bound over every split (the cheap DP, and the walk where it completes);
7. the bound over every split and every recompute choice, likewise;
8. the nested key structure (keys only) of `zbsearch solve --json` for a plain, a `--partition auto` and a
   `--recompute auto` solve;
9. the memory figures of plain solves the heuristics and bounds prove optimal (no CP-SAT).

Every call into zbsearch is one of the adapters at the top: after a refactor, only they change.
Usage: python bench/determinism.py [--out results/determinism.json] [--check results/determinism.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

import zbsearch as zb
from bench_instances import hetero_random
from zbsearch.cli.app import app
from zbsearch.core.placement import parse_placement
from zbsearch.search.bounds.analytic import objective_bound, rank_bounds
from zbsearch.search.bounds.relaxations import bound_passes, fusion_saves
from zbsearch.search.greedy.candidates import candidates, engine_schedule, rank_key
from zbsearch.search.greedy.modulo import best_periodic
from zbsearch.search.greedy.options import GreedyOptions
from zbsearch.search.greedy.tune import tune
from zbsearch.search.partition.bounds import any_split_bound, split_bound
from zbsearch.search.partition.enumerate import bound_input
from zbsearch.search.recompute.search import least_memory
from zbsearch.search.partition.search import (SplitRequest, SplitSearch, any_split_bound_of, improve_split,
                                              seed_splits)
from zbsearch.search.problem import Problem, make_problems
from zbsearch.search.solve.starts import heuristic_start, periodic_applies, valid_start

ROOT = Path(__file__).resolve().parent.parent
TUNE_EVALUATIONS = 300  # the tuning's budget: engine runs, not seconds
WALK_SECONDS = 120.0    # the split-bound walks' deadline: generous; only a walk that completes is recorded
Json = Any


# ---------------------------------------------------------------- adapters: the only calls into zbsearch

def make_problem(profile: zb.Profile, mem_limit: str, placement: str) -> Problem:
    """One problem on one placement, makespan objective."""
    (problem,) = make_problems(profile, mem_limit, "makespan", placement)
    return problem


def schedule_hash(schedule: zb.Schedule) -> str:
    """A short hash of the schedule's per-rank action strings (torch's form, e.g. 0F3 1I0 2W3)."""
    text = "\n".join(" ".join(str(a) for a in rank) for rank in schedule.ranks)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def heuristic_record(problem: Problem) -> tuple[dict[str, Json], float]:
    """Item 1: the solver's heuristic start, and its objective (what items 4 and 5 must beat)."""
    start = heuristic_start(problem)
    return {"name": start.name, "objective": start.objective, "hash": schedule_hash(start.schedule)}, start.objective


def candidates_record(problem: Problem) -> list[dict[str, Json]]:
    """Item 2: every candidate ranked on the problem's placement (as the start sees them), best first."""
    return [{"name": c.name, "objective": key[0], "peak": key[1], "hash": schedule_hash(c.schedule)}
            for c in candidates(problem, same_placement=True) for key in [rank_key(c.timeline, problem.objective)]]


def bounds_record(problem: Problem) -> dict[str, Json]:
    """Item 3: each rank's analytic bound and the objective bound, as solve() takes them, with no deadline
    (math.inf: the walks stop at their state caps only)."""
    real = rank_bounds(problem, problem.passes, deadline=math.inf)
    relaxed = real if not (problem.profile.gives_overlap or fusion_saves(problem.chunk_costs)) \
        else rank_bounds(problem, bound_passes(problem), deadline=math.inf)
    return {"ranks": [{**asdict(b), "span": b.span, "end": b.end} for b in real],
            "objective_bound": objective_bound(real, problem.objective),
            "lower_bound": objective_bound(relaxed, problem.objective)}


def tuned_record(problem: Problem, start_objective: float) -> dict[str, Json] | None:
    """Item 4: solve()'s tuned start (starts.tuned_start) with an evaluation budget instead of a deadline."""
    base = GreedyOptions("list", by_route=len(problem.placement.routes) > 1)
    found = tune(problem, base=base, max_evaluations=TUNE_EVALUATIONS, seed=0)
    if found is None:
        return None
    schedule = engine_schedule(found.result, problem, found.options)
    valid = valid_start(problem, schedule)
    return {"cost": found.cost, "key": list(found.key), "found_at": found.found_at, "hash": schedule_hash(schedule),
            "policies": [asdict(p) for p in found.options.ranks or ()], "valid": valid is not None,
            "replaces_start": valid is not None and found.cost < start_objective * (1 - 1e-12)}


def periodic_record(problem: Problem, start_objective: float) -> dict[str, Json] | None:
    """Item 5: the periodic start (starts.periodic_start) swept with no deadline; None where solve() skips it."""
    if not periodic_applies(problem):
        return None
    found = best_periodic(problem, math.inf)
    if found is None:
        return {"found": False}
    valid = valid_start(problem, found.schedule)
    return {"found": True, "objective": found.objective, "hash": schedule_hash(found.schedule),
            "valid": valid is not None,
            "replaces_start": valid is not None and found.objective < start_objective * (1 - 1e-12)}


def layered_profile(folder: Path) -> tuple[zb.Profile, Path]:
    """A small Llama-style profile with layers, estimated (FLOP counts, no torch): 8 blocks, p=4, m=8."""
    path = folder / "llama8.json"
    run_cli(["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "8", "--hidden", "256",
             "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "4", "-m", "8", "-o", str(path)])
    return zb.load_profile(path), path


def layers_record(profile: zb.Profile) -> dict[str, Json]:
    """The layered profile's numbers, so a change in the estimate shows as such."""
    layers = [asdict(layer) for layer in profile.layers or ()]
    return {"count": len(layers), "hash": hashlib.sha256(json.dumps(clean(layers), sort_keys=True).encode())
            .hexdigest()[:16]}


def split_request(profile: zb.Profile, mem_limit: str) -> SplitRequest:
    return SplitRequest(profile, profile.num_stages, ("linear", "v"), mem_limit, "makespan")


def seeds_record(request: SplitRequest, placement_name: str) -> dict[str, Json]:
    """Item 6: the placement's seed splits scored by the heuristics (SplitSearch.score), each with its cheap
    bound, and the one-layer moves (improve_split, no deadline) from the best of them."""
    placement = parse_placement(placement_name, request.num_ranks)
    search = SplitSearch(request, math.inf)
    data = bound_input(request.profile, placement, request.mem_limit, request.objective, request.headroom)
    seeds = []
    for origin, counts in seed_splits(request, placement):
        scored = search.score(placement, counts, origin)
        seeds.append({"origin": origin, "counts": list(counts), "objective": scored.objective, "peak": scored.peak,
                      "split_bound": split_bound(data, counts)})
    best = min((search.score(placement, tuple(s["counts"]), s["origin"]) for s in seeds), key=lambda s: s.key)
    moved = improve_split(search, best, math.inf) if best.objective < math.inf else best
    return {"seeds": seeds, "any_split_bound_dp": any_split_bound(data),
            "moves": {"counts": list(moved.counts), "objective": moved.objective, "origin": moved.origin}}


def every_split_record(request: SplitRequest, incumbent: float, least: bool) -> dict[str, Json]:
    """Items 6 and 7: the bound over every split (partition/search.any_split_bound_of), the cheap DP alone
    and walked with a generous deadline; `least`: over every recompute choice too (recompute.py's
    _bound_over_choices: the layers at their least memory)."""
    if least:
        request = replace(request, profile=replace(request.profile, layers=least_memory(request.profile.layers or ())))
    cheap = any_split_bound_of(request, SplitSearch(request, math.inf), incumbent, None)
    walked = any_split_bound_of(request, SplitSearch(request, math.inf), incumbent, time.monotonic() + WALK_SECONDS)
    complete = all(how["walk_complete"] for how in walked.by_placement.values())
    return {"dp": {"bound": cheap.value, "by_placement": cheap.by_placement},
            "walk": {"bound": walked.value, "by_placement": walked.by_placement} if complete
            else "walk incomplete: not recorded"}


def run_cli(args: list[str]) -> str:
    """`zbsearch ARGS` in this process; its stdout. Raises on a non-zero exit."""
    result = CliRunner().invoke(app, args)
    if result.exit_code != 0:
        raise RuntimeError(f"zbsearch {' '.join(args)} exited {result.exit_code}: {result.output[-2000:]}")
    return result.stdout


def solve_json(args: list[str]) -> dict[str, Json]:
    """`zbsearch solve ARGS --json`, parsed."""
    return json.loads(run_cli(["solve", *args, "--json"]))


def memory_record(report: dict[str, Json]) -> dict[str, Json]:
    """Item 9: the figures of a plain solve; reproducible only where no CP-SAT ran (the schedule is the
    heuristic's), which `deterministic` says."""
    keys = ("schedule", "placement", "objective_value", "lower_bound", "status", "cpsat_status",
            "peak_memory_per_rank", "peak_memory_bytes_per_rank", "static_bytes_per_rank")
    out = {k: report.get(k) for k in keys}
    out["deterministic"] = report["status"] == "optimal" and report["cpsat_status"] == "not run"
    return out


# ---------------------------------------------------------------- the instances and the recording

def stage_instances() -> list[tuple[str, zb.Profile, str, str]]:
    """(label, profile, memory limit, placement) for items 1-5."""
    paper = zb.load_profile(ROOT / "profiles/zb-paper-1.5b-m24.json")
    h100 = zb.load_profile(ROOT / "profiles/h100.json")
    uniform = zb.uniform_profile(1.0, 2.0, 1.0, p=4, m=8)
    out = [("zb-1.5b-m24", paper, lim, pl) for pl in ("linear", "v") for lim in ("1p", "2p")]
    out += [("h100", h100, "2p", pl) for pl in ("linear", "v")]
    out += [("uniform-1,2,1-p4-m8", uniform, lim, pl) for pl, lim in
            (("linear", "1p"), ("v", "1p"), ("interleaved:2", "1p"), ("v", "2p"))]
    hetero, limit = hetero_random()[12]  # solve_bench's hetero-random #12: the tuned start wins there
    return out + [("hetero-random-12-p8-m25", hetero, limit, "linear")]


def record_stage(profile: zb.Profile, mem_limit: str, placement: str) -> dict[str, Json]:
    problem = make_problem(profile, mem_limit, placement)
    start, objective = heuristic_record(problem)
    return {"heuristic_start": start, "candidates": candidates_record(problem), "bounds": bounds_record(problem),
            "tuned": tuned_record(problem, objective), "periodic": periodic_record(problem, objective)}


def record_layered(profile: zb.Profile) -> dict[str, Json]:
    out: dict[str, Json] = {"profile": layers_record(profile)}
    for mem_limit in ("2p", "40MiB"):
        request = split_request(profile, mem_limit)
        seeds = {name: seeds_record(request, name) for name in request.placements}
        incumbent = min(s["objective"] for rec in seeds.values() for s in rec["seeds"])
        out[mem_limit] = {"seeds": seeds, "incumbent": incumbent,
                          "every_split": every_split_record(request, incumbent, least=False),
                          "every_recompute_choice": every_split_record(request, incumbent, least=True)}
    return out


def key_structure(value: Json) -> Json:
    """The keys of a JSON value, nested, no values: a dict maps each key to its structure, a list of dicts
    to one merged structure in a list, anything else to null."""
    if isinstance(value, dict):
        return {k: key_structure(v) for k, v in value.items()}
    if isinstance(value, list):
        merged: dict[str, Json] = {}
        for item in value:
            if isinstance(item, dict):
                merged.update(key_structure(item))
        return [merged] if merged else None
    return None


def record_cli(layered_path: Path) -> dict[str, Json]:
    """Items 8 and 9. The cases are chosen so that which phases run (hence which keys appear) is decided by
    the heuristics and bounds, not by the clock: see results/determinism.md."""
    layered = ["--profile", str(layered_path), "--time-limit", "6"]
    cases = {"plain": ["--uniform", "1,2,1", "-p", "4", "-m", "8", "--mem-limit", "0.75p", "--objective", "span",
                       "--time-limit", "10"],
             "partition-auto": [*layered, "--mem-limit", "40MiB", "--partition", "auto"],
             "recompute-auto": [*layered, "--mem-limit", "2p", "--partition", "auto", "--recompute", "auto"]}
    out: dict[str, Json] = {"keys": {name: key_structure(solve_json(args)) for name, args in cases.items()}}
    memory = {"h100-2p": ["--profile", str(ROOT / "profiles/h100.json"), "--mem-limit", "2p"],
              "zb-1.5b-m24-2p-linear": ["--profile", str(ROOT / "profiles/zb-paper-1.5b-m24.json"), "--mem-limit",
                                        "2p", "--placement", "linear"]}
    out["memory"] = {name: memory_record(solve_json(args)) for name, args in memory.items()}
    return out


def clean(value: Json) -> Json:
    """JSON-ready: tuples as lists, non-finite floats as strings (plain JSON has none), keys as strings."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if hasattr(value, "value") and not isinstance(value, (int, float, str, bool)):
        return clean(value.value)  # an Enum
    return value


def record() -> dict[str, Json]:
    """Every item, keyed by section and instance."""
    out: dict[str, Json] = {"instances": {}}
    for label, profile, mem_limit, placement in stage_instances():
        out["instances"][f"{label} {placement} {mem_limit}"] = record_stage(profile, mem_limit, placement)
    with tempfile.TemporaryDirectory() as folder:
        profile, path = layered_profile(Path(folder))
        out["layered"] = record_layered(profile)
        out["cli"] = record_cli(path)
    return clean(out)


def dumps(data: Json) -> str:
    """Sorted, indented, floats at repr precision: the same data always gives the same bytes."""
    return json.dumps(data, indent=1, sort_keys=True, allow_nan=False) + "\n"


def flatten(value: Json, path: str = "") -> dict[str, Json]:
    """Every leaf by its path (a.b[2].c), for the comparison."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flatten(item, f"{path}.{key}" if path else key).items()}
    if isinstance(value, list) and value:
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{path}[{i}]").items()}
    return {path: value}


def differences(old: Json, new: Json) -> list[str]:
    """One line per leaf that differs, is missing or is new."""
    a, b = flatten(old), flatten(new)
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            lines.append(f"missing now: {key} (was {a[key]!r})")
        elif key not in a:
            lines.append(f"new: {key} = {b[key]!r}")
        elif a[key] != b[key]:
            lines.append(f"differs: {key}: {a[key]!r} -> {b[key]!r}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results/determinism.json",
                        help="where to write the record (default results/determinism.json)")
    parser.add_argument("--check", type=Path, default=None,
                        help="compare a fresh run with this committed record; exit 1 if any entry differs")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    data = record()
    text = dumps(data)
    if args.check is not None:
        lines = differences(json.loads(args.check.read_text()), data)
        for line in lines:
            print(line)
        print(f"{len(lines)} entries differ from {args.check} ({time.monotonic() - t0:.0f} s)")
        return 1 if lines else 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
