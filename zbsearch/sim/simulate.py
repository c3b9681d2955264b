"""As-soon-as-possible timing of a schedule on a profile: what an executor that runs each rank's list
in order produces.

A pass starts when its rank is free and all its inputs have arrived: a forward needs the previous
chunk's forward of the same microbatch (plus the hop time when that chunk is on another rank), a
backward needs the next chunk's backward (or, on the loss chunk, its own forward), and a W needs its
own B. Same-rank hand-offs are free. The simulator leaves out what the profile does not give: compute
and communication overlap perfectly, sends never block, and kernels launch instantly. An overlapped
F&B pair takes the sum of its two passes unless the profile gives a pair time (`overlap_f_b`); then each
pass in the pair takes its own time times overlap_f_b / (F + full backward) (rank_state.overlap_time).

Memory follows the Zero Bubble paper: a forward allocates mem_B when it starts, B frees mem_B - mem_W
and W frees mem_W when they end; a full backward frees mem_B. Both rules live in rank_state.py, which
the greedy engines advance too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ..core.errors import ScheduleError
from ..core.ir import Action, Kind, Schedule
from ..core.plan_record import choice_recomputes
from ..core.profile import Profile
from ..core.stage_cost import StageCost
from .rank_state import RankClock, memory_delta, overlap_time

__all__ = ["PassCosts", "Slot", "Timeline", "chunk_costs", "dependencies", "memory_delta", "memory_events", "memory_steps", "pass_cost",
           "pass_key", "simulate"]


@dataclass(frozen=True)
class Slot:
    """One executed action on a rank."""

    rank: int
    index: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """The simulated execution and everything reports need from it."""

    schedule: Schedule
    profile: Profile
    slots: tuple[tuple[Slot, ...], ...]
    memory: tuple[tuple[tuple[float, float, Action], ...], ...]  # per rank: (time, level after, action)

    @property
    def num_ranks(self) -> int:
        return len(self.slots)

    def work(self, rank: int) -> float:
        return sum(s.end - s.start for s in self.slots[rank])

    def first_start(self, rank: int) -> float:
        return self.slots[rank][0].start if self.slots[rank] else 0.0

    def last_end(self, rank: int) -> float:
        return self.slots[rank][-1].end if self.slots[rank] else 0.0

    @property
    def makespan(self) -> float:
        """From the first pass (time 0) to the end of the last one: an iteration's cost when the
        optimizer step synchronizes all ranks."""
        return max(self.last_end(r) for r in range(self.num_ranks))

    def span_of(self, rank: int) -> float:
        return self.last_end(rank) - self.first_start(rank)

    @property
    def span(self) -> float:
        """The largest per-rank span (own first start to own last end): an iteration's cost when the
        optimizer step does not synchronize ranks (the paper's post-validation)."""
        return max(self.span_of(r) for r in range(self.num_ranks))

    def bubble_rate(self, cost: float) -> float:
        """Idle share of all rank-time when every rank is charged `cost`: 1 - sum(work) / (p * cost).
        With equal work on every rank this is the paper's (cost - m(F+B+W)) / cost."""
        total = sum(self.work(r) for r in range(self.num_ranks))
        return 1.0 - total / (self.num_ranks * cost) if cost > 0 else 0.0

    @property
    def bubble_rate_makespan(self) -> float:
        return self.bubble_rate(self.makespan)

    @property
    def bubble_rate_span(self) -> float:
        return self.bubble_rate(self.span)

    def peak_memory(self, rank: int) -> float:
        return max((lvl for _, lvl, _ in self.memory[rank]), default=0.0)

    def iter_slots(self) -> Iterator[Slot]:
        for rank in self.slots:
            yield from rank


@dataclass(frozen=True)
class PassCosts:
    """Every chunk's per-microbatch cost under a schedule's placement (`costs[chunk]`), and each pass's
    (`of`): its chunk's, or the chunk's cost without recompute for a microbatch the plan keeps the
    activations of (the plan record's recompute_microbatches; core/plan_record.py)."""

    chunks: tuple[StageCost, ...]
    recomputing: tuple[frozenset[int] | None, ...] | None = None

    def __getitem__(self, chunk: int) -> StageCost:
        return self.chunks[chunk]

    def __len__(self) -> int:
        return len(self.chunks)

    def of(self, action: Action) -> StageCost:
        return self.chunks[action.chunk].for_microbatch(choice_recomputes(self.recomputing, action.chunk,
                                                                          action.microbatch))


def pass_cost(costs: PassCosts, action: Action) -> float:
    """Duration of one action, given every pass's cost (see chunk_costs)."""
    if action.kind is Kind.OVERLAP:
        return overlap_time((costs.of(a), a.kind) for a in action.pair)
    return costs.of(action).time_of(action.kind)


def chunk_costs(schedule: Schedule, profile: Profile) -> PassCosts:
    """Every chunk's per-microbatch cost under this placement, and the microbatches the plan recomputes,
    computed once per simulation."""
    chunks = tuple(profile.chunk_cost(schedule.placement, c) for c in range(schedule.placement.num_chunks))
    chosen = schedule.plan.recompute_microbatches
    if chosen is not None and len(chosen) != len(chunks):
        raise ScheduleError(f"schedule {schedule.name!r} plan.recompute_microbatches lists {len(chosen)} chunks but "
                            f"its placement has {len(chunks)}: give one entry per chunk")
    return PassCosts(chunks, chosen)


def dependencies(schedule: Schedule, profile: Profile | None, action: Action) -> list[tuple[tuple[int, str, int], float]]:
    """Data inputs of one compute pass: (key of the producing pass, hop time). Keys are
    (chunk, 'F' | 'BWD' | 'W', microbatch); 'BWD' is whichever backward (I or full) the chunk ran."""
    placement = schedule.placement
    route = placement.route(action.microbatch, schedule.num_microbatches)

    def hop(a: int, b: int) -> float:
        return profile.hop(placement, a, b) if profile is not None else 0.0

    return route_inputs(route, action, hop)


def route_inputs(route: Sequence[int], action: Action,
                 hop: Callable[[int, int], float]) -> list[tuple[tuple[int, str, int], float]]:
    """`dependencies` on the microbatch's route, with `hop(src_chunk, dst_chunk)` the time between
    chunks: a forward waits on the previous chunk's forward, a backward on its own forward and the next
    chunk's backward, a W on its own backward."""
    c, i = action.chunk, action.microbatch
    k = route.index(c)
    if action.kind is Kind.F:
        return [((route[k - 1], "F", i), hop(route[k - 1], c))] if k > 0 else []
    if action.kind in (Kind.B, Kind.FULL_B):
        deps = [((c, "F", i), 0.0)]
        if k + 1 < len(route):
            deps.append(((route[k + 1], "BWD", i), hop(route[k + 1], c)))
        return deps
    if action.kind is Kind.W:
        return [((c, "BWD", i), 0.0)]
    raise ScheduleError(f"action {action} has no dependencies of its own; simulate its pair")


def pass_key(action: Action) -> tuple[int, str, int]:
    group = {Kind.F: "F", Kind.B: "BWD", Kind.FULL_B: "BWD", Kind.W: "W"}[action.kind]
    return action.chunk, group, action.microbatch


def simulate(schedule: Schedule, profile: Profile) -> Timeline:
    """Time every action as soon as its rank is free and its inputs have arrived.

    Raises ScheduleError when some rank can never proceed (a deadlock or a missing producer), naming
    the action each stuck rank waits on. Assumes the schedule's structure has been checked (see
    validate.check_structure); it does not check completeness.
    """
    p = schedule.num_ranks
    if profile.num_stages != p:
        raise ScheduleError(
            f"schedule has {p} ranks but profile {profile.name!r} has {profile.num_stages} stages: "
            "use a profile with one stage per rank"
        )
    end: dict[tuple[int, str, int], float] = {}
    clocks = [RankClock() for _ in range(p)]
    ptr = [0] * p
    slots: list[list[Slot]] = [[] for _ in range(p)]
    costs = chunk_costs(schedule, profile)
    deps = [[[d for a in act.passes() for d in dependencies(schedule, profile, a)] for act in rank]
            for rank in schedule.ranks]
    remaining = schedule.count()
    while remaining:
        progressed = False
        for r in range(p):
            rank = schedule.ranks[r]
            while ptr[r] < len(rank):
                ready = 0.0
                for key, hop in deps[r][ptr[r]]:
                    t = end.get(key)
                    if t is None:
                        break
                    ready = max(ready, t + hop)
                else:
                    action = rank[ptr[r]]
                    start, finish = clocks[r].run(ready, pass_cost(costs, action))
                    for a in action.passes():
                        end[pass_key(a)] = finish
                    slots[r].append(Slot(r, ptr[r], action, start, finish))
                    ptr[r] += 1
                    remaining -= 1
                    progressed = True
                    continue
                break
        if not progressed:
            stuck = [f"rank {r} at step {ptr[r]} ({schedule.ranks[r][ptr[r]]})" for r in range(p)
                     if ptr[r] < len(schedule.ranks[r])]
            raise ScheduleError("schedule deadlocks: no rank can proceed; stuck at " + ", ".join(stuck))
    return Timeline(schedule, profile, tuple(tuple(s) for s in slots), _memory_curves(costs, slots))


def _memory_curves(costs: PassCosts, slots: list[list[Slot]]):
    curves = []
    for rank_slots in slots:
        steps = memory_steps(costs, [slot.action for slot in rank_slots])
        curves.append(tuple((rank_slots[k].start if at_start else rank_slots[k].end, level, a)
                            for k, at_start, a, level in steps))
    return tuple(curves)


def memory_events(actions: Sequence[Action]) -> Iterator[tuple[int, bool, Action]]:
    """Where a rank's activation memory may change as it runs `actions` in order: (index of the action,
    at its start or its end, the pass). Within an action every pass allocates at its start before any
    frees at its end (the passes of an overlapped pair run at once)."""
    for k, action in enumerate(actions):
        passes = action.passes()
        for at_start in (True, False):
            for a in passes:
                yield k, at_start, a


def memory_steps(costs: PassCosts, actions: Sequence[Action]) -> Iterator[tuple[int, bool, Action, float]]:
    """A rank's activation memory as it runs `actions` in order: (index of the action, whether at its start
    or its end, the pass, the level after) for every pass that allocates (at its start) or frees (at its
    end). The levels depend on the order alone, not on the times."""
    level = 0.0
    for k, at_start, a in memory_events(actions):
        alloc, freed = memory_delta(costs.of(a), a.kind)
        change = alloc if at_start else -freed
        if change:
            level += change
            yield k, at_start, a, level
