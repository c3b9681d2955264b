"""The search on DualPipe's placement (two model copies, two routes), its parameter copies in the memory
report and in `--mem-limit auto`, F&B pairs where the profile gives their time, and Chimera."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest
from typer.testing import CliRunner

import zbsearch as zb
from zbsearch.cli.app import app
from zbsearch.core.errors import InfeasibleError, MemoryLimitError, PreconditionError, ProfileError, ScheduleError
from zbsearch.core.ir import Action, Kind, build, dualpipe, linear
from zbsearch.core.memory import parse_mem_limit
from zbsearch.core.profile import Profile, uniform_profile
from zbsearch.plan.closed_forms import closed_form, profile_for
from zbsearch.schedules import generate
from zbsearch.schedules.spec import PassTimes
from zbsearch.search.options import SearchOptions
from zbsearch.search.greedy import candidates as H
from zbsearch.search.bounds.analytic import lower_bound, objective_bound, rank_bounds
from zbsearch.search.bounds.relaxations import overlap_relaxation
from zbsearch.core.placement import parse_placement
from zbsearch.search.problem import Problem, make_problem, make_problems
from zbsearch.core.placement import AUTO_PLACEMENTS, PARAM_COPY_PLACEMENTS
from zbsearch.search.solve.driver import solve
from zbsearch.sim.summary import summarize
from zbsearch.sim.validate import check, validate

GiB = 2**30
runner = CliRunner()


def stages_profile(stages: list[dict], m: int, comm: float = 0.0, **extra) -> Profile:
    return Profile.from_dict({"stages": stages, "microbatches": m, "comm": comm, "time_unit": "unit",
                              "source": {"kind": "estimated", "method": "test numbers"}, **extra})


# -- the placement and its rules ---------------------------------------------------------------------

def test_dualpipe_placement_parses_and_states_what_it_needs() -> None:
    assert parse_placement("DualPipe", 4) == dualpipe(4)
    with pytest.raises(PreconditionError) as odd:
        parse_placement("dualpipe", 3)
    assert str(odd.value) == "placement 'dualpipe' needs p even (half the ranks lead each direction); got p=3"
    with pytest.raises(PreconditionError) as few:
        make_problem(uniform_profile(1, 1, 1, p=4, m=6), "2p", "makespan", "dualpipe")
    assert str(few.value) == ("placement 'dualpipe' needs m even and m >= 2p (m/2 microbatches per direction, "
                              "at least p of them); got p=4, m=6")


def test_auto_tries_dualpipe_only_when_allowed_and_applicable() -> None:
    prof = uniform_profile(1, 1, 1, p=4, m=8)
    names = lambda auto: [pr.placement.name for pr in make_problems(prof, "2p", "makespan", "auto", auto)]
    assert names(AUTO_PLACEMENTS) == ["linear", "v"]
    assert names(AUTO_PLACEMENTS + PARAM_COPY_PLACEMENTS) == ["linear", "v", "dualpipe"]
    odd = uniform_profile(1, 1, 1, p=3, m=6)
    assert [pr.placement.name for pr in make_problems(odd, "2p", "makespan", "auto",
                                                      AUTO_PLACEMENTS + PARAM_COPY_PLACEMENTS)] == ["linear", "v"]


def cli_json(*args: object) -> dict:
    res = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert res.exit_code == 0, (res.stdout, res.stderr)
    return json.loads(res.stdout)


def test_cli_auto_needs_allow_param_copies_for_dualpipe() -> None:
    base = ["solve", "--uniform", "1,1,1", "-p", "4", "-m", "8", "--mem-limit", "2p", "--placement", "auto",
            "--time-limit", "6", "--json"]
    without = cli_json(*base)
    assert set(without["placements"]) == {"linear", "v"} and without["param_copies"] == 1
    allowed = cli_json(*base, "--allow-param-copies")
    assert set(allowed["placements"]) == {"linear", "v", "dualpipe"}
    # Two directions fill each other's warm-up: 25 (one forward of warm-up) beats linear's 27.
    assert allowed["placements"]["dualpipe"]["objective"] == 25.0
    assert allowed["placements"]["linear"]["objective"] == 27.0
    assert (allowed["placement"], allowed["param_copies"], allowed["makespan"]) == ("dualpipe", 2, 25.0)


# -- solving on the placement ---------------------------------------------------------------------------

@pytest.mark.parametrize("times,limit,objective", [
    ((1, 1, 1, 0.0), "2p", "makespan"), ((1, 2, 1, 0.1), "2p", "makespan"), ((2, 1, 1, 0.2), "2p", "span"),
])
def test_dualpipe_solve_validates_and_is_no_worse_than_dualpipe(times, limit, objective) -> None:
    prof = uniform_profile(*times, p=4, m=8)
    problem = make_problem(prof, limit, objective, "dualpipe")
    result = solve(problem, SearchOptions(time_limit=8))
    assert result.schedule.placement == dualpipe(4)
    tl = validate(result.schedule, prof, problem.limit)
    cost = tl.makespan if objective == "makespan" else tl.span
    assert cost == pytest.approx(result.objective)
    handcrafted = zb.simulate(generate("dualpipe", 4, 8), prof)
    assert result.objective <= (handcrafted.makespan if objective == "makespan" else handcrafted.span) + 1e-9
    assert result.lower_bound <= result.objective + 1e-9


def test_uniform_dualpipe_makespan_is_proven() -> None:
    # F = B = W = 1, p = 4, m = 8, 2p: every rank works 24, and one forward of warm-up is unavoidable.
    prof = uniform_profile(1, 1, 1, p=4, m=8)
    result = solve(make_problem(prof, "2p", "makespan", "dualpipe"), SearchOptions(time_limit=8))
    assert (result.objective, result.lower_bound, result.status) == (25.0, 25.0, "optimal")
    assert zb.simulate(generate("dualpipe", 4, 8), prof).makespan == 26.0


def _interleavings(chains: list[list[Action]]):
    if not any(chains):
        yield []
        return
    for i, chain in enumerate(chains):
        if chain:
            for tail in _interleavings(chains[:i] + [chain[1:]] + chains[i + 1:]):
                yield [chain[0]] + tail


def brute_force(problem: Problem) -> float:
    """Best objective over every per-rank order of the split passes, by enumeration."""
    pl, m = problem.placement, problem.num_microbatches
    per_rank = []
    for r in range(pl.num_ranks):
        chains = [[Action(c, k, i) for k in (Kind.F, Kind.B, Kind.W)]
                  for i in range(m) for c in pl.route(i, m) if pl.chunk_to_rank[c] == r]
        per_rank.append(list(_interleavings(chains)))
    best = math.inf
    for orders in itertools.product(*per_rank):
        try:
            tl = validate(build("bf", pl, m, orders), problem.profile, problem.limit)
        except ScheduleError:
            continue
        best = min(best, tl.makespan if problem.objective == "makespan" else tl.span)
    return best


@pytest.mark.parametrize("seed,limit,objective", [(1, "0.5p", "makespan"), (1, "1p", "span"), (2, "0.5p", "span"),
                                                  (2, "1p", "makespan")])
def test_tiny_two_route_instances_match_brute_force(seed: int, limit: str, objective: str) -> None:
    rng = random.Random(seed)
    stages = [{"F": rng.randint(6, 14), "B": rng.randint(6, 16), "W": rng.randint(3, 12), "mem_B": 1.0,
               "mem_W": rng.choice([0.3, 0.5])} for _ in range(2)]
    prof = stages_profile(stages, 2, comm=1.0)
    problem = Problem(prof, dualpipe(2), 2, parse_mem_limit(limit, prof), objective)
    optimum = brute_force(problem)
    assert lower_bound(problem) <= optimum + 1e-9, "an analytic bound above the optimum is wrong"
    result = solve(problem, SearchOptions(time_limit=10))
    assert result.objective == pytest.approx(optimum)
    assert result.lower_bound <= optimum + 1e-9
    assert result.status == "optimal"


@pytest.mark.parametrize("limit", ["1p", "2p"])
def test_every_greedy_variant_on_two_routes_validates_or_is_refused(limit: str) -> None:
    stages = [{"F": 1 + 0.1 * s, "B": 2, "W": 1, "mem_B": 1.0, "mem_W": 0.5} for s in range(4)]
    prof = stages_profile(stages, 8, comm=0.1)
    mem = parse_mem_limit(limit, prof)
    problem = Problem(prof, dualpipe(4), 8, mem)
    for opt in H.greedy_variants(dualpipe(4)):
        try:
            sched = H.greedy(problem, opt)
        except InfeasibleError:
            # Rank-by-rank admission can deadlock two opposite routes; admitting by route never does.
            assert not opt.by_route, opt.label
            continue
        report = check(sched, prof, mem)
        assert report.ok, (opt.label, report.problems)


# -- parameter copies in the memory report and in auto ------------------------------------------------

def bytes_profile(capacity: float = 80 * GiB, static: float = 20 * GiB) -> Profile:
    stage = {"F": 1, "B": 1, "W": 1, "mem_B": 2 * GiB, "mem_W": GiB, "static_bytes": static}
    return Profile.from_dict({"stages": [stage] * 4, "microbatches": 8, "memory_unit": "bytes",
                              "device_capacity_bytes": capacity,
                              "source": {"kind": "estimated", "method": "test numbers"}})


def test_auto_subtracts_both_parameter_copies_on_dualpipe() -> None:
    prof = bytes_profile()
    assert parse_mem_limit("auto", prof, headroom=0).per_rank == (60 * GiB,) * 4
    assert parse_mem_limit("auto", prof, dualpipe(4), headroom=0).per_rank == (40 * GiB,) * 4
    assert make_problem(prof, "auto", "makespan", "dualpipe", headroom=0).limit.per_rank == (40 * GiB,) * 4
    with pytest.raises(MemoryLimitError) as err:
        parse_mem_limit("auto", bytes_profile(capacity=30 * GiB), dualpipe(4))
    assert str(err.value) == ("memory limit auto leaves no room on rank 0: the 2 parameter copies it holds on "
                              "placement 'dualpipe' (40 GiB) exceed the usable device memory (27.6 GiB after a 8% "
                              "headroom)")
    assert parse_mem_limit("auto", bytes_profile(capacity=30 * GiB), headroom=0).per_rank == (10 * GiB,) * 4


def test_the_summary_counts_the_second_parameter_copy() -> None:
    prof = bytes_profile()
    on_dualpipe = summarize(zb.simulate(generate("dualpipe", 4, 8), prof))
    assert (on_dualpipe.param_copies, on_dualpipe.static_bytes_per_rank) == (2, [40 * GiB] * 4)
    on_linear = summarize(zb.simulate(generate("1f1b", 4, 8), prof))
    assert (on_linear.param_copies, on_linear.static_bytes_per_rank) == (1, [20 * GiB] * 4)
    on_v = summarize(zb.simulate(generate("zb-v", 4, 8), prof))
    assert (on_v.param_copies, on_v.static_bytes_per_rank) == (1, [20 * GiB] * 4)
    relative = summarize(zb.simulate(generate("dualpipe", 4, 8), uniform_profile(1, 1, 1, p=4, m=8)))
    assert (relative.param_copies, relative.static_bytes_per_rank) == (2, None)


def test_cli_solve_dualpipe_reports_both_copies(tmp_path) -> None:
    path = tmp_path / "bytes.json"
    bytes_profile().save(path)
    data = cli_json("solve", "--profile", path, "--mem-limit", "auto", "--placement", "dualpipe",
                    "--time-limit", "5", "--json")
    assert (data["placement"], data["param_copies"], data["mem_limit"]) == ("dualpipe", 2, "auto")
    assert data["static_bytes_per_rank"] == [40 * GiB] * 4
    res = runner.invoke(app, ["solve", "--profile", str(path), "--mem-limit", "auto", "--placement", "dualpipe",
                              "--time-limit", "5"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.stderr
    assert "static (GiB, 2 copies)" in res.stdout and "2 parameter copies per rank" in res.stdout
    assert res.stdout.count("40.000") == 4      # one static cell per rank


# -- F&B pairs where the profile gives their time ------------------------------------------------------

def test_overlap_time_is_checked_and_prices_a_pair() -> None:
    with pytest.raises(ProfileError, match=r"overlap_f_b \(4\.0\) is outside \[2\.0, 3\.0\]"):
        stages_profile([{"F": 1, "B": 1, "W": 1, "overlap_f_b": 4}], 2)
    prof = stages_profile([{"F": 1, "B": 1, "W": 1, "overlap_f_b": 2.25}] * 4, 8)
    plain = uniform_profile(1, 1, 1, p=4, m=8)
    sched = generate("dualpipe", 4, 8)
    # DualPipe's pairs are (F, full backward): 3 apart, 2.25 overlapped.
    assert zb.simulate(sched, plain).makespan == 26.0
    assert zb.simulate(sched, prof).makespan == 23.0
    # Its closed form gives pairs no credit: not exact once the profile gives an overlap time.
    times = PassTimes.of(prof)
    assert not closed_form("dualpipe", 4, 8, times).exact
    assert closed_form("dualpipe", 4, 8, PassTimes.of(plain)).exact


def test_pairs_are_a_choice_only_where_the_profile_gives_their_time() -> None:
    assert not any(o.pairs for o in H.greedy_variants(dualpipe(4)))
    assert any(o.pairs for o in H.greedy_variants(dualpipe(4), pairs=True))
    prof = stages_profile([{"F": 1, "B": 1, "W": 1, "overlap_f_b": 2.25}] * 4, 8)
    mem = parse_mem_limit("2p", prof)
    found = {name: tl.makespan for name, _, tl in H.candidates(Problem(prof, dualpipe(4), 8, mem, "makespan"),
                                                               same_placement=True)}
    paired = {n: t for n, t in found.items() if "f&b-pairs" in n}
    assert paired and min(paired.values()) < min(t for n, t in found.items() if n.startswith("greedy") and n not in paired)
    problem = make_problem(prof, "2p", "makespan", "dualpipe")
    result = solve(problem, SearchOptions(time_limit=6))
    validate(result.schedule, prof, problem.limit)
    assert result.objective == 23.0 and result.start_heuristic == "dualpipe"
    # The bound is the passes' at their shortest (0.75 of their time here), never CP-SAT's pairless one.
    relaxed = objective_bound(rank_bounds(problem, overlap_relaxation(problem)), "makespan")
    assert result.lower_bound == pytest.approx(relaxed) and relaxed < 25.0
    assert "not used" in result.details.cpsat_bound


# -- Chimera ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("p,m", [(2, 2), (2, 6), (4, 4), (4, 8), (4, 12), (6, 6), (6, 12), (8, 8), (8, 16)])
def test_chimera_validates_and_meets_its_closed_forms(p: int, m: int) -> None:
    sched = generate("chimera", p, m)
    assert sched.placement == dualpipe(p)
    prof = uniform_profile(1, 0.5, 0.5, p=p, m=m)       # F = full backward: the paper's setting
    tl = validate(sched, prof)
    work = m * 2.0
    assert tl.makespan - work == pytest.approx((p - 2) * 1.0)          # (p-2)F: (p-2)/(2m+p-2) of the time
    assert tl.bubble_rate_makespan == pytest.approx((p - 2) / (2 * m + p - 2))
    assert max(tl.peak_memory(r) for r in range(p)) == pytest.approx(p)
    # Backward twice the forward: the concatenated units leave (p-2)(BW-F) each between them.
    slow = zb.simulate(sched, profile_for(PassTimes(1, 1, 1), p, m))
    assert slow.makespan - m * 3 == pytest.approx((p - 2) * (2 + (m // p - 1) * 1))


def test_chimera_refuses_what_it_cannot_run_and_joins_the_dualpipe_candidates() -> None:
    with pytest.raises(PreconditionError, match=r"^chimera needs p even .*; got p=3, m=6$"):
        generate("chimera", 3, 6)
    with pytest.raises(PreconditionError, match=r"^chimera needs m a multiple of p \(whole basic units"):
        generate("chimera", 4, 6)
    prof = uniform_profile(2, 1, 1, p=4, m=8)
    names = [n for n, _, _ in H.candidates(Problem(prof, dualpipe(4), 8, parse_mem_limit("1p", prof), "makespan"),
                                           same_placement=True)]
    assert "chimera" in names and "dualpipe" not in names      # 1p holds Chimera's p, not DualPipe's p+1
    assert all(n.endswith("@dualpipe") for n in names if n.startswith("greedy"))
    on_linear = Problem(prof, linear(4), 8, parse_mem_limit("1p", prof), "makespan")
    assert not any(n == "chimera" for n, _, _ in H.candidates(on_linear, same_placement=True))
