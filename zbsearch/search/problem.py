"""A search problem: what the solver and the heuristics both read.

It fixes the placement, the microbatch count, the memory limit and the objective, and lists every
pass (chunk, kind, microbatch) with its rank, duration, data inputs and memory effect. The solver always
splits the backward into B and W: a fused backward is B immediately followed by W on the same rank,
so splitting never loses a schedule (it can only find more), except where B raises memory (mem_W >
mem_B): there the CP-SAT model may mark a B and its W fused (exact/cpsat.fusable_chunks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable, Sequence

from ..core.errors import PreconditionError, ProfileError
from ..core.ir import Action, Kind, Placement, Schedule, build
from ..core.memory import (DEFAULT_HEADROOM, MemoryLimit, activation_need, check_feasible, parse_mem_limit,
                           short_of)
from ..core.objective import Objective
from ..core.partition import plan_of
from ..core.plan_record import Choice, PlanRecord, choice_recomputes
from ..core.placement import AUTO_PLACEMENTS, parse_placement
from ..core.profile import Profile
from ..core.stage_cost import StageCost
from ..schedules.dualpipe import DUALPIPE
from ..sim.simulate import memory_delta, route_inputs


@dataclass(frozen=True)
class Pass:
    """One pass of the problem, with everything a model needs about it."""

    action: Action
    rank: int
    duration: float
    inputs: tuple[tuple[Action, float], ...]  # producing pass and hop time
    alloc: float  # memory allocated at start
    free: float  # memory freed at end


def placement_problem(name: str, p: int, m: int | None) -> str | None:
    """What the named placement needs that p ranks and m microbatches (None: not checked) lack, with the
    reason, or None. Only `dualpipe` has needs: DualPipe's own (an even p, so half the ranks lead each
    direction, and its microbatch rule), as its ScheduleSpec states them."""
    if name.strip().lower() != "dualpipe":
        return None
    need = DUALPIPE.ranks_rule(p)
    if need or m is None:
        return need
    rule = DUALPIPE.microbatch_rule(p, 1)
    return None if rule.accepts(m) else f"{rule.need} ({rule.why})"


@dataclass(frozen=True)
class Problem:
    profile: Profile
    placement: Placement
    num_microbatches: int
    limit: MemoryLimit
    objective: Objective = Objective.MAKESPAN  # a word ("span") is taken and read as its member
    # Per chunk, the microbatches that run its recomputed layers with recompute (None: all of them); the
    # others keep their activations (StageCost.without_recompute). None: every microbatch recomputes.
    recompute_microbatches: Choice | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "objective", Objective.parse(self.objective))
        if self.placement.num_ranks != self.profile.num_stages:
            raise ProfileError(
                f"profile {self.profile.label} has {self.profile.num_stages} stages but placement "
                f"{self.placement.name!r} has {self.placement.num_ranks} ranks: use a profile with one stage per rank"
            )

    @property
    def num_ranks(self) -> int:
        return self.placement.num_ranks

    def empty_schedule(self, name: str, ranks: list[list[Action]], **meta) -> Schedule:
        return build(name, self.placement, self.num_microbatches, ranks, **meta)

    @cached_property
    def plan(self) -> PlanRecord:
        """The record a schedule made for this problem carries (core/plan_record.py): the profile's split,
        levels, memory accounting and sharding, the limit as written, and the microbatches that recompute."""
        return plan_of(self.profile, self.limit.text, self.recompute_microbatches)

    def with_choice(self, chosen: Choice | None) -> "Problem":
        """The same problem with another per-microbatch recompute choice."""
        return replace(self, recompute_microbatches=chosen)

    @cached_property
    def chunk_costs(self) -> tuple[StageCost, ...]:
        """Each chunk's per-microbatch cost as it runs (Profile.chunk_cost: the runtime's overhead and the
        profile's memory model applied), read from the profile once: every engine reads these."""
        return tuple(self.profile.chunk_cost(self.placement, c) for c in range(self.placement.num_chunks))

    def recomputes(self, chunk: int, microbatch: int) -> bool:
        """Whether the microbatch runs the chunk's recomputed layers with recompute (recompute_microbatches)."""
        return choice_recomputes(self.recompute_microbatches, chunk, microbatch)

    def choice_where(self, recomputes: Callable[[int, int], bool]) -> Choice:
        """A recompute_microbatches value: per chunk with recomputed layers, the microbatches for which
        `recomputes(chunk, microbatch)` holds; None on the chunks that recompute nothing."""
        m = self.num_microbatches
        return tuple(None if cost.without_recompute is None else frozenset(i for i in range(m) if recomputes(c, i))
                     for c, cost in enumerate(self.chunk_costs))

    def cost_of(self, chunk: int, microbatch: int) -> StageCost:
        """One microbatch's cost on a chunk: the chunk's, or its cost without recompute where the plan keeps
        that microbatch's activations (recompute_microbatches)."""
        return self.chunk_costs[chunk].for_microbatch(self.recomputes(chunk, microbatch))

    @cached_property
    def hops(self) -> dict[tuple[int, int], float]:
        """Time between two chunks adjacent on some route, either way (Profile.hop), for every such pair:
        an activation goes down the route, its gradient back up."""
        pl, out = self.placement, {}
        for route in pl.routes:
            for a, b in zip(route, route[1:]):
                out[(a, b)] = out[(b, a)] = self.profile.hop(pl, a, b)
        return out

    def hop(self, src_chunk: int, dst_chunk: int) -> float:
        """An activation's (or its gradient's) time between two chunks adjacent on a route."""
        return self.hops[(src_chunk, dst_chunk)]

    @cached_property
    def passes(self) -> tuple[Pass, ...]:
        """Every F, B and W of every microbatch on every chunk of its route, each microbatch's passes
        in dependency order."""
        out = []
        m, pl, hops = self.num_microbatches, self.placement, self.hops
        for i in range(m):
            route = pl.route(i, m)
            # Producers before consumers: forwards down the route, backwards up it, then the Ws.
            order = [(c, Kind.F) for c in route] + [(c, Kind.B) for c in reversed(route)] + [(c, Kind.W) for c in route]
            for c, kind in order:
                cost = self.cost_of(c, i)
                a = Action(c, kind, i)
                ins = tuple((_producer(key), hop) for key, hop in route_inputs(route, a, lambda x, y: hops[(x, y)]))
                alloc, free = memory_delta(cost, kind)
                out.append(Pass(a, pl.chunk_to_rank[c], {Kind.F: cost.F, Kind.B: cost.B, Kind.W: cost.W}[kind],
                                ins, alloc, free))
        return tuple(out)

    def check_feasible(self) -> None:
        """Raise InfeasibleError stating the smallest feasible limit when this one is below it (read off
        the chunk costs held here; the profile is read again only to word the error)."""
        if any(short_of(activation_need(self.chunk_costs, self.placement), self.limit)):
            check_feasible(self.profile, self.placement, self.limit)


def make_problem(profile: Profile, mem_limit: str | None, objective: Objective | str = Objective.MAKESPAN,
                 placement: str = "linear", headroom: float | None = None) -> Problem:
    """A problem from the strings users type (see parse_mem_limit and parse_placement)."""
    p, m = profile.num_stages, profile.microbatches
    chosen = parse_placement(placement, p)
    need = placement_problem(placement, p, m)
    if need:
        raise PreconditionError(f"placement {placement.strip()!r} needs {need}; got p={p}, m={m}", subject="placement")
    limit = parse_mem_limit(mem_limit, profile, chosen, headroom=DEFAULT_HEADROOM if headroom is None else headroom)
    return Problem(profile, chosen, m, limit, Objective.parse(objective))


def make_problems(profile: Profile, mem_limit: str | None, objective: Objective | str, placement: str,
                  auto: tuple[str, ...] = AUTO_PLACEMENTS, headroom: float | None = None) -> list[Problem]:
    """One problem per placement to try: `auto` tries each of `auto` that applies to the profile's p and
    m (see placement_problem), anything else just itself."""
    names: Sequence[str] = auto if placement.strip().lower() == "auto" else (placement,)
    if names is auto:  # none applying: keep them all, so that the first says what it needs
        names = [n for n in auto if placement_problem(n, profile.num_stages, profile.microbatches) is None] or auto
    return [make_problem(profile, mem_limit, objective, name, headroom) for name in names]


def _producer(key: tuple[int, str, int]) -> Action:
    chunk, group, mb = key
    # The solver always splits the backward, so a 'BWD' input is the chunk's B (input gradient).
    return Action(chunk, {"F": Kind.F, "BWD": Kind.B, "W": Kind.W}[group], mb)


def on_grid(problem: Problem, step: float) -> Problem:
    """The same problem with every chunk's pass times and every hop divided by `step` and rounded
    down to integers: a relaxation of the real problem (see exact/cpsat.py for why)."""

    def down(x: float) -> float:
        return float(math.floor(x / step + 1e-9))

    prof = problem.profile
    def grid_cost(cost: StageCost) -> StageCost:
        kept = cost.without_recompute
        return StageCost(down(cost.F), down(cost.B), down(cost.W), cost.mem_B, cost.mem_W,
                         without_recompute=None if kept is None else grid_cost(kept))

    chunks = [grid_cost(cost) for cost in problem.chunk_costs]
    # The chunks already carry the overhead and the memory model: the grid profile must not add them again.
    grid_profile = replace(prof, chunks=tuple(chunks), comm=tuple(down(c) for c in prof.comm),
                           time_unit=f"{step:g} {prof.time_unit}", action_overhead=0.0, memory_model="paper")
    return replace(problem, profile=grid_profile)


def longest_from(mb_passes: Sequence[Pass], origin: Action) -> dict[Action, float]:
    """Longest path from the start of `origin` to the end of each pass that depends on it (passes
    in dependency order)."""
    reach: dict[Action, float] = {}
    for ps in mb_passes:
        if ps.action == origin:
            reach[origin] = ps.duration
            continue
        ready = [reach[a] + hop for a, hop in ps.inputs if a in reach]
        if ready:
            reach[ps.action] = max(ready) + ps.duration
    return reach
