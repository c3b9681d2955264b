"""--recompute auto (issue 28, deliverable 3): the bound over every split and every recompute choice is
below the best of them (brute force), and where memory throttles the plan the search finds recompute."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from zbsearch.cli.app import app
from zbsearch.core.errors import InfeasibleError
from zbsearch.core.placement import parse_placement
from zbsearch.core.profile import Profile, load_profile
from zbsearch.core.recompute.levels import with_recompute
from zbsearch.search.budget import BUDGET
from zbsearch.search.options import SearchOptions
from zbsearch.search.recompute.search import _bound_over_choices, least_memory, search_with_recompute
from zbsearch.search.partition.search import SplitRequest, SplitSearch, any_split_bound_of, search_splits
from zbsearch.search.solve.driver import solve

GiB = 2**30


def block(i: int, F: float, option_time: float, mem: float = 4.0, kept: float = 0.5) -> dict:
    return {"name": f"layers.{i}", "kind": "decoder", "F": F, "B": F, "W": F, "mem_B": mem * GiB, "mem_W": mem * GiB,
            "mem_W_torch": mem * GiB, "static_bytes": 1.0 * GiB, "out_bytes": 1.0,
            "recompute": [{"level": "full", "time": option_time, "mem_B": kept * GiB, "mem_W": mem * GiB}]}


def profile(blocks: list[dict], m: int) -> Profile:
    ends = [{"name": "tok_embeddings", "kind": "embedding", "F": 0.1, "B": 0.0, "W": 0.1, "mem_B": 0.01 * GiB,
             "mem_W": 0.01 * GiB, "mem_W_torch": 0.01 * GiB, "static_bytes": 0.5 * GiB, "out_bytes": 1.0},
            {"name": "output", "kind": "output", "F": 0.2, "B": 0.2, "W": 0.2, "mem_B": 0.1 * GiB, "mem_W": 0.1 * GiB,
             "mem_W_torch": 0.2 * GiB, "static_bytes": 0.5 * GiB, "out_bytes": 1.0}]
    return Profile.from_dict({
        "name": "recompute-toy", "stages": [{"F": 1, "B": 1, "W": 1, "mem_B": GiB, "mem_W": GiB}], "microbatches": m,
        "time_unit": "unit", "memory_unit": "bytes", "comm": 0.0, "memory_model": "torch-runtime",
        "layers": [ends[0], *blocks, ends[1]], "source": {"kind": "estimated", "method": "hand-made for tests"}})


def all_splits(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cuts + (n,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


@pytest.mark.parametrize("seed, cap, placement", [(0, "9GiB", "linear"), (1, "11GiB", "linear"), (2, "12GiB", "v")])
def test_the_bound_holds_over_every_split_and_every_recompute_choice(seed, cap, placement) -> None:
    times = [(1.0, 0.5), (2.0, 0.8), (1.0, 1.0)][seed:] + [(1.5, 0.7)]
    prof = profile([block(i, F, t) for i, (F, t) in enumerate(times)], 4)
    pl = parse_placement(placement, 2)
    names = [x["name"] for x in [block(i, 1, 1) for i in range(len(times))]]
    best = math.inf
    for chosen in itertools.product((False, True), repeat=len(names)):
        levels = {name: "full" for name, on in zip(names, chosen) if on}
        search = SplitSearch(SplitRequest(with_recompute(prof, levels, restage=False), 2, (placement,), cap, "makespan"), math.inf)
        for counts in all_splits(len(prof.layers), len(pl.routes[0])):
            try:
                result = solve(search.problem(pl, counts), SearchOptions(time_limit=10))
            except InfeasibleError:
                continue
            best = min(best, result.objective)  # a valid plan of this split and choice (optimal or not)
    assert best < math.inf
    relaxed = SplitRequest(Profile.from_dict({**prof.to_dict(), "layers": [x.to_dict() for x in
                                                                           least_memory(prof.layers)]}),
                           2, (placement,), cap, "makespan")
    bound = any_split_bound_of(relaxed, SplitSearch(relaxed, math.inf), best, None).value
    assert bound <= best * (1 + 1e-9)


def test_where_memory_throttles_the_plan_auto_recomputes_and_is_faster() -> None:
    """Four heavy blocks on two ranks, a cap that holds one microbatch of a rank's blocks: recompute that
    costs a tenth of a forward lets several microbatches be in flight."""
    prof = profile([block(i, 1.0, 0.1) for i in range(4)], 8)
    request = SplitRequest(prof, 2, ("linear",), "14GiB", "makespan")
    plain = search_splits(request, SearchOptions(time_limit=6))
    auto = search_with_recompute(request, SearchOptions(time_limit=8))
    ranks = auto.details.partition.facts.ranks
    assert any(row.recompute.get("recomputed") for row in ranks)
    assert auto.objective < plain.objective * 0.95
    assert auto.lower_bound <= auto.objective
    assert auto.schedule.plan.levels
    assert auto.details.partition.rule == auto.details.partition.facts.rule == "auto"  # not the polish's fixed:


def test_auto_recomputes_only_the_microbatches_that_need_it(tmp_path) -> None:
    """Four blocks on two ranks at a cap that holds a rank's blocks for few microbatches: the plan
    recomputes on rank 0 only some microbatches (the drain keeps its activations), says so per rank, and
    the plan file, validated on the profile, is costed as the search costed it."""
    prof = profile([block(i, 1.0, 0.5) for i in range(4)], 8)
    request = SplitRequest(prof, 2, ("linear",), "16GiB", "makespan")
    auto = search_with_recompute(request, SearchOptions(time_limit=8))
    chosen = auto.schedule.plan.recompute_microbatches
    counts = [n for row in auto.details.partition.facts.ranks for n in row.recompute.get("recomputed_microbatches", [])]
    assert any(0 < n < 8 for n in counts), (chosen, counts)
    recomputing = sum(len(entry) if entry is not None else 8 for entry in chosen)
    every = search_splits(replace_request(request, auto), SearchOptions(time_limit=6))
    assert auto.objective <= every.objective + 1e-9  # the same levels on every microbatch cost no less
    assert recomputing < 8 * sum(1 for entry in chosen if entry is None or entry)  # entries that are not empty
    assert_validates_as_searched(tmp_path, prof, auto, "16GiB")


def assert_validates_as_searched(tmp_path, prof: Profile, result, cap: str) -> None:
    """The plan file, validated on the profile from disk by the CLI, is costed as the search costed it."""
    from typer.testing import CliRunner

    from zbsearch.cli.app import app

    prof.save(tmp_path / "p.json")
    result.schedule.save(tmp_path / "plan.json")
    out = CliRunner().invoke(app, ["validate", str(tmp_path / "plan.json"), "--profile", str(tmp_path / "p.json"),
                                   "--mem-limit", cap])
    assert out.exit_code == 0, out.output
    assert f"makespan {result.objective:.4g} unit; within --mem-limit {cap}" in out.stdout


def replace_request(request, result):
    """The request with the result's levels applied to every microbatch, on its split and placement."""
    from dataclasses import replace
    levels = result.schedule.plan.levels
    counts = ",".join(str(len(c)) for c in result.schedule.plan.split.chunks)
    return replace(request, profile=with_recompute(request.profile, levels, restage=False), rule="fixed:" + counts)


def test_auto_layers_recomputes_every_microbatch_and_reuses_given_starts() -> None:
    """auto-layers (what torchtitan and Megatron run) chooses layers only; with the two joint searches
    given, auto walks from them and is never slower than either."""
    prof = profile([block(i, 1.0, 0.5) for i in range(4)], 8)
    request = SplitRequest(prof, 2, ("linear",), "16GiB", "makespan")
    plain = search_splits(request, SearchOptions(time_limit=4))
    from zbsearch.search.recompute.search import everything
    full = search_splits(everything(request), SearchOptions(time_limit=4))
    began = time.monotonic()
    layers = search_with_recompute(request, SearchOptions(time_limit=6), per_microbatch=False, starts=(plain, full))
    wall = time.monotonic() - began
    # What the report says: the whole call's seconds and the joint searches' splits, not the polish's.
    assert wall - 0.2 <= layers.solve_seconds <= wall
    assert layers.details.partition.splits_scored >= sum(x.details.partition.splits_scored for x in (plain, full))
    assert layers.schedule.plan.split is not None and layers.schedule.plan.recompute_microbatches is None
    assert layers.objective <= min(plain.objective, full.objective) + 1e-9
    chosen = search_with_recompute(request, SearchOptions(time_limit=6), starts=(plain, full))
    assert chosen.objective <= min(plain.objective, full.objective) + 1e-9
    assert chosen.lower_bound <= chosen.objective


def test_where_nothing_fits_without_recompute_auto_finds_a_plan() -> None:
    prof = profile([block(i, 1.0, 0.5) for i in range(4)], 8)
    request = SplitRequest(prof, 2, ("linear",), "10GiB", "makespan")
    from zbsearch.search.recompute.search import joint
    without = joint(request, SearchOptions(time_limit=3))
    assert isinstance(without, InfeasibleError) and "raise the limit to at least that" in str(without)
    assert "10.6 GiB" in str(without)  # the least cap without recompute
    auto = search_with_recompute(request, SearchOptions(time_limit=6))
    assert auto.schedule.plan.levels
    assert all(row.fits for row in auto.details.partition.facts.ranks)


def test_windows_recompute_on_chunks_the_plan_did_not(tmp_path) -> None:
    """From the joint search's plan without recompute at a cap that throttles it, the windows may recompute
    on any chunk (the plan widened: every chunk lists its layers' full option, no microbatch recomputing),
    and the plan that comes back names levels only where some microbatch recomputes; validated on the
    profile from its file, it is costed as the search costed it."""
    from zbsearch.search.recompute.every_chunk import choose_on_every_chunk
    from zbsearch.search.recompute.search import all_full

    prof = profile([block(i, 1.0, 0.5) for i in range(4)], 8)
    request = SplitRequest(prof, 2, ("linear",), "14GiB", "makespan")
    plain = search_splits(request, SearchOptions(time_limit=3))
    chosen = choose_on_every_chunk(request, plain, time.monotonic() + 4, SearchOptions(), all_full(request))
    assert chosen.objective < plain.objective * 0.9
    plan = chosen.schedule.plan
    lists = plan.recompute_microbatches
    recomputing = {name for chunk, entry in zip(plan.split.chunks, lists, strict=True) if entry is None or entry
                   for name in chunk}
    assert plan.levels and set(plan.levels) <= recomputing
    assert_validates_as_searched(tmp_path, prof, chosen, "14GiB")


@pytest.mark.parametrize("per_microbatch", [False, True])
def test_a_fixed_choice_of_the_first_layers_or_ranks_is_among_the_starts(per_microbatch) -> None:
    """Issue 39, deliverable 5: a fixed choice users write (every layer of the first k layers, or of the
    first ranks) beat what the walks from no recompute returned on a 70B-like profile. The best such choice
    on the plan without recompute's split, where it beats that plan, is a walk start: the search is never
    slower than its heuristic schedule (the walk and the polish only improve on it)."""
    from zbsearch.search.recompute.search import _fixed_choices, everything
    from zbsearch.search.recompute.walk import evaluate, rank_layers

    prof = profile([block(i, 1.0, 0.1) for i in range(4)], 8)
    request = SplitRequest(prof, 2, ("linear",), "14GiB", "makespan")
    plain = search_splits(request, SearchOptions(time_limit=4))
    full = search_splits(everything(request), SearchOptions(time_limit=4))
    placement = parse_placement("linear", 2)
    counts = tuple(len(c) for c in plain.schedule.plan.split.chunks)
    first = evaluate(request, {}, placement, counts, per_microbatch)
    layers = prof.layers
    fixed = [{x.name: "full" for x in layers[:k] if x.recompute} for k in range(1, len(layers))]
    fixed += [{x.name: "full" for x in rank_layers(request, placement, counts)[0] if x.recompute}]
    scores = [evaluate(request, levels, placement, counts, False).objective for levels in fixed if levels]
    assert min(scores) < first.objective  # a fixed choice beats the plan without recompute here
    assert _fixed_choices(request, first, per_microbatch, math.inf)
    found = search_with_recompute(request, SearchOptions(time_limit=6), per_microbatch=per_microbatch,
                                  starts=(plain, full))
    assert found.objective <= min(scores) + 1e-9


@pytest.mark.parametrize("recompute", ["auto", "auto-layers"])
def test_allowing_recompute_is_never_slower_than_forbidding_it(recompute) -> None:
    """Issue 39, deliverable 5: with recompute allowed the search starts from the plan without it (its
    joint search given a quarter of the time), so where that plan is proven optimal in its quarter, as
    here, the search with recompute is no slower than the one without at the same limit."""
    prof = profile([block(i, 1.0, 0.5) for i in range(4)], 8)
    request = SplitRequest(prof, 2, ("linear",), "24GiB", "makespan")
    options = SearchOptions(time_limit=8)
    plain = search_splits(request, options.with_time(options.budget.recompute_plain_share * options.time_limit))
    without = search_splits(request, options)
    assert plain.objective == pytest.approx(without.objective)  # the quarter finds the same plan
    allowed = search_with_recompute(request, options, per_microbatch=recompute == "auto")
    assert allowed.objective <= without.objective + 1e-9


@pytest.mark.parametrize("cap", ["2p", "1.5p", "40MiB"])
def test_the_bound_over_every_choice_is_never_above_the_bound_without_recompute(tmp_path, cap) -> None:
    # No recompute is one of the choices. Under `Np` the bound over every choice was taken on the least-memory
    # layers, whose Np cap shrank with them: 56.9 against 51.7 at 2p here, and --recompute auto then called
    # a plan optimal (51.604 with 2 s) that a longer search beat (49.487 with 8 s).
    path = tmp_path / "llama8.json"
    estimate = ["profile", "--estimate", "--gpu", "h100", "--model", "llama", "--layers", "8", "--hidden", "256",
                "--heads", "4", "--kv-heads", "2", "--seq", "128", "-p", "4", "-m", "8", "-o", str(path)]
    assert CliRunner().invoke(app, estimate).exit_code == 0
    request = SplitRequest(load_profile(path), 4, ("linear", "v"), cap, "makespan", "auto")
    deadline = time.monotonic() + 60
    plain = any_split_bound_of(request, SplitSearch(request, deadline, BUDGET), math.inf, deadline).value
    every = _bound_over_choices(request, math.inf, time.monotonic() + 60, BUDGET).value
    assert every <= plain * (1 + 1e-9)


@pytest.mark.parametrize("per_microbatch", [False, True])
def test_the_balanced_split_with_every_layer_recomputed_is_a_start_where_it_scores_better(per_microbatch) -> None:
    """The joint searches choose their splits by the per-rank score and the walks' one-layer moves rarely
    leave one, so every layer recomputed on the time-balanced split is a walk start where it scores better
    than the joint plans on that placement (at 25 s on llama3-8b p=8 at 36 GiB: 6,870.8 ms per microbatch
    with it, 7,613.5 without), and not where a joint plan already has that split or scores better."""
    from zbsearch.search.partition.candidates import balanced_counts
    from zbsearch.search.recompute.search import _split_starts, all_full, everything
    from zbsearch.search.recompute.walk import evaluate

    prof = profile([block(i, 1.0, 0.1) for i in range(6)], 8)
    request = SplitRequest(prof, 2, ("linear",), "24GiB", "makespan")
    placement, every_layer = parse_placement("linear", 2), all_full(request)
    balanced = balanced_counts(prof.layers, 2)
    skewed = (balanced[0] - 2, balanced[1] + 2)
    on_skewed = evaluate(request, every_layer, placement, skewed, per_microbatch)
    on_balanced = evaluate(request, every_layer, placement, balanced, per_microbatch)
    assert on_balanced.objective < on_skewed.objective  # the case the start is for
    [start] = _split_starts(request, [on_skewed], every_layer, per_microbatch)
    assert start.counts == balanced and start.objective == on_balanced.objective
    assert _split_starts(request, [on_balanced], every_layer, per_microbatch) == []
    plain = search_splits(request, SearchOptions(time_limit=3))
    full = search_splits(replace(everything(request), rule="fixed:" + ",".join(map(str, skewed))),
                         SearchOptions(time_limit=3))
    found = search_with_recompute(request, SearchOptions(time_limit=6), per_microbatch=per_microbatch,
                                  starts=(plain, full))
    assert found.objective <= on_balanced.objective + 1e-9


@pytest.mark.parametrize("per_microbatch", [False, True])
def test_a_named_split_is_kept_with_recompute(per_microbatch) -> None:
    """Under `--partition fixed:...` (or even, balanced) the recompute search keeps the user's split: the
    walk start with every layer recomputed goes on the rule's split, not the time-balanced one, even where
    the balanced one scores better (it once returned 42,40 for fixed:39,43 on a 70B-like profile)."""
    from zbsearch.search.partition.candidates import balanced_counts
    from zbsearch.search.recompute.search import _split_starts, all_full
    from zbsearch.search.recompute.walk import evaluate

    prof = profile([block(i, 1.0, 0.1) for i in range(6)], 8)
    balanced = balanced_counts(prof.layers, 2)
    skewed = (balanced[0] - 2, balanced[1] + 2)
    rule = "fixed:" + ",".join(map(str, skewed))
    request = SplitRequest(prof, 2, ("linear",), "24GiB", "makespan", rule)
    placement, every_layer = parse_placement("linear", 2), all_full(request)
    on_skewed = evaluate(request, every_layer, placement, skewed, per_microbatch)
    on_balanced = evaluate(request, every_layer, placement, balanced, per_microbatch)
    assert on_balanced.objective < on_skewed.objective  # the balanced split would win if the search could move
    assert _split_starts(request, [on_skewed], every_layer, per_microbatch) == []
    found = search_with_recompute(request, SearchOptions(time_limit=6), per_microbatch=per_microbatch)
    assert found.details.partition is not None
    assert tuple(found.details.partition.facts.layers_per_chunk) == skewed
    assert found.details.partition.rule == rule


def test_the_walk_gives_back_recompute_on_ranks_at_their_cap_and_takes_it_where_the_objective_holds() -> None:
    """A rank at its cap may hold all its schedule wants (1F1B's last rank holds one microbatch): where no
    other step helps, the walk gives back recompute there too (give_back_steps), and a step that keeps the
    objective and recomputes less is taken (Levels.beats). On a 70B-like profile at p=2, 40 GiB, the walk had stopped at 22.44 s with 24 layers
    recomputed on the last rank; with both, 21.11 s."""
    from zbsearch.search.recompute.walk import Levels, all_full, evaluate, give_back_steps

    prof = profile([block(i, 1.0, 0.1) for i in range(6)], 8)
    request = SplitRequest(prof, 2, ("linear",), "24GiB", "makespan")
    placement = parse_placement("linear", 2)
    every = evaluate(request, all_full(request), placement, (4, 4), False)
    at_cap = Levels(every.levels, placement, every.counts, every.objective, tight=(0, 1),
                    recompute_time=every.recompute_time)
    steps = give_back_steps(request, at_cap)
    names = [[x.name for x in prof.layers[:4]], [x.name for x in prof.layers[4:]]]
    for r in (0, 1):  # on each rank alone, some recompute given back
        assert any(set(s) < set(at_cap.levels) and set(at_cap.levels) - set(s) <= set(names[r]) for s in steps)
    same = replace(at_cap, recompute_time=at_cap.recompute_time / 2)
    assert same.beats(at_cap) and not at_cap.beats(same)
    assert replace(at_cap, objective=at_cap.objective * 0.9, recompute_time=1e9).beats(at_cap)
    assert not replace(at_cap, objective=at_cap.objective * 1.1, recompute_time=0.0).beats(at_cap)


@pytest.mark.parametrize("per_microbatch", [False, True])
def test_a_walk_starts_on_the_better_of_the_balanced_split_and_the_full_searchs_best(per_microbatch) -> None:
    """On a placement the joint plans did not choose, the every-layer walk start goes on the better of the
    time-balanced split and the best split the joint search with every layer recomputed scored there (on a
    70B-like profile at p=2, 40 GiB: (44,38) walked to 21.11 s, the balanced (42,40) to 21.48 s)."""
    from zbsearch.search.partition.candidates import balanced_counts
    from zbsearch.search.recompute.search import _best_splits, _split_starts, all_full, everything
    from zbsearch.search.recompute.walk import evaluate

    prof = profile([block(i, 1.0 + 0.3 * (i % 3), 0.1) for i in range(6)], 8)
    request = SplitRequest(prof, 2, ("linear",), "24GiB", "makespan")
    placement, every_layer = parse_placement("linear", 2), all_full(request)
    full = search_splits(everything(request), SearchOptions(time_limit=3))
    by = full.details.partition.any_split_bound_by_placement
    assert _best_splits(full) == {"linear": tuple(by["linear"]["best_split"])}
    balanced = balanced_counts(prof.layers, 2)
    for other in [c for c in all_splits(len(prof.layers), 2) if c != balanced]:
        crafted = replace(full, details=replace(full.details, partition=replace(
            full.details.partition, any_split_bound_by_placement={"linear": {"best_split": list(other)}})))
        scores = {c: evaluate(request, every_layer, placement, c, per_microbatch).objective for c in (balanced, other)}
        [start] = _split_starts(request, [], every_layer, per_microbatch, crafted)
        assert start.objective == min(scores.values()) and scores[start.counts] == start.objective
