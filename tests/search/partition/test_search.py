"""The joint search over splits, placements and schedules, and the bound over every split."""

from __future__ import annotations

import itertools
import json
import math
import random
import time

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import InfeasibleError, PartitionError
from zbsearch.core.ir import linear, vshape
from zbsearch.core.profile import Profile
from zbsearch.core.memory import DEFAULT_HEADROOM
from zbsearch.search.budget import Budget
from zbsearch.search.options import SearchOptions
from zbsearch.search.partition import bounds as bounds_module, enumerate as enumerate_module, search as search_module
from zbsearch.search.partition.polish import NEAR, POLISH, to_polish as _to_polish
from zbsearch.search.partition.search import Scored, SplitRequest, SplitSearch, any_split_bound_of, search_splits
from zbsearch.search.partition.bounds import any_split_bound, least_bound_split, split_bound
from zbsearch.search.partition.enumerate import bound_input, refined_bound


def _bound(request: SplitRequest, placement, incumbent: float = math.inf, walk: bool = False) -> float:
    data = bound_input(request.profile, placement, request.mem_limit, request.objective, DEFAULT_HEADROOM)
    if not walk:
        return any_split_bound(data)
    search = SplitSearch(request, 1e18)
    # With the strong bound (the chain walk) as the search runs it: the walk then takes the larger of
    # two bounds, so both must hold.
    return refined_bound(data, incumbent, search.leaf_bound(placement), time.monotonic() + 60,
                         search.leaf_bound(placement, chains=True))[0]
from zbsearch.core.placement import parse_placement
from zbsearch.search.solve.driver import solve
from zbsearch.search.partition.candidates import even_counts, memory_capped_counts, parse_rule
from zbsearch.sim.validate import check

GiB = 2**30


def random_layers(n: int, seed: int, *, static: float = 1.0, embedding: bool = True) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        F = rng.choice([1, 2, 3])
        kind = "embedding" if embedding and i == 0 else "output" if i == n - 1 else "decoder"
        out.append({"name": f"layers.{i}", "kind": kind, "F": F, "B": F + rng.choice([0, 1]), "W": rng.choice([1, 2]),
                    "mem_B": rng.choice([2, 3]) * GiB, "mem_W": GiB, "static_bytes": static * rng.choice([1, 2]) * GiB,
                    "out_bytes": 1.0})
    return out


def layered(layers: list[dict], m: int, comm: float = 0.0) -> Profile:
    return Profile.from_dict({
        "name": "toy", "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB}], "microbatches": m,
        "time_unit": "unit", "memory_unit": "bytes", "comm": comm, "device_capacity_bytes": 80.0 * GiB,
        "layers": layers, "source": {"kind": "estimated", "method": "random layers for tests"}})


def all_splits(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0,) + cuts + (n,)
        yield tuple(b - a for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize("seed,placement,cap,objective,n,p", [
    (0, "linear", None, "makespan", 5, 2), (1, "linear", "16GiB", "makespan", 5, 2),
    (2, "linear", "14GiB", "span", 5, 2), (3, "v", None, "makespan", 5, 2), (4, "v", "20GiB", "makespan", 5, 2),
    (5, "v", None, "span", 5, 2), (6, "linear", "18GiB", "makespan", 7, 3), (7, "v", "24GiB", "makespan", 7, 3),
    (8, "v", "2p", "span", 7, 3), (9, "interleaved", None, "makespan", 5, 2),
    (10, "interleaved", "20GiB", "makespan", 6, 2), (11, "interleaved", "2p", "span", 6, 2),
    (12, "interleaved", "24GiB", "makespan", 7, 3),
])
def test_the_any_split_bound_is_below_every_splits_optimum(seed, placement, cap, objective, n, p):
    """Brute force: solve every split of a small layer list to proven optimality; the bound over every
    split must not exceed the best of those optima."""
    m = 3
    prof = layered(random_layers(n, seed), m)
    pl = parse_placement(placement, p)
    request = SplitRequest(prof, p, (placement,), cap, objective, "auto")
    search = SplitSearch(request, 1e18)
    optima = []
    for counts in all_splits(n, len(pl.routes[0])):
        try:
            result = solve(search.problem(pl, counts), SearchOptions(time_limit=20))
        except InfeasibleError:
            continue
        assert result.status == "optimal"
        optima.append(result.objective)
    assert optima, "the test needs at least one feasible split"
    assert _bound(request, pl) <= min(optima) * (1 + 1e-9)
    # The walk, with no incumbent to stop it, visits every split: its bound is the least own bound.
    assert _bound(request, pl) <= _bound(request, pl, walk=True) <= min(optima) * (1 + 1e-9)


@pytest.mark.parametrize("seed,placement,cap,objective,n,p,comm,fused", [
    (20, "linear", "16GiB", "makespan", 6, 3, 0.5, False), (21, "linear", "14GiB", "span", 6, 3, 1.0, True),
    (22, "v", "20GiB", "makespan", 6, 2, 0.5, False), (23, "v", "18GiB", "span", 6, 2, 1.0, False),
    (24, "v", "22GiB", "makespan", 7, 3, 0.5, True), (25, "v", None, "makespan", 7, 3, 1.0, False),
    (26, "v", "2p", "makespan", 6, 2, 1.0, False), (27, "linear", None, "makespan", 5, 2, 1.0, True),
    (28, "interleaved", "20GiB", "makespan", 6, 2, 0.5, False), (29, "interleaved", "16GiB", "span", 6, 2, 1.0, True),
    (30, "interleaved", None, "makespan", 7, 3, 0.5, False), (31, "interleaved", "2p", "makespan", 6, 2, 1.0, False),
])
def test_each_splits_cheap_bound_is_below_its_own_optimum(seed, placement, cap, objective, n, p, comm, fused):
    """Split by split, with hops between ranks and (fused) backwards cheaper than B and W apart: the
    cheap bound the DPs minimise (split_bound) and the split's own analytic bound never exceed what
    the split achieves (its proven optimum, or with fused backwards the best schedule found)."""
    m = 3
    layers = random_layers(n, seed)
    if fused:
        for layer in layers[1:]:
            layer["full_backward"] = layer["B"] + layer["W"] - 0.5
    prof = layered(layers, m, comm=comm)
    pl = parse_placement(placement, p)
    request = SplitRequest(prof, p, (placement,), cap, objective, "auto")
    search = SplitSearch(request, 1e18)
    data = bound_input(prof, pl, cap, objective, DEFAULT_HEADROOM)
    checked = 0
    for counts in all_splits(n, len(pl.routes[0])):
        try:
            result = solve(search.problem(pl, counts), SearchOptions(time_limit=20))
        except InfeasibleError:
            assert split_bound(data, counts) == float("inf") or True  # a cheap bound may miss infeasibility
            continue
        assert fused or result.status == "optimal"
        assert split_bound(data, counts) <= result.objective * (1 + 1e-9), counts
        assert search.leaf_bound(pl)(counts) <= result.objective * (1 + 1e-9), counts
        assert search.leaf_bound(pl, chains=True)(counts) <= result.objective * (1 + 1e-9), counts
        checked += 1
    assert checked, "the test needs at least one feasible split"


@pytest.mark.parametrize("placement,cap,p", [("linear", "24GiB", 3), ("v", "30GiB", 3), ("linear", None, 4),
                                              ("v", "2p", 2)])
def test_the_least_bound_split_has_the_least_cheap_bound(placement, cap, p):
    """The split the DP returns is one whose cheap bound is the DP's value, and no split's is lower."""
    prof = layered(random_layers(9, 5), 4, comm=0.5)
    pl = parse_placement(placement, p)
    data = bound_input(prof, pl, cap, "makespan", DEFAULT_HEADROOM)
    least = least_bound_split(data)
    assert least is not None and sum(least) == 9 and len(least) == len(pl.routes[0])
    assert split_bound(data, least) == pytest.approx(any_split_bound(data))
    assert min(split_bound(data, c) for c in all_splits(9, len(pl.routes[0]))) == pytest.approx(any_split_bound(data))


def test_the_bound_says_no_split_fits_when_none_does():
    prof = layered(random_layers(5, 7, static=4.0), 3)
    request = SplitRequest(prof, 2, ("linear",), "8GiB", "makespan", "auto")
    assert _bound(request, linear(2)) == float("inf")


def test_joint_search_beats_or_ties_the_named_splits_and_stays_under_the_cap():
    prof = layered(random_layers(9, 11), 8, comm=0.5)
    for rule in ("even", "balanced"):
        fixed = search_splits(SplitRequest(prof, 3, ("linear",), "24GiB", "makespan", rule), SearchOptions(time_limit=5))
        auto = search_splits(SplitRequest(prof, 3, ("linear",), "24GiB", "makespan", "auto"), SearchOptions(time_limit=10))
        assert auto.objective <= fixed.objective * (1 + 1e-9)
    report = check(auto.schedule, auto.problem.profile, auto.problem.limit)
    assert report.ok
    part = auto.details.partition
    assert part is not None
    for rank in part.facts.ranks:
        assert rank.total_bytes <= 24 * GiB * (1 + 1e-9) and rank.fits
    assert auto.lower_bound == pytest.approx(min(auto.objective, part.any_split_bound))
    assert sum(part.facts.layers_per_chunk) == 9
    assert auto.schedule.plan.split.to_json()["chunks"] == part.facts.to_dict()["chunks"]


@pytest.mark.parametrize("seed, layers, m, comm, cap", [(0, 10, 12, 0.0, 16), (11, 10, 12, 0.5, 14)])
def test_the_joint_search_starts_no_split_partition_names_worse_than_partition_name_does(seed, layers, m, comm, cap):
    """Issue 39, deliverable 1: the joint search scored splits with the heuristic start alone, while
    `--partition balanced` solves its split from the tuned and periodic starts too; under a tight cap on V
    the periodic start wins, so the joint plan lost to the balanced one (seed 0: 349 against 333; seed 11:
    368 on linear against 356 on V). Now every named split gets those starts, with the seconds
    `--partition NAME` gives them, and the polish starts from the best. CP-SAT and the LNS get no time here
    (reserve 1: every plan is a start), which is what the construction guarantees: the periodic sweep of
    these splits takes about 0.2 s of its 1.5 s."""
    prof = layered(random_layers(layers, seed), m, comm=comm)
    options = SearchOptions(time_limit=30.0, budget=Budget(reserve=1.0))

    def plan(rule: str) -> float:
        return search_splits(SplitRequest(prof, 4, ("linear", "v"), f"{cap}GiB", "makespan", rule), options).objective

    auto = plan("auto")
    assert auto <= plan("balanced") * (1 + 1e-9) and auto <= plan("even") * (1 + 1e-9)


def test_past_its_time_the_joint_search_scores_only_the_splits_partition_names():
    """Each named split costs a heuristic run (0.4 s at p=8, m=32): the search once scored them all whatever
    the limit, and ran 3x over a short one. With no time it scores, on each placement, only the splits
    `--partition` names (even and balanced: the joint search must not lose to either, issue 39), and gives
    a valid plan still; with time, every one."""
    prof = layered(random_layers(9, 11), 8, comm=0.5)
    request = SplitRequest(prof, 3, ("linear", "v"), "24GiB", "makespan", "auto")
    rushed = search_splits(request, SearchOptions(time_limit=0.0))
    assert 2 <= rushed.details.partition.splits_scored <= 2 * 2
    assert check(rushed.schedule, rushed.problem.profile, rushed.problem.limit).ok
    roomy = search_splits(request, SearchOptions(time_limit=4.0))
    assert roomy.details.partition.splits_scored > 2 * 3  # every named split (at least 3 a placement), and moves


def test_the_second_split_polished_is_the_near_one_with_the_least_own_bound():
    """After the best heuristic split, the solver gets the split whose heuristic is within NEAR of it
    and whose own bound leaves the most to gain, not merely the runner-up; with none near, the
    runner-up."""
    placement = parse_placement("linear", 3)

    class Bounds:  # the one thing _to_polish asks of the search
        own: dict[tuple[int, ...], float] = {}

        def leaf_bound(self, _placement):
            return lambda counts: self.own[tuple(counts)]

    def ranked(*rows):
        Bounds.own = {counts: bound for counts, _, bound in rows}
        return [Scored(placement, counts, "test", objective=obj, peak=1.0) for counts, obj, _ in rows]

    rows = ranked(((3, 3, 3), 100.0, 97.0), ((4, 3, 2), 100.5, 97.0), ((2, 4, 3), 101.0, 93.0),
                  ((2, 3, 4), 101.5, 95.0), ((5, 2, 2), 110.0, 80.0))
    chosen = _to_polish(Bounds(), rows)
    assert [s.counts for s in chosen] == [(3, 3, 3), (2, 4, 3)][:POLISH]
    far = ranked(((3, 3, 3), 100.0, 97.0), ((4, 3, 2), 100.0 * (1 + NEAR) + 1, 90.0), ((5, 2, 2), 120.0, 80.0))
    assert [s.counts for s in _to_polish(Bounds(), far)] == [(3, 3, 3), (4, 3, 2)][:POLISH]


def test_each_placement_reports_its_best_plan_beside_its_bound():
    """The joint answer is the best plan found on any placement, and each placement's best sits at or
    above that placement's bound over every split."""
    prof = layered(random_layers(10, 12), 8, comm=0.5)
    auto = search_splits(SplitRequest(prof, 2, ("linear", "v"), "24GiB", "makespan", "auto"), SearchOptions(time_limit=8))
    assert auto.details.partition is not None
    by = auto.details.partition.any_split_bound_by_placement
    assert set(by) == {"linear", "v"}
    assert min(facts["best_found"] for facts in by.values()) == pytest.approx(auto.objective)
    for facts in by.values():
        assert facts["best_found"] >= facts["bound"] * (1 - 1e-9)


def test_the_joint_searchs_bound_stays_below_every_splits_optimum():
    """End to end, with the walk over every split run before the polish and again after it (each
    placement keeping the larger bound): the bound the joint search reports never exceeds the best
    proven optimum of any split on either placement, nor the plan it returns."""
    prof = layered(random_layers(5, 3), 3)
    request = SplitRequest(prof, 2, ("linear", "v"), "20GiB", "makespan", "auto")
    auto = search_splits(request, SearchOptions(time_limit=8))
    search, best = SplitSearch(request, 1e18), math.inf
    for name in ("linear", "v"):
        placement = parse_placement(name, 2)
        for counts in all_splits(5, len(placement.routes[0])):
            try:
                result = solve(search.problem(placement, counts), SearchOptions(time_limit=20))
            except InfeasibleError:
                continue
            assert result.status == "optimal"
            best = min(best, result.objective)
    assert auto.details.partition is not None and auto.details.partition.any_split_bound <= best * (1 + 1e-9)
    assert best <= auto.objective * (1 + 1e-9)


def test_even_spreads_blocks_and_keeps_the_ends_on_the_end_chunks():
    layers = layered(random_layers(10, 0), 4).layers
    assert even_counts(layers, 4) == (3, 2, 2, 3)  # 8 blocks: 2 each; embedding first, head last


def test_memory_capped_split_moves_layers_off_the_rank_that_holds_most():
    layers = layered([{"name": f"l{i}", "F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB / 2, "static_bytes": GiB}
                      for i in range(8)], 4).layers
    # 1F1B holds 2 microbatches on rank 0 and 1 on rank 1: c layers on rank 0 need 3c GiB there and
    # 2(8 - c) GiB on rank 1. Under 9 GiB that asks c <= 3 and c >= 4: no split.
    assert memory_capped_counts(layers, linear(2), [9 * GiB, 9 * GiB], [2, 1]) is None
    assert memory_capped_counts(layers, linear(2), [10 * GiB, 10 * GiB], [2, 1]) == (3, 5)


@pytest.mark.parametrize("text,message", [
    ("fixed:1,2", "layers per chunk 1,2 add up to 3 but the model has 9 layers"),
    ("fixed:3,3,3", "give 3 chunks but placement 'linear' on 2 ranks has 2"),
    ("fixed:a,b", "write fixed: and whole numbers"),
    ("greedy", "partition 'greedy' is not known: use auto, even, balanced or fixed:N1,N2,..."),
])
def test_bad_rules_say_what_to_write(text, message):
    layers = layered(random_layers(9, 1), 4).layers
    with pytest.raises(PartitionError, match=message):
        parse_rule(text, layers, linear(2))


def test_a_layer_too_big_for_the_cap_is_named():
    prof = layered(random_layers(5, 3, static=6.0), 3)
    with pytest.raises(InfeasibleError, match=r"for any split: layer 'layers\.\d' alone needs"):
        search_splits(SplitRequest(prof, 2, ("linear",), "9GiB", "makespan", "auto"), SearchOptions(time_limit=2))


def test_cli_partition_errors_are_one_line(tmp_path):
    runner = CliRunner()
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"stages": [{"F": 1, "B": 1, "W": 1}] * 2, "source": {"kind": "estimated",
                                                                                      "method": "test"}}))
    result = runner.invoke(app, ["solve", "--profile", str(plain), "--partition", "auto", "--mem-limit", "2p"])
    assert result.exit_code == 1
    assert "has none (no layers list)" in result.output and "Traceback" not in result.output
    layered_file = tmp_path / "layers.json"
    layered_file.write_text(json.dumps(layered(random_layers(9, 2), 4).to_dict()))
    result = runner.invoke(app, ["solve", "--profile", str(layered_file), "-p", "2", "--placement", "linear",
                                 "--partition", "fixed:4,4", "--mem-limit", "2p"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1].startswith("error: --partition: layers per chunk 4,4 add up to 8")
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["solve", "--profile", str(layered_file), "-p", "3", "--partition", "auto",
                                 "--mem-limit", "40GiB", "--time-limit", "5", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "any split: lower bound" in result.output and "split (auto): layers per chunk" in result.output
    assert "split" in json.loads(out.read_text()).get("plan", {})
    # validate costs the schedule on the split it carries, so it finds the makespan solve reported.
    solved = json.loads(runner.invoke(app, ["solve", "--profile", str(layered_file), "-p", "3", "--partition", "auto",
                                            "--mem-limit", "40GiB", "--time-limit", "5", "--json", "-o",
                                            str(out)]).output)
    checked = runner.invoke(app, ["validate", str(out), "--profile", str(layered_file), "--mem-limit", "40GiB"])
    assert checked.exit_code == 0, checked.output
    assert f"makespan {solved['objective_value']:,.0f}" in checked.output and "within --mem-limit 40GiB" in checked.output


@pytest.mark.parametrize("rule", ["auto", "even", "balanced"])
def test_more_chunks_than_layers_is_a_clear_error(rule):
    prof = layered(random_layers(5, 1), 4)
    with pytest.raises(PartitionError, match="the model has 5 layers but placement 'v' on 3 ranks has 6 chunks"):
        search_splits(SplitRequest(prof, 3, ("v",), None, "makespan", rule), SearchOptions(time_limit=2))


def test_a_cap_no_split_fits_names_the_least_cap_that_does():
    # Static bytes + mem_B per layer: 1 + 2 (embedding), then 2 + 3 or so; min-max over 2 stages.
    prof = layered(random_layers(6, 4), 3)
    per_layer = [layer.static_bytes + layer.mem_B for layer in prof.layers]
    least = min(max(sum(per_layer[:k]), sum(per_layer[k:])) for k in range(1, 6))
    with pytest.raises(InfeasibleError, match=r"infeasible for every split tried: on one stage per rank the least any "
                       rf"split needs is {math.ceil(least / GiB * 100) / 100:g} GiB per rank"):
        search_splits(SplitRequest(prof, 2, ("linear",), f"{least / GiB - 0.5:g}GiB", "makespan", "auto"),
                      SearchOptions(time_limit=2))
    fits = search_splits(SplitRequest(prof, 2, ("linear",), f"{least / GiB:g}GiB", "makespan", "auto"), SearchOptions(time_limit=2))
    assert fits.details.partition is not None
    assert all(rank.fits for rank in fits.details.partition.facts.ranks)


def test_the_bound_line_names_the_placement_that_holds_the_bound_down():
    from types import SimpleNamespace

    from zbsearch.cli.split import bound_line

    by = {"linear": {"bound": 98.0, "best_found": 100.0}, "v": {"bound": 90.0, "best_found": 130.0}}
    details = SimpleNamespace(partition=SimpleNamespace(any_split_bound=90.0, splits_scored=7,
                                                        any_split_bound_by_placement=by))
    plan = SimpleNamespace(objective=100.0, details=details, problem=SimpleNamespace(placement=linear(2)))
    line = bound_line(plan)
    assert "gap 10.00%" in line and "the bound is placement v's, whose best plan found is 130" in line
    details.partition.any_split_bound_by_placement["v"]["bound"] = 99.0  # now the plan's own placement is lower
    assert "the bound is placement" not in bound_line(plan)
    # A plan at its bound: both placements' bounds are capped at it, and neither holds anything down.
    details.partition.any_split_bound = 100.0
    details.partition.any_split_bound_by_placement = {
        "linear": {"bound": 100.0, "best_found": 110.0}, "v": {"bound": 100.0, "best_found": 100.0}}
    plan.problem = SimpleNamespace(placement=vshape(2))
    line = bound_line(plan)
    assert "gap 0.00%" in line and "the bound is placement" not in line


def _whole_bound(search: SplitSearch, placement, counts, chains: bool) -> float:
    """A split's own bound from its whole problem, as the walk took it before ranks were cached."""
    from zbsearch.search.bounds.analytic import objective_bound, rank_bounds
    from zbsearch.search.bounds.relaxations import bound_passes
    try:
        problem = search.problem(placement, counts)
        problem.check_feasible()
    except InfeasibleError:
        return math.inf
    return objective_bound(rank_bounds(problem, bound_passes(problem), chains=chains, nesting=False), problem.objective)


@pytest.mark.parametrize("placement,cap,objective,p,n", [
    ("v", "15GiB", "makespan", 2, 7), ("v", "13GiB", "span", 3, 8), ("linear", "15GiB", "span", 3, 7),
    ("interleaved:2", "15GiB", "makespan", 2, 6),
])
def test_rank_cached_split_bounds_equal_the_whole_problems(placement, cap, objective, p, n):
    """Every split's own bound taken rank by rank from a cache shared across splits (partition/leaf.py)
    equals the bound of its whole problem: a rank's bound reads only its own layers while hops cost
    the same everywhere. With the chain walk it may only be larger (a rank walked in another split
    keeps its walk). The caps leave some splits with no schedule (a rank cannot hold one microbatch)."""
    prof = layered(random_layers(n, seed=n + p, static=1.0), m=2 * p, comm=0.5)
    pl = parse_placement(placement, p)
    search = SplitSearch(SplitRequest(prof, p, (placement,), cap, objective, "auto"), 1e18)
    splits = list(all_splits(n, len(pl.routes[0])))
    finite = 0
    for chains in (False, True):
        for counts in splits:
            cached, whole = search.leaf_bound(pl, chains)(counts), _whole_bound(search, pl, counts, chains)
            if chains:
                assert cached >= whole * (1 - 1e-12), counts
            else:
                assert cached == pytest.approx(whole, rel=1e-12), counts
            finite += cached < math.inf
    assert search.ranks.exact and 0 < finite < 2 * len(splits)
    assert len(search.ranks.ranks) < len(splits) * p  # ranks recur across splits: the cache is used


def test_hops_that_depend_on_the_cut_turn_the_rank_cache_off():
    """Where a hop's time follows the bytes crossing that cut, a rank's paths depend on the other ranks'
    cuts: every split is then bounded whole."""
    layers = random_layers(6, seed=5)
    for k, layer in enumerate(layers):
        layer["out_bytes"] = float(k + 1)
    data = json.loads(json.dumps(layered(layers, m=4).to_dict()))
    data["link_bandwidth"] = 2.0
    prof = Profile.from_dict(data)
    pl = parse_placement("v", 2)
    search = SplitSearch(SplitRequest(prof, 2, ("v",), None, "makespan", "auto"), 1e18)
    assert not search.ranks.exact
    for counts in all_splits(6, 4):
        assert search.leaf_bound(pl)(counts) == _whole_bound(search, pl, counts, False)
    assert not search.ranks.ranks


@pytest.mark.parametrize("placement", ["linear", "v"])
def test_the_heaviest_layer_floor_reads_w_at_its_least(placement):
    """A heavy layer whose fused backward costs what B alone does: a schedule runs it as F + full
    backward per microbatch, so the floor of the bound over every split must count that, not F + B + W
    (it did: 8 x 3 = 24 against a plan of about 17)."""
    heavy = {"name": "layers.0", "kind": "decoder", "F": 1.0, "B": 1.0, "W": 1.0, "full_backward": 1.0,
             "mem_B": GiB, "mem_W": GiB, "static_bytes": GiB, "out_bytes": 1.0}
    light = [{**heavy, "name": f"layers.{i}", "F": 0.05, "B": 0.05, "W": 0.05, "full_backward": None}
             for i in range(1, 4)]
    prof = layered([heavy, *light], 8)
    pl = parse_placement(placement, 2)
    request = SplitRequest(prof, 2, (placement,), None, "makespan", "auto")
    best = min(solve(SplitSearch(request, 1e18).problem(pl, counts), SearchOptions(time_limit=10)).objective
               for counts in all_splits(4, len(pl.routes[0])))
    assert best < 8 * 3
    assert _bound(request, pl) <= best * (1 + 1e-9)


def test_the_bound_over_every_split_past_its_deadline_is_weaker_and_says_so() -> None:
    """A deadline already past: every placement's bound comes at once, cut short (walk_complete False), no
    higher than with time; the cheap DP alone (no deadline) stops at the search's deadline."""
    request = SplitRequest(layered(random_layers(9, 7), m=4), 2, ("linear", "v"), "2p")
    for cache in (bounds_module._least, enumerate_module._v_suffix):
        cache.done.clear()
    past = time.monotonic() - 1.0
    cut = any_split_bound_of(request, SplitSearch(request, past), math.inf, past)
    assert all(not how["walk_complete"] and how["splits_bounded"] == 0 for how in cut.by_placement.values())
    cheap_cut = any_split_bound_of(request, SplitSearch(request, past), math.inf, None)
    full = any_split_bound_of(request, SplitSearch(request, math.inf), math.inf, time.monotonic() + 60)
    assert all(how["walk_complete"] for how in full.by_placement.values())
    for name in request.placements:
        assert cut.by_placement[name]["bound"] <= full.by_placement[name]["bound"] + 1e-9
        assert cheap_cut.by_placement[name]["bound"] <= full.by_placement[name]["bound"] + 1e-9
    assert cut.value <= full.value + 1e-9


def test_the_other_seeds_and_some_moves_come_before_the_named_splits_take_their_starts(
        monkeypatch: pytest.MonkeyPatch):
    """The named splits' tuned and periodic starts may run until the polish (scored.give_starts); the other
    seeds are scored and layer moves made before them, so a search whose starts outlast the scoring share still
    scores and moves (at 25 s on p=8, m=32 none was scored, and llama3-8b at 49 GiB kept the V balanced split's
    8,075 ms; with the seeds first but the moves after the starts, 6,726.7 ms; with both first, 6,269.7)."""
    order: list[str] = []
    real_score, real_starts, real_moves = SplitSearch.score, search_module._give_starts, search_module.improve_split

    def score(self, placement, counts, origin):
        order.append("score " + origin)
        return real_score(self, placement, counts, origin)

    def improve_split(search, start, budget_end):
        order.append("moves")
        return real_moves(search, start, budget_end)

    def give_starts(search, seeds, options, until):
        order.append("starts")
        return real_starts(search, seeds, options, until)

    monkeypatch.setattr(SplitSearch, "score", score)
    monkeypatch.setattr(search_module, "_give_starts", give_starts)
    monkeypatch.setattr(search_module, "improve_split", improve_split)
    prof = layered(random_layers(9, 11), 8, comm=0.5)
    search_splits(SplitRequest(prof, 3, ("linear", "v"), "24GiB", "makespan", "auto"), SearchOptions(time_limit=2.0))
    first_starts = order.index("starts")
    seeds = [k for k, step in enumerate(order) if step.startswith("score ")
             and step[len("score "):] not in ("balanced", "even")]
    assert seeds and seeds[0] < first_starts
    assert "moves" in order and order.index("moves") < first_starts


def test_a_named_split_whose_own_bound_the_plan_in_hand_meets_gets_no_better_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing solve() finds on such a split is faster than the plan in hand, so `--partition NAME` cannot beat
    the joint plan there without them; their seconds go to the moves and the polish instead."""
    from types import SimpleNamespace

    placement = parse_placement("linear", 3)
    best = Scored(placement, (3, 3, 3), "least-bound", 100.0, 1.0, SimpleNamespace(), start=object())
    hopeless = Scored(placement, (5, 2, 2), "even", 130.0, 1.0, SimpleNamespace(), start=object())
    hopeful = Scored(placement, (4, 3, 2), "balanced", 120.0, 1.0, SimpleNamespace(), start=object())
    own = {(3, 3, 3): 90.0, (5, 2, 2): 100.0, (4, 3, 2): 95.0}
    search = SimpleNamespace(scored={s.counts: s for s in (best, hopeless, hopeful)},
                             request=SimpleNamespace(placements=("linear",)),
                             leaf_bound=lambda pl, chains=False: lambda counts: own[tuple(counts)])
    given: list[str] = []
    monkeypatch.setattr(search_module, "give_starts", lambda entry, *args: given.append(entry.origin))
    search_module._give_starts(search, [hopeless, hopeful], SearchOptions(time_limit=10.0), None)
    assert given == ["balanced"]
