"""Recompute per microbatch: on a schedule whose chunks recompute layers for every microbatch, keep the
activations of the microbatches that fit, so that only those that would overflow a rank pay the recompute.

Which microbatches need it depends on the schedule: a rank of a 1F1B-like schedule holds its most
microbatches in its steady phase, and fewer while it fills and drains, so the drain's microbatches (and
on later ranks many more) fit with their activations kept. With each rank's order fixed, a rank's memory
is a function of that order alone (a forward allocates at its start, a backward and a weight pass free at
their ends), and a kept microbatch only shortens its backward: the schedule's timing can only get
earlier. So the choice is made on the order, one microbatch at a time, and the result is never slower
and never over the limit.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Sequence

from ...core.ir import Action, Kind, Schedule
from ...sim.simulate import memory_delta, memory_events, simulate
from ...sim.validate import check, over_limit
from ..exact import lns
from ..exact.cpsat import fusable_chunks
from ..options import SearchOptions
from ...core.plan_record import Choice
from ..problem import Problem
from ..solve.incumbent import with_backwards_split
from ..greedy.candidates import candidates
from ..solve.starts import Start, heuristic_start

class _RankLevels:
    """One rank's activation level after each allocation and free as it runs its actions in order (the
    simulator's memory rule, summed in the same order, so it compares with the cap exactly as the
    validator does), and what keeping one more microbatch's activations would make its peak: only that
    microbatch's own passes change what they allocate or free."""

    def __init__(self, problem: Problem, actions: Sequence[Action], keeps: set[tuple[int, int]]) -> None:
        self.events: list[tuple[Action, bool]] = []
        self.deltas: list[float] = []
        self.problem = problem
        self.at: dict[tuple[int, int], list[int]] = {}
        for _, at_start, a in memory_events(actions):
            self.at.setdefault((a.chunk, a.microbatch), []).append(len(self.events))
            self.events.append((a, at_start))
            self.deltas.append(self._delta(a, at_start, (a.chunk, a.microbatch) in keeps))

    def _delta(self, a: Action, at_start: bool, kept: bool) -> float:
        alloc, freed = memory_delta(self.problem.chunk_costs[a.chunk].for_microbatch(not kept), a.kind)
        return alloc if at_start else -freed

    def peak_keeping(self, key: tuple[int, int]) -> tuple[float, list[float]]:
        """The rank's peak with `key` (chunk, microbatch) keeping its activations, and the deltas then."""
        deltas = list(self.deltas)
        for k in self.at.get(key, ()):
            a, at_start = self.events[k]
            deltas[k] = self._delta(a, at_start, True)
        return max(itertools.accumulate(deltas), default=0.0), deltas


def keep_where_it_fits(problem: Problem, schedule: Schedule) -> Choice | None:
    """Per chunk, the microbatches that still recompute once every microbatch whose activations fit on
    its rank (under the schedule's order) keeps them, besides those the problem keeps already; None when
    none does. Microbatches are tried in the reverse of the order their forwards run: the drain holds
    least, and each kept one leaves the next window of in-flight microbatches one fewer to keep."""
    costs = problem.chunk_costs
    # Those the problem keeps already stay kept: the order was made for them.
    keeps = {(c, i) for c, cost in enumerate(costs) if cost.without_recompute is not None
             for i in range(problem.num_microbatches) if not problem.recomputes(c, i)}
    for r, ranked in enumerate(schedule.ranks):
        cap, levels = problem.limit.per_rank[r], _RankLevels(problem, ranked, keeps)
        forwards = [a for action in ranked for a in action.passes()
                    if a.kind is Kind.F and costs[a.chunk].without_recompute is not None]
        for f in reversed(forwards):
            key = (f.chunk, f.microbatch)
            if key in keeps:
                continue
            peak, deltas = levels.peak_keeping(key)
            if not over_limit(peak, cap):
                keeps.add(key)
                levels.deltas = deltas
    return problem.choice_where(lambda c, i: (c, i) not in keeps) if keeps else None


def recompute_fewer(problem: Problem, start: Start, validate: bool = True) -> tuple[Problem, Start]:
    """`start` with only the microbatches that need it recomputing (keep_where_it_fits), and the problem
    with that choice; both unchanged when every microbatch needs it. With `validate` the new schedule
    must pass the validator, else both stay unchanged; scoring many plans may skip the graph checks (the
    order is the start's, so it stays complete and deadlock-free, and memory was checked rank by rank)."""
    choice = keep_where_it_fits(problem, start.schedule)
    if choice is None:
        return problem, start
    schedule = start.schedule.with_choice(choice)
    if validate:
        report = check(schedule, problem.profile, problem.limit)
        if not report.ok or report.timeline is None:  # float round-off at the cap: keep the start as it was
            return problem, start
        timeline = report.timeline
    else:
        timeline = simulate(schedule, problem.profile)
    chosen = problem.with_choice(choice)
    return chosen, Start(start.name, schedule, timeline, problem.objective.of(timeline))


FEWER_TOP = 6  # the heuristics' best schedules each given only the microbatches that need recompute


def fewest(problem: Problem, validate: bool = True) -> tuple[Problem, Start]:
    """The best of the heuristics' FEWER_TOP best schedules once each recomputes only the microbatches that
    need it (recompute_fewer, with `validate`), and the problem with that choice. The best order with every microbatch
    recomputing is not always the best with fewer: on llama3-8b p=8 at 36 GiB (every layer recomputed on the
    balanced linear split) a fused-backward greedy led at 8,262.1 ms and kept 7,986.4 with fewer, the best of
    three 7,451.9, of six (a greedy with B and W apart) 7,278.4."""
    found = [Start(*c, problem.objective.of(c.timeline))
             for c in candidates(problem, top=FEWER_TOP, same_placement=True)] or [heuristic_start(problem)]
    fewer = (recompute_fewer(problem, start, validate) for start in found)
    return min(fewer, key=lambda pair: pair[1].objective)


def choose_by_windows(problem: Problem, start: Start, deadline: float,
                      options: SearchOptions = SearchOptions()) -> tuple[Problem, Start]:
    """`start` improved until `deadline` (time.monotonic()) by large-neighbourhood windows that choose the
    order and which microbatches recompute together (exact/lns.py with exact/recompute_flags.py), then with the
    microbatches that fit keeping their activations again (recompute_fewer); both unchanged where no
    chunk recomputes or nothing better was found. `problem` and `start` carry the same choice."""
    if all(cost.without_recompute is None for cost in problem.chunk_costs):
        return problem, start
    split = with_backwards_split(start.schedule, keep_whole=fusable_chunks(problem))
    found = lns.improve(problem, split, deadline, workers=options.workers, seed=options.seed,
                        resolution=options.resolution, choose=True)
    if found is None or not found.objective < start.objective * (1 - 1e-12):
        return problem, start
    schedule, timeline, objective = found.schedule, found.timeline, found.objective
    # The windows' choice; where they improved the order without changing what recomputes, the problem's.
    chosen = schedule.plan.recompute_microbatches or problem.recompute_microbatches
    # The start's meta (solver facts) and plan record (its split and levels) with the windows' choice.
    schedule = replace(schedule, name="zbsearch", meta=start.schedule.meta, plan=start.schedule.plan).with_choice(chosen)
    return recompute_fewer(problem.with_choice(chosen), Start(start.name, schedule, timeline, objective))
