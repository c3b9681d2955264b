"""`--recompute auto` and `auto-layers`: which layers each rank recomputes (and, auto, on which
microbatches), chosen with the split, the placement and the schedule.

Recompute pays where memory throttles the schedule: a rank at its cap holds fewer microbatches than its
schedule would, and the ranks behind it wait. So the search starts from the joint search's best plans
(`search_splits`) without recompute and with every layer recomputed (the Megatron and torchtitan habit),
from every layer recomputed on each placement's time-balanced split (the rule's split under a named
`--partition`; on a placement neither chose, or where it scores better than their plans there), and from
the best fixed choice users write (every layer of the first k layers or first ranks) on the split of the
plan without recompute, where it beats that plan; from each it walks the recompute levels, scoring each
step with the heuristics on the same split and placement:

1. the ranks whose room would not take one more microbatch of their heaviest chunk are the throttled
   ones;
2. a step recomputes (full) k more layers on every throttled rank at once, for k = 1, 2, 4, and on each
   throttled rank alone, the layers that save the most bytes per unit of time first; or gives back the
   recompute of k layers on the ranks with room (all of them, or one alone), or of 4 on one throttled
   rank (it may hold all its schedule wants there);
3. the best step that lowers the objective (or keeps it and recomputes less) is taken, and the split is
   then improved for the new levels with the joint search's one-layer moves; where no step helps on the
   split (memory forced the split, and the gain of recompute is a better one), the best two steps are
   tried with their splits improved; the walk stops when none of these helps.

Ends the walks moved are polished by the solver on their split; the best of those and the starting plans
is returned, so the search is never slower than either joint search. With `per_microbatch` (auto),
every scored schedule and every compared plan first keeps the activations of the microbatches that fit
(search/recompute/microbatches.py). The bound over every split holds for every recompute choice: it is taken
on the layers at their least time (no recompute) with their least memory (the option holding least from F
until I, and from I until W), which no choice beats in either, per layer or per microbatch; under a
limit written as a multiple of p (whose bytes follow the stage as profiled), without a cap.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Sequence

from ...core.errors import InfeasibleError, PartitionError
from ...core.ir import Placement
from ...core.layers import Layer
from ...core.memory import p_multiple
from ...core.objective import status_for
from ...core.partition import route_length
from ...core.placement import parse_placement
from ...core.recompute.levels import held_from_f, with_recompute
from ..budget import Budget
from ..options import SearchOptions
from ..solve.driver import SolveResult
from ..partition.candidates import balanced_counts, parse_rule
from .every_chunk import choose_on_every_chunk, fewer_microbatches, route_counts
from ..partition.report import split_facts
from ..partition.search import SplitRequest, SplitBound, SplitSearch, any_split_bound_of, search_splits
from .walk import Levels, all_full, evaluate, rank_layers, ranks_at_cap, walk, with_more

__all__ = ["Levels", "all_full", "everything", "joint", "least_memory", "ranks_at_cap", "search_with_recompute"]


def least_memory(layers: Sequence[Layer]) -> tuple[Layer, ...]:
    """The layers at their least time (as profiled) with their least memory over every recompute option:
    what no recompute choice beats, so a bound on them holds for every choice."""
    out = []
    for layer in layers:
        if not layer.recompute:
            out.append(layer)
            continue
        torch_w = layer.mem_W_torch
        least_w = min([o.mem_W for o in layer.recompute] + ([torch_w] if torch_w is not None else []))
        least_b = min([o.mem_B for o in layer.recompute] + [held_from_f(layer)])
        out.append(replace(layer, mem_B=min(layer.mem_B, least_b), mem_W=min(layer.mem_W, least_b),
                           mem_B_torch=least_b, mem_W_torch=least_w if torch_w is not None else None))
    return tuple(out)


def everything(request: SplitRequest) -> SplitRequest:
    """The request with every layer that lists it recomputed in full."""
    return replace(request, profile=with_recompute(request.profile, all_full(request), restage=False))


JointPlan = SolveResult | InfeasibleError  # a joint search's plan, or why no split fits


def joint(request: SplitRequest, options: SearchOptions = SearchOptions(time_limit=60.0)) -> JointPlan:
    """The joint search's plan (search_splits), or the error saying no split fits."""
    try:
        return search_splits(request, options)
    except InfeasibleError as exc:
        return exc


def search_with_recompute(request: SplitRequest, options: SearchOptions = SearchOptions(time_limit=60.0), *,
                          per_microbatch: bool = True, starts: tuple[JointPlan, JointPlan] | None = None) -> SolveResult:
    """The best plan over splits, placements and recompute levels (and, with `per_microbatch`, which
    microbatches recompute) found within the options' time limit (see the module); never worse than the
    joint search's plans without recompute and with every layer recomputed that it starts from: its own,
    or `starts` (those two, already searched with `joint`; then the time limit is the walk's and the
    polish's alone). Where no split fits without recompute, it walks from the plan with. Its bound holds over every
    recompute choice.

    Raises
    ------
    InfeasibleError
        No split fits even with every layer recomputed (the error of that search, naming its least cap).
    """
    t0 = time.monotonic()
    time_limit, budget = options.time_limit, options.budget
    if starts is None:
        plain = options.with_time(budget.recompute_plain_share * time_limit)
        starts = (joint(request, plain), joint(everything(request), plain))
    walk_end, polish_end = _phase_ends(t0 + time_limit, per_microbatch, budget)
    every_layer = all_full(request)
    found = [(levels, start) for levels, start in zip(({}, every_layer), starts)
             if isinstance(start, SolveResult)]
    if not found:
        assert isinstance(starts[1], InfeasibleError)  # neither start is a plan
        raise starts[1]
    firsts = [evaluate(request, levels, placement, route_counts(start, placement), per_microbatch)
              for levels, start in found for placement in [parse_placement(start.problem.placement.name,
                                                                           request.num_ranks)]]
    firsts += _split_starts(request, firsts, every_layer, per_microbatch, starts[1])
    if found[0][0] == {}:  # from the plan without recompute: a fixed choice of the first layers or ranks
        firsts += _fixed_choices(request, firsts[0], per_microbatch, time.monotonic() + (walk_end - time.monotonic()) / 2)
    ends: list[Levels] = []
    for first in firsts:
        share_end = time.monotonic() + (walk_end - time.monotonic()) / (len(firsts) - len(ends))
        ends.append(walk(request, first, share_end, per_microbatch, budget))
    # The walks score with the heuristics, the joint searches' plans were polished by the solver: an end
    # that is not one of those plans (the walk moved it, or it started on another placement) is polished
    # before the two are compared.
    joint_plans = firsts[:len(found)]
    moved = [end for k, end in enumerate(ends) if k >= len(found)
             or (end.levels, end.counts, end.placement) != (joint_plans[k].levels, joint_plans[k].counts,
                                                            joint_plans[k].placement)]
    best = min(moved, key=lambda x: x.objective, default=None)
    results = [start for _, start in found]
    if best is not None:
        chosen_request = replace(request, profile=with_recompute(request.profile, best.levels, restage=False),
                                 placements=(best.placement.name,), rule="fixed:" + ",".join(map(str, best.counts)))
        results.append(search_splits(chosen_request, options.with_time(polish_end - time.monotonic())))
    if not per_microbatch:
        best_plan = min(results, key=lambda r: r.objective)
        bound = _bound_over_choices(request, best_plan.objective, t0 + time_limit, budget)
        return _with_bound(request, best_plan, bound, t0, results)
    # Each plan with only the microbatches that need it recomputing; the best then with the order and the
    # choice made together by CP-SAT windows. The bound first (it needs only some plan's objective to prune
    # with), so that the windows get the time it does not take.
    best_plan = min((fewer_microbatches(r) for r in results), key=lambda r: r.objective)
    bound = _bound_over_choices(request, best_plan.objective, t0 + time_limit, budget)
    chosen = choose_on_every_chunk(request, best_plan, t0 + time_limit, options, every_layer)
    return _with_bound(request, chosen, bound, t0, results)


def _phase_ends(deadline: float, per_microbatch: bool, budget: Budget) -> tuple[float, float]:
    """When the walks and the polish stop, as shares of the time left once the joint searches are done
    (search/budget.py): per rank, the bound over every choice takes the rest; per microbatch, the bound
    and the CP-SAT windows that choose the order and the microbatches together."""
    now = time.monotonic()
    left = max(deadline - now, 0.0)
    walk = budget.recompute_choice_walk_share if per_microbatch else budget.recompute_walk_share
    kept_back = budget.split_bound_share + (budget.recompute_choice_share if per_microbatch else 0.0)
    return now + walk * left, deadline - kept_back * left


def _split_starts(request: SplitRequest, firsts: Sequence[Levels], every_layer: dict[str, str],
                  per_microbatch: bool, full: JointPlan | None = None) -> list[Levels]:
    """Walk starts with every layer recomputed (`every_layer`: all_full), one per placement where it scores
    better than the joint plans there (or they chose another placement): the better of the time-balanced
    split and the best split the joint search with every layer recomputed (`full`) scored there. Where
    recompute frees memory another placement may win, and the walk down finds how much recompute it needs;
    and the joint searches chose their splits by the per-rank score while a walk's one-layer moves rarely
    leave a split: at 25 s on llama3-8b p=8 at 36 GiB (results/memory_levers.md), every layer recomputed on
    the joint search's split (6,4,4,4,4,4,4,4) scores 8,003.8 ms with only the microbatches that need it
    recomputing, on the balanced split (5,4,4,5,4,4,4,4) 7,278.4; on a 70B-like profile at p=2, 40 GiB, the
    full search's best linear split (44,38) walked to 21.11 s, the balanced one (42,40) to 21.48. Under a
    named `--partition` rule the start is on the rule's own split (_start_split): the walk keeps it."""
    scored = _best_splits(full) if request.rule.strip().lower() == "auto" else {}
    out = []
    for name in request.placements:
        placement = parse_placement(name, request.num_ranks)
        there = [x for x in firsts if x.placement.name == placement.name]
        splits = dict.fromkeys(c for c in (_start_split(request, placement), scored.get(placement.name))
                               if c is not None and all(x.counts != c for x in there))
        tried = [evaluate(request, every_layer, placement, counts, per_microbatch) for counts in splits]
        first = min(tried, key=lambda x: x.objective, default=None)
        if first is not None and first.objective < min((x.objective for x in there), default=math.inf) * (1 - 1e-9):
            out.append(first)
    return out


def _best_splits(full: JointPlan | None) -> dict[str, tuple[int, ...]]:
    """The best split a joint search scored on each placement, by placement kind (none for no plan)."""
    if not isinstance(full, SolveResult) or full.details.partition is None:
        return {}
    how = full.details.partition.any_split_bound_by_placement
    return {parse_placement(name, full.problem.num_ranks).name: tuple(placed["best_split"])
            for name, placed in how.items() if "best_split" in placed}


def _start_split(request: SplitRequest, placement: Placement) -> tuple[int, ...] | None:
    """The split of a walk start on `placement`: the time-balanced one under `--partition auto`, else the
    split the rule names (a user's fixed:... or even split is kept as given: the walks only move a split
    under auto), or None where the rule's counts do not fit the placement."""
    layers = request.profile.layers or ()
    if request.rule.strip().lower() == "auto":
        return balanced_counts(layers, route_length(placement))
    try:
        return parse_rule(request.rule, layers, placement)[1]
    except PartitionError:
        return None


PREFIXES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # the first k layers a fixed choice recomputes


def _fixed_choices(request: SplitRequest, plain: Levels, per_microbatch: bool, deadline: float) -> list[Levels]:
    """A walk start on the plan without recompute's split: the best of the fixed choices users write (every
    layer of the first k layers, k in PREFIXES, or of the first r ranks), where it beats that plan's
    score; none otherwise. A walk adds layers by 1, 2 or 4 per rank, and stops where no step helps, which
    a dozen layers may (issue 39: on a 70B-like profile at p=2, 20 GiB, layers.0..layers.11 gave 22.23 s
    where the walks from no recompute returned 25.10 s). One heuristic run each, until `deadline`."""
    layers = request.profile.layers or ()
    choices = [with_more(layers[:k], {}, k) for k in PREFIXES if k < len(layers)]
    ranks = rank_layers(request, plain.placement, plain.counts)
    choices += [with_more([x for r in range(q) for x in ranks[r]], {}, len(layers)) for q in range(1, len(ranks))]
    best = plain
    for levels in {tuple(sorted(c.items())): c for c in choices if c}.values():
        if time.monotonic() >= deadline:
            break
        tried = evaluate(request, levels, plain.placement, plain.counts, per_microbatch)
        best = tried if tried.objective < best.objective * (1 - 1e-9) else best
    return [] if best is plain else [best]


def _bound_over_choices(request: SplitRequest, incumbent: float, deadline: float, budget: Budget) -> SplitBound:
    """The bound over every split and every recompute choice (on least_memory's layers under a byte limit,
    without a cap under an `Np` one); `incumbent`, the objective of a plan found, only prunes the splits
    searched (any plan's objective may)."""
    if p_multiple(request.mem_limit) is not None:
        # An `Np` cap is N x p x a rank's stage as profiled; on least_memory's layers the same words cap
        # less, and the bound came out above the one without recompute (a plan was called optimal that a
        # longer search beat). Without a cap, the layers as profiled (each at its least time) bound every
        # choice too: weaker, but it holds.
        relaxed = replace(request, mem_limit="none")
    else:
        relaxed = replace(request, profile=replace(request.profile, layers=least_memory(request.profile.layers or ())))
    return any_split_bound_of(relaxed, SplitSearch(relaxed, deadline, budget), incumbent, deadline)


def _with_bound(request: SplitRequest, result: SolveResult, over_choices: SplitBound, t0: float,
                searches: Sequence[SolveResult]) -> SolveResult:
    """`result` with the bound over every split and every recompute choice (_bound_over_choices), the
    seconds since `t0` and the splits the joint `searches` scored: the whole search's, not those of the
    polish that `result` may come from."""
    bound, how = over_choices.value, over_choices.by_placement
    lower = min(result.objective, bound)
    status = status_for(result.objective, lower)
    partition = result.details.partition
    assert partition is not None
    # The rule asked for (the polish names its split fixed:...), with the bound over every choice.
    scored = sum(r.details.partition.splits_scored for r in searches if r.details.partition is not None)
    facts = replace(partition, rule=request.rule, facts=split_facts(result, request.rule),
                    any_split_bound=bound, any_split_bound_by_placement=how, splits_scored=scored)
    return replace(result, lower_bound=lower, status=status, solve_seconds=time.monotonic() - t0,
                   details=replace(result.details, partition=facts))
