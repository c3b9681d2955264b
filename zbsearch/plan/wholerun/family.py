"""A shape planned as Mist- and Megatron-style planners plan it: only 1F1B-family schedules (`PlanChoices(schedules=
"1f1b-family")`, `zbsearch configure --schedules 1f1b-family`), the baseline the study compares with.

The space of one shape (p ranks, m microbatches) is finite and enumerated whole:

- schedules: the handcrafted 1F1B (linear placement) and Megatron's interleaved 1F1B (looped placement, v in
  FAMILY_CHUNKS chunks per rank, where its rules hold: m a multiple of p, v p chunks filled), fused backward,
  as schedules/ generates them (no search of the order);
- splits: `even` (Megatron's: blocks spread evenly, the embedding with the first chunk and the head with the
  last) and `balanced` (the time-balanced DP Mist-like planners use);
- recompute: none or full on every block (Megatron's `--recompute-granularity full`, torchtitan's full AC).

Each candidate is simulated on the shape's profile and kept where it fits the limit; the shape's plan is the
candidate of least step (its data-parallel terms from its own timeline), validated again as the joint search's
are. Its bound is its own step: no plan of the shape in this space is faster, so a search across shapes in
this mode certifies against the best 1F1B-family plan (cheap bounds of unsolved shapes, over every plan, are
below it and stay valid). Without pipelining (p = 1) the plan is single.py's with recompute none, or full where
none does not fit. `--placement` (linear, interleaved:V) and `--recompute` (none, full) narrow the space.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

from ...core.errors import InfeasibleError, PlanError, PreconditionError, ScheduleError
from ...core.ir import Placement, Schedule
from ...core.memory import MemoryLimit, parse_mem_limit
from ...core.partition import partition_profile, plan_of, route_length
from ...core.placement import parse_placement
from ...core.profile import Profile
from ...schedules import generate
from ...search.entry.request import planned_profile
from ...search.partition.candidates import balanced_counts, even_counts
from ...sim.simulate import simulate
from ...sim.validate import memory_problems
from .cost import ShapeCosts
from .step import StepTime, timeline_step

SCHEDULE_SETS = ("all", "1f1b-family")
FAMILY = ("1f1b", "interleaved-1f1b")
FAMILY_CHUNKS = (2, 3, 4)  # interleaved 1F1B's chunks per rank tried (Megatron's virtual pipeline stages)
SPLITS = ("even", "balanced")
GIB = 2**30


def check_schedules(schedules: str, placement: str, recompute: str) -> None:
    """The schedule set is known, and the placement and recompute asked can be planned within it.

    Raises
    ------
    PlanError
        Another set, or a placement or recompute outside the 1F1B family, naming the field and the fix.
    """
    if schedules not in SCHEDULE_SETS:
        raise PlanError(f"schedules {schedules!r} is not known: use all (every schedule the joint search finds) or "
                        "1f1b-family (the handcrafted 1F1B and interleaved 1F1B only)", subject="schedules")
    if schedules == "all":
        return
    where = placement.strip().lower()
    if where not in ("auto", "linear") and not where.startswith("interleaved"):
        raise PlanError(f"placement {placement!r} has no 1F1B-family schedule: use auto, linear or interleaved:V "
                        "(or every schedule, not the 1F1B family alone)", subject="placement")
    if recompute.strip() not in ("auto", "auto-layers", "none", "full"):
        raise PlanError(f"recompute {recompute!r} is not one a 1F1B-family planner chooses: use auto-layers (none or "
                        "full, whichever is faster and fits), none or full (or every schedule, not the 1F1B family "
                        "alone)", subject="recompute")


def levels_tried(recompute: str | None) -> tuple[str, ...]:
    """The recompute levels the family tries: none and full, or the one asked."""
    text = (recompute or "auto-layers").strip()
    return (text,) if text in ("none", "full") else ("none", "full")


def placements_tried(given: str, p: int) -> Iterator[tuple[str, Placement, int | None]]:
    """(schedule, placement, chunks per rank) of the family on p ranks, as `given` narrows them."""
    where = given.strip().lower()
    if where in ("auto", "linear"):
        yield "1f1b", parse_placement("linear", p), None
    if where == "auto":
        for v in FAMILY_CHUNKS:
            yield "interleaved-1f1b", parse_placement(f"interleaved:{v}", p), v
    elif where.startswith("interleaved"):
        placement = parse_placement(where, p)
        yield "interleaved-1f1b", placement, placement.num_chunks // p


@dataclass(frozen=True)
class Candidate:
    """One family plan that fits: its schedule (with its plan record), limit, timeline's step."""

    schedule: Schedule
    limit: MemoryLimit
    step: StepTime


def _candidates(costs: ShapeCosts, least: list[float]) -> Iterator[Candidate]:
    """Every family plan of the shape that fits its limit; `least` gets the least peak of those that do not."""
    p, m = costs.shape.p, costs.shape.m
    layers_at = {level: planned_profile(costs.profile, replace(costs.request, recompute=level))
                 for level in levels_tried(costs.request.recompute)}
    for name, placement, v in placements_tried(costs.request.placement or "auto", p):
        try:
            schedule = generate(name, p, m, v)
        except PreconditionError:
            continue  # m not a multiple of p for interleaved 1F1B
        for planned in layers_at.values():
            layers = planned.layers or ()
            if len(layers) < route_length(placement):
                continue
            for counts in {rule: _counts(rule, planned, placement) for rule in SPLITS}.values():
                found = _fitting(costs, planned, placement, counts, schedule, least)
                if found is not None:
                    yield found


def _counts(rule: str, planned: Profile, placement: Placement) -> tuple[int, ...]:
    layers, k = planned.layers or (), route_length(placement)
    return even_counts(layers, k) if rule == "even" else balanced_counts(layers, k)


def _fitting(costs: ShapeCosts, planned: Profile, placement: Placement, counts: tuple[int, ...],
             schedule: Schedule, least: list[float]) -> Candidate | None:
    """The schedule on this split, simulated: a candidate where it fits the limit, else its peak noted."""
    profile = partition_profile(planned, placement, counts)
    limit = parse_mem_limit(costs.request.mem_limit, profile, placement, headroom=costs.request.headroom)
    scheduled = replace(schedule, plan=plan_of(profile, limit.text))
    try:
        timeline = simulate(scheduled, profile)
    except ScheduleError:
        return None
    if memory_problems(timeline, limit):
        ranks = range(placement.num_ranks)
        static = profile.static_bytes_per_rank(placement) or tuple(0.0 for _ in ranks)
        least.append(max(static[r] + timeline.peak_memory(r) for r in ranks))
        return None
    return Candidate(scheduled, limit, timeline_step(costs, scheduled, timeline))


def best_family_plan(costs: ShapeCosts) -> Candidate:
    """The family plan of least step (ties: the first tried: 1F1B before interleaved, none before full, even
    before balanced).

    Raises
    ------
    InfeasibleError
        No family plan fits; the message gives the least peak memory among them.
    """
    least: list[float] = []
    best: Candidate | None = None
    for found in _candidates(costs, least):
        if best is None or found.step.step_us < best.step.step_us * (1 - 1e-12):
            best = found
    if best is not None:
        return best
    need = f"the least peak memory among them is {min(least) / GIB:.3g} GiB per GPU" if least else \
        "none applies to this p and m"
    raise InfeasibleError(
        f"shape {costs.shape.label()}: no 1F1B-family plan (1F1B, interleaved 1F1B with v in "
        f"{', '.join(map(str, FAMILY_CHUNKS))}; even or balanced split; recompute none or full) fits "
        f"{costs.usable_bytes / GIB:.3g} GiB usable: {need}", subject="shape")


def single_levels(costs: ShapeCosts) -> Iterator[ShapeCosts]:
    """A shape without pipelining in the family: its costs with recompute none, then full (single.py plans a
    level it is given as it is), the faster first."""
    for level in levels_tried(costs.request.recompute):
        yield replace(costs, request=replace(costs.request, recompute=level))


__all__ = ["FAMILY", "FAMILY_CHUNKS", "SCHEDULE_SETS", "SPLITS", "Candidate", "best_family_plan", "check_schedules",
           "levels_tried", "placements_tried", "single_levels"]
