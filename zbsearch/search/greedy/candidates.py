"""Heuristic schedules: fast list schedulers that give CP-SAT its warm start and that zbsearch never
does worse than.

Two greedy engines, both driven by `GreedyOptions` (greedy/options.py):

- "rounds" (greedy/rounds.py, linear placement only): the Zero Bubble paper's automatic scheduler
  (Qi et al., ICLR 2024, arXiv 2401.10241) with every stage's own costs. Its three switches are the
  paper's: a bubble before the first B or not, prioritising B over F or not, greedy W filling or not.
- "list" (greedy/list_engine.py, any placement: linear, interleaved, V-shape and DualPipe's two routes): an
  event-driven list scheduler that runs the best ready pass whenever a rank is free and admits a new
  microbatch on a rank only while the memory limit leaves room for all of its forward chunks there.
  Where the profile gives an F&B overlap time, its variants also run with `pairs` (a ready F and a
  ready B as one overlapped pair).
- on the chunked placements, "v-rounds" (greedy/vshape.py, V-shape: the Zero Bubble authors' adaptive
  V scheduler with each chunk's own costs) and "chunked" (greedy/chunked.py, interleaved and V-shape:
  1F1B-style alternation that waits for the pass it wants); `chunked.chunked_variants` lists them.

Both time and count memory with zbsearch.sim.rank_state, the simulator's own rule: F allocates mem_B at
its start, B frees mem_B - mem_W and W frees mem_W at their ends; the limit is the `MemoryLimit` per
rank in the profile's memory unit.

`candidates` runs every greedy variant plus every applicable handcrafted schedule, validates each with
zbsearch.sim.validate, and `best` returns the best by the objective.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

from ... import schedules
from ...core.errors import InfeasibleError, PreconditionError, ScheduleError
from ...core.ir import Placement, Schedule, build
from ...core.memory import MemoryLimit
from ...core.objective import Objective, settled
from ...core.profile import Profile, check_microbatches
from ...sim.simulate import PassCosts, Timeline, memory_steps, simulate
from ...sim.validate import over_limit, validate
from ..budget import past
from ..problem import Problem
from .chunked import CHUNKED_ENGINES, chunked_variants, run_chunked
from .list_engine import ListEngine, fused_helps
from .options import CannotFit, EngineResult, GreedyOptions, Step
from .rounds import RoundsEngine

__all__ = ["Candidate", "GreedyOptions", "best", "candidates", "engine_schedule", "greedy", "greedy_variants",
           "run_engine"]


def greedy_variants(placement: Placement | None = None, *, extra: bool = True, pairs: bool = False,
                    m: int | None = None, fused: bool = False) -> list[Any]:
    """The variants `candidates` tries for a placement: the paper's 8 switches of the rounds engine
    (linear placement only), capped warm-ups when `extra`, and the list engine's variants: with `fused`
    (fused_helps) also with every backward fused, on a placement of several routes each also admitting by
    route, and each also with F&B pairs when `pairs` (the profile gives a pair time); on the single-route
    chunked placements, the v-rounds and chunked engines' (`chunked.chunked_variants`, fewer when `m`
    makes the schedule large)."""
    out: list[Any] = []
    if placement is None or _is_linear(placement):
        for bubble, bfirst, fill in itertools.product((False, True), repeat=3):
            out.append(GreedyOptions("rounds", bubble, bfirst, fill))
        if extra:
            for k in (1, 2):
                for bfirst, fill in itertools.product((False, True), repeat=2):
                    out.append(GreedyOptions("rounds", False, bfirst, fill, warmup=k))
    for bfirst, fill in itertools.product((True, False), repeat=2):
        out.append(GreedyOptions("list", False, bfirst, fill))
    if extra:
        # Capping the microbatches in flight (1F1B's p-r, or twice that) often beats admitting as
        # many as memory allows: measured on random heterogeneous profiles, these four win most.
        for bfirst, fill, k in ((True, False, 1), (True, False, 2), (True, True, 1), (False, True, 1)):
            out.append(GreedyOptions("list", False, bfirst, fill, warmup=k))
    if fused:
        # A warm-up of 1F1B's depth fused is 1F1B itself, which the handcrafted schedules give.
        for warmup, bfirst in itertools.product((None, 2), (True, False)):
            out.append(GreedyOptions("list", False, bfirst, warmup=warmup, fused=True))
    if placement is not None and len(placement.routes) > 1:
        out += [replace(o, by_route=True) for o in out]
    if pairs:
        out += [replace(o, pairs=True) for o in out if o.engine == "list"]
    if placement is not None:
        out += chunked_variants(placement, extra, m)
    return out


def _is_linear(placement: Placement) -> bool:
    p = placement.num_ranks
    return placement.chunk_to_rank == tuple(range(p)) and placement.routes == (tuple(range(p)),)


def run_engine(problem: Problem, options: GreedyOptions) -> EngineResult:
    """One greedy variant's orders on the problem, with the engine's own timing. Raises InfeasibleError
    when the limit cannot hold one microbatch on some rank (naming the minimum) or when this variant
    cannot keep within it; PreconditionError when the engine does not support the placement."""
    placement, m, limit = problem.placement, problem.num_microbatches, problem.limit
    check_microbatches(m)
    problem.check_feasible()
    if options.engine == "rounds" and not _is_linear(placement):
        raise PreconditionError(
            f"the rounds greedy needs a linear placement, not {placement.name!r}: use engine='list'")
    if options.engine not in ("rounds", "list", *CHUNKED_ENGINES):
        raise PreconditionError(f"greedy engine {options.engine!r} does not exist: use 'rounds' or 'list'")
    try:
        if options.engine == "rounds":
            return RoundsEngine(problem, options).run()
        if options.engine in CHUNKED_ENGINES:
            return run_chunked(problem, options)
        return ListEngine(problem, options).run()
    except CannotFit:
        raise InfeasibleError(
            f"greedy({options.label}) could not keep within memory limit {limit.text} for m={m}: "
            "try another variant or a larger limit"
        ) from None


def engine_schedule(result: EngineResult, problem: Problem, options: GreedyOptions) -> Schedule:
    """An engine's orders as a schedule named greedy(<variant>), its meta recording the variant."""
    ranks = [[step.action() for step in rank] for rank in result.order]
    return build(f"greedy({options.label})", problem.placement, problem.num_microbatches, ranks,
                 heuristic="greedy", variant=asdict(options), mem_limit=problem.limit.text)


def greedy(problem: Problem, options: GreedyOptions = GreedyOptions()) -> Schedule:
    """One greedy schedule for the problem (see run_engine for what it raises)."""
    return engine_schedule(run_engine(problem, options), problem, options)


def _costs_apply(profile: Profile, placement: Placement) -> bool:
    """A chunked placement is costed from the profile only when the profile gives no per-chunk costs
    (each stage split evenly) or gives them for exactly this many chunks; otherwise its numbers would
    be made up."""
    if placement.num_ranks != profile.num_stages:
        return False
    return (placement.num_chunks == placement.num_ranks or profile.chunks is None
            or len(profile.chunks) == placement.num_chunks)


def handcrafted(p: int, m: int, placement_names: set[str] | None = None) -> Iterator[tuple[str, Schedule]]:
    """Every registered generator that is defined for (p, m) (any other error is a bug and surfaces); chunked
    ones with their default chunk count and a few others. `placement_names`: only generators whose
    schedules use one of these placements (generating a V-shape schedule for p=32, m=256 takes
    seconds, wasted when the search is on another placement)."""
    for name, gen in schedules.REGISTRY.items():
        if placement_names is not None and gen.placement not in placement_names:
            continue
        chunk_options: Sequence[int | None] = [None]
        if gen.takes_chunks:
            chunk_options = sorted({c for c in (gen.default_chunks, 2, 3, 4) if c})
        for v in chunk_options:
            try:
                sched = schedules.generate(name, p, m, v)
            except PreconditionError:
                continue
            yield (name if v is None else f"{name}(v={v})"), sched


class QuickCost(NamedTuple):
    """A schedule's makespan and span by the simulator, and its peak in stage-M_B units."""

    makespan: float
    span: float
    peak: float


def quick_cost(schedule: Schedule, profile: Profile, limit: MemoryLimit) -> QuickCost | None:
    """The makespan, span and peak of a schedule by the simulator, or None when it
    deadlocks, does not fit this profile, or exceeds the limit by the validator's own tolerance. Only
    ranks candidates: whatever `candidates` and `best` return has been through zbsearch.sim.validate,
    which also checks completeness (skipped here because it costs as much as the timing)."""
    if schedule.placement.num_ranks != profile.num_stages:
        return None
    try:
        tl = simulate(schedule, profile)
    except ScheduleError:
        return None  # deadlocks: the validator would reject it (any other error is a bug and surfaces)
    peaks = [tl.peak_memory(r) for r in range(tl.num_ranks)]
    if any(over_limit(peak, cap) for peak, cap in zip(peaks, limit.per_rank)):
        return None
    return QuickCost(tl.makespan, tl.span, _peak_units(profile, peaks))


class Candidate(NamedTuple):
    """A validated candidate: its name, the schedule and its timeline."""

    name: str
    schedule: Schedule
    timeline: Timeline


@dataclass
class _Pending:
    """A candidate before validation, with its cheap (cost, peak) key for ordering."""

    name: str
    key: tuple[float, float]
    make: Callable[[], Schedule]
    aliases: list[str] = field(default_factory=list)

    def schedule(self) -> Schedule:
        s = self.make()
        if self.aliases:
            s.meta["same_as"] = list(self.aliases)
        return s


def _peak_units(profile: Profile, peaks: Iterable[float]) -> float:
    return max(x / profile.stage_mem_B(r) for r, x in enumerate(peaks))


def _returning(sched: Schedule) -> Callable[[], Schedule]:
    return lambda: sched


def _handcrafted_pending(problem: Problem, same_placement: bool) -> list[_Pending]:
    """The handcrafted schedules that fit, ranked by `quick_cost`; on the problem's placement only when
    `same_placement`."""
    out = []
    p, profile = problem.num_ranks, problem.profile
    wanted = {problem.placement.name} if same_placement else None
    for name, sched in handcrafted(p, problem.num_microbatches, wanted):
        if not _costs_apply(profile, sched.placement):
            continue
        if same_placement and sched.placement != problem.placement:
            continue
        quick = quick_cost(sched, profile, problem.limit)
        if quick is None:
            continue       # deadlocks or over the limit: validation would reject it
        out.append(_Pending(name, (settled(problem.objective.of(quick)), quick.peak), _returning(sched)))
    return out


def _greedy_pending(problem: Problem, extra: bool, deadline: float | None = None) -> list[_Pending]:
    """Every distinct greedy variant's schedule on the problem's placement, ranked by its engine's own
    timing. A schedule that several variants produce is kept once (first name), the other names in its
    meta['same_as']. Past `deadline` (time.monotonic()) no further variant runs once one has fitted: at
    p=8, m=128 on the V-shape a variant takes 0.2 s, and a split's dozen of them 2.5 s."""
    placement, profile = problem.placement, problem.profile
    if not _costs_apply(profile, placement):
        return []
    out: list[_Pending] = []
    seen: dict[tuple[tuple[Step, ...], ...], _Pending] = {}
    # Where some list variant with B and W apart fits, the fused ones are not run: each is one more engine run
    # on every split and recompute choice scored, and they are for the limits where none fits.
    apart_fits = False
    for opt in greedy_variants(placement, extra=extra, pairs=profile.gives_overlap, m=problem.num_microbatches,
                               fused=fused_helps(problem)):
        if out and past(deadline):
            break
        fused = isinstance(opt, GreedyOptions) and opt.fused
        if fused and apart_fits:
            continue
        try:
            res = run_engine(problem, opt)
        except (InfeasibleError, PreconditionError):
            continue
        if not fits_as_run(problem, res):
            continue
        apart_fits = apart_fits or (opt.engine == "list" and not fused)
        name = f"greedy({opt.label})" + ("" if _is_linear(placement) else f"@{placement.name}")
        ident = tuple(tuple(r) for r in res.order)
        if ident in seen:
            seen[ident].aliases.append(name)
            continue
        key = (settled(res.cost(problem.objective)), _peak_units(profile, res.peak))
        seen[ident] = c = _Pending(name, key, functools.partial(engine_schedule, res, problem, opt))
        out.append(c)
    return out


def fits_as_run(problem: Problem, res: EngineResult) -> bool:
    """Whether an engine's orders keep every rank within its limit by the simulator's memory rule
    (sim.simulate.memory_steps: levels depend on the order alone). The engines check a level only when
    they admit a forward, and under torch's runtime a B leaves more held than F took (mem_W > mem_B), so a
    B can pass the limit at its end: such a schedule fails validation, which costs a simulation and a
    dependency graph (0.2-0.4 s at p=8, m=128, where nine of a split's twelve greedy schedules failed so).
    One pass over the orders drops it first."""
    costs = PassCosts(problem.chunk_costs, problem.recompute_microbatches)
    for r, steps in enumerate(res.order):
        cap = problem.limit.per_rank[r]
        if math.isinf(cap):
            continue
        if any(over_limit(level, cap) for _, _, _, level in memory_steps(costs, [st.action() for st in steps])):
            return False
    return True


def rank_key(tl: Timeline, objective: Objective) -> tuple[float, float]:
    """How candidates are ordered: the objective, then the peak in stage-M_B units."""
    return settled(objective.of(tl)), _peak_units(tl.profile, (tl.peak_memory(r) for r in range(tl.num_ranks)))


def candidates(problem: Problem, *, handcrafted: bool = True, extra: bool = True, top: int | None = None,
               same_placement: bool = False, deadline: float | None = None) -> list[Candidate]:
    """Every applicable handcrafted schedule and every greedy variant on the problem's placement that
    passes zbsearch.sim.validate.validate under its limit, each with its validated timeline, best first
    by its objective (ties: lower peak memory in stage-M_B units). A schedule that several variants
    produce appears once (the others are named in its meta['same_as']).

    `handcrafted`: also the handcrafted schedules (on their own placements, unless `same_placement`:
    a solver start must be on the problem's); `extra`: also the variants beyond the paper's eight;
    `top`: validate (and return) only the `top` best by the cheap ranking, since validating a large
    schedule takes seconds; `deadline`: past it, no more greedy variants than one that fits. Raises
    InfeasibleError when the limit cannot hold one microbatch (the message names the minimum).
    """
    problem.check_feasible()
    pending = (_handcrafted_pending(problem, same_placement) if handcrafted else []) + \
        _greedy_pending(problem, extra, deadline)
    pending.sort(key=lambda c: c.key)
    found: list[Candidate] = []
    for c in pending:
        if top is not None and len(found) >= top:
            break
        sched = c.schedule()
        try:
            tl = validate(sched, problem.profile, problem.limit)
        except ScheduleError:
            continue
        assert tl is not None
        found.append(Candidate(c.name, sched, tl))
    found.sort(key=lambda c: rank_key(c.timeline, problem.objective))
    return found


def best(problem: Problem, *, handcrafted: bool = True, extra: bool = True) -> Candidate:
    """The best of `candidates`, ties broken by lower peak memory: the same answer as
    candidates(...)[0] (the cheap ranking times passes exactly as the simulator does), but only the
    winner is validated unless it fails. Raises InfeasibleError when nothing fits."""
    found = candidates(problem, handcrafted=handcrafted, extra=extra, top=1)
    if not found:
        raise InfeasibleError(
            f"no heuristic schedule fits memory limit {problem.limit.text} for p={problem.num_ranks}, "
            f"m={problem.num_microbatches}: raise the limit"
        )
    return found[0]
